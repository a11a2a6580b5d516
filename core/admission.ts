// Prefill admission and flow control: at most `slots` cold prefills in flight
// per worker; the rest wait at the router, bound to the worker they were
// picked for, and go as soon as one there reaches its first token.
//
// Why: a prefill is compute-bound and an engine step's time grows with the
// tokens in it (vLLM batches every waiting prompt into one step up to
// max_num_batched_tokens). Four 2k-token prompts sent together finish
// together, after one ~8k-token step; sent one after the other, the first is
// done after a quarter of that, the second after half, and the mean first
// token comes ~35% sooner for the same work. The same holds for a short turn
// that lands beside a long cold prompt. The engine cannot do it itself: it
// schedules what has arrived, first come first served.
//
// Warm requests (uncached prefill up to warmTokens) never wait and take no
// slot: their step is short, and holding them would only add a round trip.
// A waiting request keeps its pick's load reservation, so later picks see
// its queued prefill on that worker exactly as if the engine held it.
//
// Who goes first when several wait for a worker (core/objectives.ts): the
// highest priority band (strict: a lower band goes only when no higher one
// waits); within the band, the flow (tenant) with the least attained
// service; within a flow, arrival order. A waiting request never overtakes
// one already holding a slot: slots are not preempted.
//
// Fairness within a band is least attained service in uncached prefill
// tokens, the work the engine pays for (Dynamo's deficit round robin counts
// the same unit), not in turns: a tenant sending few long prompts would take
// most of the engine's time under turn-taking. Service counts only while a
// flow is backlogged, as in start-time fair queueing: a flow that starts
// waiting is lifted to the band's virtual time (the attained service of the
// flow served last), so an idle tenant cannot bank credit and a noisy one's
// past excess is forgotten once it stops. A flow ten times as busy as the
// others therefore gets the same share of a busy worker as each of them, and
// the quiet ones go first whenever they have waited less.
//
// Bounds (flow control): queued requests and queued request bytes, over all
// bands (maxQueued, maxQueuedBytes) and per band (bandLimits). A request that
// would pass its band's bound is refused ("queue_full"). One that would pass
// the overall bound takes the place of the newest request of the lowest band
// below its own ("evicted", told through its evicted callback), so a higher
// band is never refused while a lower one holds a queue place; when no lower
// band has enough to give up, the newcomer is refused, unless its band is
// protected (protectedBand: priority above 0), which is never evicted and
// queues past the overall bounds rather than be refused. expire() takes a
// waiting request out (its TTL or SLO deadline passed; the adapter owns the
// clock).
//
// Late binding (optional): a waiter whose enter() gave a move callback (the
// adapter's judgement that no worker holds any of its prompt, so it costs the
// same anywhere) is not tied to the worker it was picked for: when a slot
// frees on any worker, the best waiter for it is chosen among that worker's
// queue and every movable waiter elsewhere, by the same order (band, attained
// service, arrival), and move(key) re-targets it. Without it a request waits
// for the prefill in flight on its own worker even when another frees first.
//
// Headroom: a worker is ready for another cold prefill when it has a free
// slot and no external signal marks it saturated. setSaturated(key, true)
// is that signal's input (engine queue depth or KV usage from a scrape, kept
// out of here so any source can feed it); setting it false lets the
// worker's queue drain.
//
// Flow cap (optional, flowMaxSlots): a flow (tenant) holds at most that many
// cold-prefill slots over the whole fleet; past it its requests wait even on
// a free slot, which stays free for another flow. The queue order already
// puts a quiet tenant's waiting request first, but under overload a quiet
// request arriving finds every slot taken by the busy tenant's prefills and
// waits for one to finish; the cap keeps slots the busy tenant cannot fill.
// It is not work-conserving (a capped flow waits beside a free slot), so it
// is off by default and applies to named flows only: requests without a
// fairness id (flow "" or the default flow) are never capped.
//
// Flow reserve (flowReserve, on by default: 1): the same idea, only while it
// is needed and only as far as needed. While another named flow has entered
// recently (within the last max(64, 8 x fleet slots) cold requests: a clock
// that needs no clock), a named flow's requests of an unprotected band
// (priority 0 and below) hold at most the fleet's slots less flowReserve;
// the rest stays free for the other flows and for protected bands. Why: under
// overload every slot is taken the moment it frees, so a quiet tenant's
// request, first in the queue order, still waits for one of the busy
// tenant's prefills to finish (on four workers, about a fifth of a prefill);
// with a slot held back it usually goes at once. Alone (no other named flow
// lately) a flow uses every slot, so a single tenant loses nothing; a
// protected band's requests neither count nor are held back. Needs the fleet
// (workers); without it the reserve is off.
//
// Pure and clock-free (core/): the adapter bounds the wait with its own timer
// (force, expire) and frees the slot at first token or at the end of the
// request (leave), whichever comes first.
import { DEFAULT_FLOW } from "./objectives";

/**
 * Protected bands (priority above 0, "critical"): never expired by the queue
 * TTL (the adapter's rule), never evicted for another request, and never
 * refused by the overall bounds (past them they queue anyway, bounded in time
 * by the wait bound); only a bound an operator sets on their own band refuses
 * them. So flow control can be on by default without ever dropping critical
 * traffic: what it sheds and expires is priority 0 and below.
 */
export function protectedBand(priority: number): boolean {
  return priority > 0;
}

/**
 * Whether a request with this much uncached prefill goes at once holding
 * nothing: admission is off, or the request is warm. enter() admits such a
 * request before returning, without a slot, a queue place or a fairness
 * charge, so an adapter may skip entering it at all.
 */
export function admitsAtOnce(config: AdmissionConfig, uncachedTokens: number): boolean {
  return config.slots <= 0 || uncachedTokens <= config.warmTokens;
}

/** Flows the flow cap applies to: named ones (a fairness id), not the unnamed or default flow. */
function capped(flow: string): boolean {
  return flow !== "" && flow !== DEFAULT_FLOW;
}

export interface AdmissionConfig {
  /** Cold prefills in flight per worker; 0 turns admission off. */
  slots: number;
  /** Uncached prefill tokens up to which a request is warm. */
  warmTokens: number;
  /** Requests waiting over every band and worker; 0 or absent = unbounded. */
  maxQueued?: number;
  /** Request bytes waiting over every band and worker; 0 or absent = unbounded. */
  maxQueuedBytes?: number;
  /** Per band (priority as a string): its own bounds, 0 = unbounded. */
  bandLimits?: { [priority: string]: BandLimit };
  /** Cold-prefill slots one named flow may hold over every worker; 0 or absent = no cap. */
  flowMaxSlots?: number;
  /** Fleet slots a named flow of an unprotected band leaves to other flows while another is active; 0 or absent = off. */
  flowReserve?: number;
  /** The fleet's worker keys (the reserve's fleet slots = slots x their number); absent = reserve off. */
  workers?: () => string[];
}

export interface BandLimit {
  requests: number;
  bytes: number;
}

/** Why a request did not go: refused on arrival, replaced by a higher band, or out of time. */
export type Refusal = "" | "queue_full" | "evicted" | "expired";

export interface Ticket {
  /** True once the request may go (at once, by a freed slot, or forced). */
  readonly admitted: boolean;
  /** True while it holds one of the worker's slots. */
  readonly slot: boolean;
  /** Set when the request will not go: queue_full at enter(), evicted or expired later. */
  readonly refused: Refusal;
  /** Gives the slot back, or leaves the queue; idempotent. */
  leave(): void;
  /** Admits now, past the limit (the wait bound ran out); it still takes a slot. */
  force(): void;
  /** Leaves the queue as expired, if still waiting; returns whether it was. */
  expire(): boolean;
}

/** Where a request stands among others waiting: its band, its flow and its size. */
export interface QueueClass {
  priority: number;
  flow: string;
  /** Request body bytes, for the byte bounds. */
  bytes?: number;
}

interface Waiter {
  t: TicketState;
  key: string;
  go: () => void;
  evicted: (() => void) | null;
  /** Late binding: re-targets the request to another worker; false = it cannot go there. */
  move: ((key: string) => boolean) | null;
  priority: number;
  flow: string;
  bytes: number;
  tokens: number;
  /** Arrival order. */
  n: number;
}

interface TicketState extends Ticket {
  admitted: boolean;
  slot: boolean;
  refused: Refusal;
  gone: boolean;
  /** The worker it waits for or holds a slot on (changes when it moves). */
  key: string;
  /** Its flow, for the flow cap. */
  flow: string;
  /** Its band, for the flow reserve. */
  priority: number;
}

export interface PrefillAdmission {
  readonly config: AdmissionConfig;
  /**
   * Asks to send a request with `uncachedTokens` of prefill to worker `key`.
   * go() runs once, when the request is admitted: before enter() returns when
   * it can go at once. evicted() runs if a higher band takes its queue place.
   * A ticket refused at once has `refused` set and neither runs.
   */
  enter(
    key: string,
    uncachedTokens: number,
    go: () => void,
    cls?: QueueClass,
    evicted?: () => void,
    move?: (key: string) => boolean,
  ): Ticket;
  /** Whether a request with this much uncached prefill (of this flow and band, for the flow cap and reserve; band 0 if absent) would wait for worker key now. */
  wouldWait(key: string, uncachedTokens: number, flow?: string, priority?: number): boolean;
  /** Marks a worker saturated by an outside signal (no cold prefill goes there), or clears it. */
  setSaturated(key: string, saturated: boolean): void;
  /** Requests waiting, for one worker or all. */
  waiting(key?: string): number;
  /** Requests waiting per priority band, over every worker. */
  waitingByPriority(): { [priority: string]: number };
  /** Request bytes waiting, over every worker. */
  waitingBytes(): number;
  /** Slots taken on a worker. */
  busy(key: string): number;
}

export function prefillAdmission(config: AdmissionConfig): PrefillAdmission {
  const busy: { [key: string]: number } = {};
  const queues: { [key: string]: Waiter[] } = {};
  const saturated: { [key: string]: boolean } = {};
  // Fairness within a band: attained service in tokens per band|flow, while backlogged.
  const attained: { [bandFlow: string]: number } = {};
  const backlog: { [bandFlow: string]: number } = {};
  const vtime: { [band: string]: number } = {};
  // Queue occupancy per band and overall, for the bounds.
  const bandCount: { [band: string]: number } = {};
  const bandBytes: { [band: string]: number } = {};
  let total = 0;
  let totalBytes = 0;
  let arrivals = 0;
  let charges = 0;
  // Slots held per named flow, over every worker (the flow cap).
  const held: { [flow: string]: number } = {};
  const flowCap = config.flowMaxSlots || 0;
  // The flow reserve: slots held per named flow by unprotected bands, and the
  // two named flows that entered last (distinct), with their arrival numbers.
  const reserve = config.workers && config.slots > 0 ? config.flowReserve || 0 : 0;
  const heldU: { [flow: string]: number } = {};
  let colds = 0;
  let lastFlow = "";
  let lastAt = -1;
  let otherAt = -1;
  // Whether waiters can be held back beside free slots (then a freed slot or a newcomer looks fleet-wide).
  const holding = flowCap > 0 || reserve > 0;

  // The fleet's slots, read once per call into the gate (every entry point resets it).
  let fleetN = -1;
  function fleetSlots(): number {
    if (fleetN < 0) fleetN = config.slots * (config.workers as () => string[])().length;
    return fleetN;
  }

  /** Notes a named flow's arrival for the reserve's "another flow is active". */
  function seen(flow: string): void {
    colds++;
    if (!reserve || !capped(flow)) return;
    if (flow !== lastFlow) {
      otherAt = lastAt;
      lastFlow = flow;
    }
    lastAt = colds;
  }

  /** Whether flow may take one more slot under the flow cap and, for an unprotected band, the flow reserve. */
  function underCap(flow: string, priority?: number): boolean {
    if (flowCap && capped(flow) && (held[flow] || 0) >= flowCap) return false;
    if (!reserve || !capped(flow) || protectedBand(priority || 0) || !heldU[flow]) return true;
    const fleet = fleetSlots();
    if (fleet <= reserve) return true;
    const window = Math.max(64, 8 * fleet);
    const other = lastFlow !== flow ? lastAt : otherAt;
    if (other < 0 || colds - other > window) return true;
    return heldU[flow] < fleet - reserve;
  }

  function fk(priority: number, flow: string): string {
    return priority + "|" + flow;
  }

  /** A flow about to be charged or queued: an idle one starts at its band's virtual time. */
  function lift(priority: number, flow: string): void {
    const k = fk(priority, flow);
    const v = vtime[priority] || 0;
    if (!backlog[k] && (attained[k] || 0) < v) attained[k] = v;
  }

  /** Books the service a request starts receiving; every so often forgets idle flows at or below their band's clock. */
  function charge(priority: number, flow: string, tokens: number): void {
    const k = fk(priority, flow);
    vtime[priority] = Math.max(vtime[priority] || 0, attained[k] || 0);
    attained[k] = (attained[k] || 0) + Math.max(1, tokens);
    if (++charges % 1024 === 0)
      for (const f in attained) {
        const band = f.substring(0, f.indexOf("|"));
        if (!backlog[f] && attained[f] <= (vtime[band] || 0)) delete attained[f];
      }
  }

  function book(w: Waiter, sign: number): void {
    const p = String(w.priority);
    const k = fk(w.priority, w.flow);
    bandCount[p] = (bandCount[p] || 0) + sign;
    bandBytes[p] = (bandBytes[p] || 0) + sign * w.bytes;
    backlog[k] = (backlog[k] || 0) + sign;
    if (!bandCount[p]) {
      delete bandCount[p];
      delete bandBytes[p];
    }
    if (!backlog[k]) delete backlog[k];
    total += sign;
    totalBytes += sign * w.bytes;
  }

  /** Marks t admitted on a slot of key's worker. */
  function take(key: string, t: TicketState): void {
    t.admitted = true;
    t.slot = true;
    busy[key] = (busy[key] || 0) + 1;
    if (capped(t.flow)) {
      held[t.flow] = (held[t.flow] || 0) + 1;
      if (!protectedBand(t.priority)) heldU[t.flow] = (heldU[t.flow] || 0) + 1;
    }
  }

  /** Takes t out of its queue, if it is there; returns the waiter. */
  function dequeue(key: string, t: TicketState): Waiter | null {
    const q = queues[key];
    for (let i = 0; q && i < q.length; i++)
      if (q[i].t === t) {
        const w = q.splice(i, 1)[0];
        if (!q.length) delete queues[key];
        book(w, -1);
        return w;
      }
    return null;
  }

  /** Whether w goes before c: higher band, then less attained service in the band, then earlier arrival. */
  function before(w: Waiter, c: Waiter): boolean {
    if (w.priority !== c.priority) return w.priority > c.priority;
    const wa = attained[fk(w.priority, w.flow)] || 0;
    const ca = attained[fk(c.priority, c.flow)] || 0;
    return wa !== ca ? wa < ca : w.n < c.n;
  }

  /** The waiter to go next on key's worker: from its own queue, or (late binding) a movable one from any queue. */
  function best(key: string): Waiter | null {
    let b: Waiter | null = null;
    for (const k in queues) {
      const q = queues[k];
      for (let i = 0; i < q.length; i++) {
        const w = q[i];
        if (k !== key && !w.move) continue;
        if (!underCap(w.flow, w.priority)) continue;
        if (!b || before(w, b)) b = w;
      }
    }
    return b;
  }

  function ready(key: string): boolean {
    return (busy[key] || 0) < config.slots && !saturated[key];
  }

  /** Held-back waiters may sit beside a free slot anywhere: every worker with one (but `except`) takes the best it may. */
  function fill(except: string): void {
    const ks: string[] = config.workers && reserve ? config.workers() : [];
    const listed: { [key: string]: boolean } = {};
    for (let i = 0; i < ks.length && total > 0; i++) {
      listed[ks[i]] = true;
      if (ks[i] !== except && ready(ks[i])) next(ks[i]);
    }
    for (const k in queues) if (total > 0 && !listed[k] && k !== except && ready(k)) next(k);
  }

  function next(key: string): void {
    for (let guard = total + 1; guard > 0 && ready(key); guard--) {
      const w = best(key);
      if (!w) break;
      dequeue(w.key, w.t);
      if (w.key !== key) {
        const mv = w.move as (key: string) => boolean;
        if (!mv(key)) {
          // It cannot go there: back in its own queue, no longer movable.
          w.move = null;
          if (!queues[w.key]) queues[w.key] = [];
          queues[w.key].push(w);
          book(w, 1);
          continue;
        }
        w.key = key;
        w.t.key = key;
      }
      charge(w.priority, w.flow, w.tokens);
      take(key, w.t);
      w.go();
    }
  }

  /** Whether key's queue holds a request that could take a slot now (not held back by the flow cap). */
  function queuedUnderCap(key: string): boolean {
    const q = queues[key];
    if (!q) return false;
    if (!holding) return true;
    for (let i = 0; i < q.length; i++) if (underCap(q[i].flow, q[i].priority)) return true;
    return false;
  }

  function waits(key: string, uncachedTokens: number, flow?: string, priority?: number): boolean {
    if (config.slots <= 0 || uncachedTokens <= config.warmTokens) return false;
    return !ready(key) || queuedUnderCap(key) || !underCap(flow || "", priority);
  }

  /** The newest waiter of the lowest band below `priority` that is not protected, or null. */
  function victim(priority: number): Waiter | null {
    let v: Waiter | null = null;
    for (const k in queues) {
      const q = queues[k];
      for (let i = 0; i < q.length; i++) {
        const w = q[i];
        if (w.priority >= priority || protectedBand(w.priority)) continue;
        if (!v || w.priority < v.priority || (w.priority === v.priority && w.n > v.n)) v = w;
      }
    }
    return v;
  }

  /** Whether the overall bounds hold with one more request of `bytes` plus the given freed room. */
  function fits(bytes: number, freedReq: number, freedBytes: number): boolean {
    const mq = config.maxQueued || 0;
    const mb = config.maxQueuedBytes || 0;
    return (!mq || total - freedReq + 1 <= mq) && (!mb || totalBytes - freedBytes + bytes <= mb);
  }

  /**
   * Makes room for a request of band `priority` and `bytes`: its band's own
   * bound first (never relieved by eviction), then the overall bound, by
   * evicting lower bands (not protected ones) newest first, only if that is
   * enough. A protected band that cannot make room queues past the bound.
   */
  function room(priority: number, bytes: number): boolean {
    const lim = config.bandLimits ? config.bandLimits[String(priority)] : undefined;
    if (lim) {
      if (lim.requests > 0 && (bandCount[priority] || 0) + 1 > lim.requests) return false;
      if (lim.bytes > 0 && (bandBytes[priority] || 0) + bytes > lim.bytes) return false;
    }
    if (fits(bytes, 0, 0)) return true;
    // Enough below this band to give up?
    let req = 0;
    let by = 0;
    for (const p in bandCount)
      if (Number(p) < priority && !protectedBand(Number(p))) {
        req += bandCount[p];
        by += bandBytes[p] || 0;
      }
    if (!fits(bytes, req, by)) return protectedBand(priority);
    for (let guard = total; guard > 0 && !fits(bytes, 0, 0); guard--) {
      const v = victim(priority);
      if (!v) return protectedBand(priority);
      dequeue(v.key, v.t);
      v.t.refused = "evicted";
      v.t.gone = true;
      if (v.evicted) v.evicted();
    }
    return fits(bytes, 0, 0) || protectedBand(priority);
  }

  function enter(
    key: string,
    uncachedTokens: number,
    go: () => void,
    cls?: QueueClass,
    evicted?: () => void,
    move?: (key: string) => boolean,
  ): Ticket {
    const priority = cls ? cls.priority : 0;
    const flow = cls ? cls.flow : "";
    fleetN = -1;
    const t: TicketState = {
      admitted: false,
      slot: false,
      refused: "",
      gone: false,
      key: key,
      flow: flow,
      priority: priority,
      leave() {
        if (t.gone) return;
        fleetN = -1;
        t.gone = true;
        if (t.slot) {
          t.slot = false;
          busy[t.key]--;
          if (!busy[t.key]) delete busy[t.key];
          if (capped(t.flow)) {
            held[t.flow]--;
            if (!held[t.flow]) delete held[t.flow];
            if (!protectedBand(t.priority)) {
              heldU[t.flow]--;
              if (!heldU[t.flow]) delete heldU[t.flow];
            }
          }
          next(t.key);
          // Waiters held back by the cap or the reserve may sit beside free slots
          // elsewhere: with a slot back, the first worker that can take one does.
          if (holding && total) fill(t.key);
        } else if (!t.admitted) dequeue(t.key, t);
      },
      force() {
        if (t.admitted || t.gone) return;
        const w = dequeue(t.key, t);
        if (w) charge(w.priority, w.flow, w.tokens);
        take(t.key, t);
        go();
      },
      expire() {
        if (t.admitted || t.gone) return false;
        dequeue(t.key, t);
        t.refused = "expired";
        t.gone = true;
        return true;
      },
    };
    if (admitsAtOnce(config, uncachedTokens)) {
      t.admitted = true;
      go();
      return t;
    }
    lift(priority, flow);
    seen(flow);
    // Behind others already waiting even if a slot is free at this instant.
    if (!waits(key, uncachedTokens, flow, priority)) {
      charge(priority, flow, uncachedTokens);
      take(key, t);
      go();
      return t;
    }
    const bytes = cls && cls.bytes ? cls.bytes : 0;
    if (!room(priority, bytes)) {
      t.refused = "queue_full";
      t.gone = true;
      return t;
    }
    const w: Waiter = {
      t: t,
      key: key,
      go: go,
      evicted: evicted || null,
      move: move || null,
      priority: priority,
      flow: flow,
      bytes: bytes,
      tokens: uncachedTokens,
      n: arrivals++,
    };
    if (!queues[key]) queues[key] = [];
    queues[key].push(w);
    book(w, 1);
    // Under the flow cap or the reserve a worker's slot can be free with a held-back
    // request waiting for it: a movable newcomer takes that slot rather than wait.
    if (holding && w.move) fill(key);
    return t;
  }

  return {
    config: config,
    enter: enter,
    wouldWait(key: string, uncachedTokens: number, flow?: string, priority?: number) {
      fleetN = -1;
      return waits(key, uncachedTokens, flow, priority);
    },
    setSaturated(key: string, on: boolean) {
      if (on) saturated[key] = true;
      else if (saturated[key]) {
        delete saturated[key];
        fleetN = -1;
        next(key);
      }
    },
    waitingByPriority() {
      const out: { [priority: string]: number } = {};
      for (const p in bandCount) out[p] = bandCount[p];
      return out;
    },
    waitingBytes() {
      return totalBytes;
    },
    waiting(key?: string): number {
      if (key !== undefined) return queues[key] ? queues[key].length : 0;
      return total;
    },
    busy(key: string): number {
      return busy[key] || 0;
    },
  };
}

/**
 * --queue-max-requests / --queue-max-bytes: "N" bounds every band together;
 * "N,PRIORITY=M,..." adds a bound of its own to a band (0 = unbounded).
 * Throws naming the bad entry.
 */
export function parseQueueBound(spec: string): { total: number; bands: { [priority: string]: number } } {
  const out = { total: 0, bands: {} as { [priority: string]: number } };
  const parts = (spec || "").split(",");
  for (let i = 0; i < parts.length; i++) {
    const item = parts[i].trim();
    if (!item) continue;
    const eq = item.lastIndexOf("=");
    const key = eq > 0 ? item.substring(0, eq).trim() : "";
    const n = Number(eq >= 0 ? item.substring(eq + 1).trim() : item);
    const p = Number(key);
    if (!(n % 1 === 0) || n < 0 || (eq >= 0 && (!key || !(p % 1 === 0))))
      throw new Error("'" + item + "': expected N (every band) or PRIORITY=N (one band), e.g. 256,-1=32");
    if (eq >= 0) out.bands[String(p)] = n;
    else out.total = n;
  }
  return out;
}

export function queueBoundProblem(spec: string): string | null {
  try {
    parseQueueBound(spec);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/** The admission bounds from the two parsed flags. */
export function queueLimits(
  requests: { total: number; bands: { [priority: string]: number } },
  bytes: { total: number; bands: { [priority: string]: number } },
): { maxQueued: number; maxQueuedBytes: number; bandLimits: { [priority: string]: BandLimit } } {
  const bands: { [priority: string]: BandLimit } = {};
  for (const p in requests.bands) bands[p] = { requests: requests.bands[p], bytes: 0 };
  for (const p in bytes.bands) {
    if (!bands[p]) bands[p] = { requests: 0, bytes: 0 };
    bands[p].bytes = bytes.bands[p];
  }
  return { maxQueued: requests.total, maxQueuedBytes: bytes.total, bandLimits: bands };
}

/**
 * The refusal rule without a queue (njs, which cannot wait in its routing
 * phase): a sheddable request (priority < 0) that is cold is refused when its
 * worker already has `slots` cold prefills before their first token, the
 * moment the Envoy path's admission would make it wait (wouldWait).
 */
export function shedsAtOnce(
  priority: number,
  uncachedTokens: number,
  config: AdmissionConfig,
  coldInFlight: number,
): boolean {
  return priority < 0 && config.slots > 0 && uncachedTokens > config.warmTokens && coldInFlight >= config.slots;
}

/** What an engine's own metrics say about its load (any field may be unknown). */
export interface EngineLoad {
  /** Requests the engine holds waiting (vllm:num_requests_waiting, sglang:num_queue_reqs). */
  waiting?: number;
  /** KV cache usage, 0..1 (vllm:kv_cache_usage_perc, sglang:token_usage). */
  kvUsage?: number;
}

/**
 * Whether an engine's own signals say it has no headroom, for
 * PrefillAdmission.setSaturated: the Inference Extension's utilization
 * detector per endpoint, max(waiting / queueDepth, kvUsage / kvUsageLimit) >= 1
 * (its defaults: queue depth 5, KV 0.8). Unknown signals count as headroom.
 */
export function engineSaturated(load: EngineLoad, queueDepth: number, kvUsageLimit: number): boolean {
  const q = load.waiting !== undefined && queueDepth > 0 ? load.waiting / queueDepth : 0;
  const kv = load.kvUsage !== undefined && kvUsageLimit > 0 ? load.kvUsage / kvUsageLimit : 0;
  return Math.max(q, kv) >= 1;
}
