// A router-side replica of each worker's step scheduler, for predicting a
// request's time to first token. Built only from what the router knows: each
// request it sent to the worker (when, its own uncached prefill tokens, its
// cached prefix), which of them returned a first token and when, which ended,
// and the engine's chunked-prefill token budget.
//
// The engine (vLLM V1's scheduler, as sim/model.ts models it) runs in steps:
// each step first gives every running decode one token, then fills what is
// left of the token budget with prefill chunks in FCFS order. A step's time is
// its linear layers (a fixed cost and the batch's tokens, joined by a knee),
// the prefill's attention over its context, and the decodes' per-sequence and
// KV-read costs. The replica prices a step with that reference step model
// times a per-worker factor learned from first tokens, so a worker three times
// slower learns a factor of about three; the shape is the reference's.
//
// Replaying: a first token marks a step boundary on its worker (the anchor),
// and so does a decode's end while no prefill is left there; a later
// streamed chunk then marks the decode steps' phase for predictions.
// From the anchor the replica runs steps forward with the requests still
// waiting for their first token (FCFS; a request joins the first step that
// starts after it was sent), the decodes running, and the request asked
// about appended at `now`; its predicted first token is the end of the step
// that completes its prefill. The steps before `now` are the queue drained
// since the anchor and the step in flight. A request the replica thinks done
// before `now` but whose first token has not come back is not done: the
// step that completes it ends no earlier than `now`.
//
// Learning: at a first token, the replay from the anchor to that request's
// prefill gives the reference time of the steps in between (the busy
// stretch, from the anchor or from the send that woke an idle worker); the
// observed time over it is one reading of the factor. A worker's factor is
// the weighted geometric mean of its recent readings. First tokens of one
// step come back together (within SAME_STEP_MS): when the replica had put
// the later one in a later step (the wire or the decode phase moved it), it
// gives no reading (its busy stretch would be the gap between them), and the
// reading of the step they shared is taken again with its prefill added.
//
// Work is bounded: a replay runs at most MAX_STEPS steps (null past them) and
// a worker keeps at most MAX_QUEUE requests waiting for a first token.
// ES5-safe: njs bundles this file.
import { EpochKey } from "./types";
import { blockAt } from "./state/marks";
import * as ref from "./step-reference";

/** Steps one replay may run. */
const MAX_STEPS = 4096;
/** Requests waiting for a first token that one worker's replica keeps (the oldest go first). */
const MAX_QUEUE = 256;
/** Readings of the factor: each older one weighs DECAY of the next. */
const DECAY = 0.9;
/** A reading's weight is ref / (ref + SMALL_MS): a few milliseconds of steps say little. */
const SMALL_MS = 5;
/** One reading's log is clamped to [-MAX_LOG, MAX_LOG]. */
const MAX_LOG = Math.log(16);
/**
 * First tokens of one step reach the router together: two on one worker
 * less than this apart (ms; at most half the worker's shortest step) came
 * out of the same step.
 */
const SAME_STEP_MS = 2;

/** The reference time of one step (ms): `prefill` tokens with `attn` token pairs of attention, `decodes` sequences reading `decodeCtx` tokens. */
export function referenceStepMs(prefill: number, attn: number, decodes: number, decodeCtx: number): number {
  const batch = ((prefill + decodes) * ref.PREFILL_US_PER_TOKEN) / 1000;
  return (
    ref.kneeMs(ref.STEP_BASE_MS, batch, ref.STEP_KNEE_EXP) +
    (ref.PREFILL_ATTN_US_PER_KCTX * attn) / 1e6 +
    (decodes * ref.DECODE_US_PER_SEQ) / 1000 +
    (ref.KV_READ_US_PER_KTOKEN * decodeCtx) / 1e6
  );
}

/** A request the router sent to a worker, as the replica tracks it. */
export interface TwinEntry {
  worker: EpochKey;
  own: number;
  cached: number;
  at: number;
  /** Of own, tokens prefilled by the anchor. */
  done: number;
  /** 0: waiting for its first token, 1: decoding, 2: gone. */
  state: number;
  /** Its prompt's block hashes (the router's), when known: sharedPrefix() reads them. */
  blocks: string[] | null;
  /** Diagnostics (the timing dump): when it was sent, the requests the replica had waiting there for a first token, their prefill tokens left, and the decodes. */
  ahead: number;
  pendingAhead: number;
  decoding: number;
  /** What the replica predicted for it when it was sent (null: not learned yet; set by the caller). */
  predicted: number | null;
}

export interface StepTwin {
  /** Predicted time to first token of a request of `own` uncached and `cached` prefix tokens sent now; null until the worker's factor is learned or past the replay bound. */
  predict(ek: EpochKey, own: number, cached: number, now: number): number | null;
  /** The request left for the worker at `now` (`blocks`: its prompt's block hashes, for sharedPrefix()). */
  sent(ek: EpochKey, own: number, cached: number, now: number, blocks?: string[]): TwinEntry;
  /**
   * Leading blocks of `blocks` that a request the replica has on the worker
   * (waiting for its first token, or decoding) shares: a prefix in the
   * engine, computed ahead of a request sent now (FCFS), so cached by the
   * time it is scheduled. A prefix the router counts in flight because its
   * holder waits at the router (prefill admission) is not in it: the engine
   * computes it again. Block hashes are chained, so a match at index i is a
   * match of the whole prefix: a binary search per request.
   */
  sharedPrefix(ek: EpochKey, blocks: string[]): number;
  /** Its first token came back at `now`: a step boundary, and one reading of the worker's factor. */
  first(e: TwinEntry, now: number): void;
  /**
   * A later chunk of a request decoding on the worker came back at `now`:
   * a step ended there. With no prefill left in the replica, predictions
   * start their decode steps from it; readings keep to the anchor.
   */
  tick(ek: EpochKey, now: number): void;
  /**
   * It ended at `now` (after its first token, or before: cancelled, failed).
   * A decode's last token also marks a step boundary: with no prefill
   * waiting there, the replica re-anchors on it.
   */
  ended(e: TwinEntry, now?: number): void;
  /** The worker's learned step-time factor against the reference (null before minSamples readings). */
  factor(ek: EpochKey): number | null;
  samples(ek: EpochKey): number;
  /** What the replica holds for a worker (diagnostics): requests waiting for a first token, their prefill tokens left, decodes, the anchor. */
  view(ek: EpochKey): { waiting: number; pending: number; decodes: number; anchor: number };
  forget(ek: EpochKey): void;
}

export interface TwinOptions {
  /** The engine's chunked-prefill token budget per step (vLLM's max_num_batched_tokens). */
  budget: number;
  /** Readings before a worker's factor is used. */
  minSamples: number;
}

interface WorkerTwin {
  q: TwinEntry[];
  /** Requests decoding there (first token seen, not ended), newest last, at most MAX_QUEUE. */
  dec: TwinEntry[];
  decodes: number;
  decodeCtx: number;
  anchor: number;
  /**
   * A later step end seen on a streamed chunk while no prefill was left
   * (tick()): where predictions start their steps when it is past the
   * anchor. Readings keep to the anchor: a chunk's few milliseconds of steps,
   * read against its own wire, would make each reading mostly noise.
   */
  phase: number;
  sw: number;
  sl: number;
  n: number;
  /** When the last first token came back there. */
  lastFirst: number;
  /** The last reading, while it can still be corrected (a first token of the same step follows): null otherwise. */
  last: Reading | null;
}

/** One reading of the factor: its weight and log, the observed and reference time, and the step that ended it. */
interface Reading {
  wt: number;
  l: number;
  obs: number;
  ref: number;
  prefill: number;
  attn: number;
  decodes: number;
  decodeCtx: number;
}

interface Replay {
  /** Real time the target's prefill completes (NaN: not within MAX_STEPS). */
  end: number;
  /** Real time the busy stretch that completed it started, and its reference time. */
  busyFrom: number;
  ref: number;
  /** Of each queue entry's own tokens, those prefilled when the target completed. */
  done: number[];
  /** The step that completed it: prefill tokens, attention pairs, decodes and their context. */
  prefill: number;
  attn: number;
  decodes: number;
  decodeCtx: number;
}

export function stepTwin(opts: TwinOptions): StepTwin {
  const budget = Math.max(1, opts.budget);
  const workers: { [ek: string]: WorkerTwin } = {};

  function get(ek: EpochKey): WorkerTwin {
    let w = workers[ek];
    if (!w)
      w = workers[ek] = {
        q: [],
        dec: [],
        decodes: 0,
        decodeCtx: 0,
        anchor: -Infinity,
        phase: -Infinity,
        sw: 0,
        sl: 0,
        n: 0,
        lastFirst: -Infinity,
        last: null,
      };
    return w;
  }

  function factorOf(w: WorkerTwin): number {
    return w.sw > 0 ? Math.exp(w.sl / w.sw) : 1;
  }

  /** Takes reading g into worker w's factor (its weight and log from its times), and keeps it as the last. */
  function read(w: WorkerTwin, g: Reading): void {
    let l = Math.log(g.obs / g.ref);
    if (l > MAX_LOG) l = MAX_LOG;
    else if (l < -MAX_LOG) l = -MAX_LOG;
    g.l = l;
    g.wt = g.ref / (g.ref + SMALL_MS);
    w.sw = w.sw * DECAY + g.wt;
    w.sl = w.sl * DECAY + g.wt * g.l;
    w.last = g;
  }

  /**
   * The last reading's step also prefilled `tokens` more over `ctx` cached
   * (a first token of the same step came back): that reading is taken out
   * and read again with its step's reference time grown by theirs.
   */
  function fold(w: WorkerTwin, g: Reading, tokens: number, ctx: number): void {
    const room = Math.max(0, budget - g.decodes - g.prefill);
    const c = Math.min(tokens, room);
    if (c <= 0) return;
    const attn = c * (ctx + c / 2);
    const grown =
      referenceStepMs(g.prefill + c, g.attn + attn, g.decodes, g.decodeCtx) -
      referenceStepMs(g.prefill, g.attn, g.decodes, g.decodeCtx);
    w.sw = (w.sw - g.wt) / DECAY;
    w.sl = (w.sl - g.wt * g.l) / DECAY;
    g.ref += grown;
    g.prefill += c;
    g.attn += attn;
    read(w, g);
  }

  /**
   * Runs worker w's steps from `from` (its anchor, or a later phase) until queue entry `target` (an
   * index into q, or q.length for an extra one sent at extraAt) has its prefill
   * done, at `f` real ms per reference ms. `notBefore`: a queue entry still
   * waiting for its first token at that time is not done before it.
   */
  function replay(
    w: WorkerTwin,
    target: number,
    extraOwn: number,
    extraCached: number,
    extraAt: number,
    f: number,
    notBefore: number,
    from: number,
  ): Replay {
    const q = w.q;
    // Every queue entry: those behind the target share its last step.
    const n = target < q.length ? q.length : q.length + 1;
    const rem: number[] = [];
    const ctx: number[] = [];
    const at: number[] = [];
    const size: number[] = [];
    for (let i = 0; i < n; i++) {
      if (i < q.length) {
        const e = q[i];
        rem.push(e.state === 0 ? Math.max(0, e.own - e.done) : 0);
        ctx.push(e.cached + e.done);
        at.push(e.at);
        size.push(e.cached + e.own);
      } else {
        rem.push(Math.max(1, extraOwn));
        ctx.push(extraCached);
        at.push(extraAt);
        size.push(extraCached + extraOwn);
      }
    }
    let decodes = w.decodes;
    let decodeCtx = w.decodeCtx;
    let t = from;
    let busyFrom = from;
    let ref = 0;
    let head = 0;
    let arrived = 0;
    const out: Replay = {
      end: NaN,
      busyFrom: busyFrom,
      ref: 0,
      done: [],
      prefill: 0,
      attn: 0,
      decodes: 0,
      decodeCtx: 0,
    };
    for (let step = 0; step < MAX_STEPS; step++) {
      while (head < n && rem[head] <= 0) head++;
      if (head >= n) break;
      while (arrived < n && at[arrived] <= t) arrived++;
      if (head >= arrived) {
        // Nothing to prefill until the next send: idle, or decode-only steps.
        const next = at[arrived];
        if (decodes > 0 && t > -Infinity) {
          const r = referenceStepMs(0, 0, decodes, decodeCtx);
          const k = Math.max(1, Math.ceil((next - t) / (r * f)));
          t += k * r * f;
          ref += k * r;
        } else {
          t = next;
          busyFrom = next;
          ref = 0;
        }
        continue;
      }
      let left = Math.max(0, budget - decodes);
      let prefill = 0;
      let attn = 0;
      const completed: number[] = [];
      for (let i = head; i < arrived && left > 0; i++) {
        if (rem[i] <= 0) continue;
        const c = Math.min(rem[i], left);
        attn += c * (ctx[i] + c / 2);
        ctx[i] += c;
        rem[i] -= c;
        left -= c;
        prefill += c;
        if (rem[i] <= 0) completed.push(i);
      }
      const r = referenceStepMs(prefill, attn, decodes, decodeCtx);
      out.prefill = prefill;
      out.attn = attn;
      out.decodes = decodes;
      out.decodeCtx = decodeCtx;
      t += r * f;
      ref += r;
      let hit = false;
      for (let k = 0; k < completed.length; k++) {
        const i = completed[k];
        if (i < q.length && t < notBefore) t = notBefore;
        decodes++;
        decodeCtx += size[i];
        if (i === target) hit = true;
      }
      if (hit) {
        out.end = t;
        break;
      }
    }
    out.busyFrom = busyFrom;
    out.ref = ref;
    for (let i = 0; i < n && i < q.length; i++) out.done.push(Math.max(0, q[i].own - rem[i]));
    return out;
  }

  return {
    predict(ek, own, cached, now) {
      const w = workers[ek];
      if (!w || w.n < opts.minSamples) return null;
      const r = replay(w, w.q.length, own, cached, now, factorOf(w), now, Math.max(w.anchor, w.phase));
      return r.end === r.end ? Math.max(0, r.end - now) : null;
    },
    sharedPrefix(ek, blocks) {
      const w = workers[ek];
      if (!w || !blocks.length) return 0;
      let best = 0;
      for (let k = 0; k < w.q.length + w.dec.length; k++) {
        const b = k < w.q.length ? w.q[k].blocks : w.dec[k - w.q.length].blocks;
        // blockAt: either list may have come packed from njs's tokenizer helper (core/state/marks.ts).
        if (!b || !b.length || blockAt(b, 0) !== blockAt(blocks, 0)) continue;
        // Longest n with b[n - 1] === blocks[n - 1], n >= 1 here.
        let lo = 1;
        let hi = Math.min(b.length, blocks.length);
        if (hi <= best) continue;
        while (lo < hi) {
          const mid = (lo + hi + 1) >> 1;
          if (blockAt(b, mid - 1) === blockAt(blocks, mid - 1)) lo = mid;
          else hi = mid - 1;
        }
        if (lo > best) best = lo;
      }
      return best;
    },
    sent(ek, own, cached, now, blocks) {
      const w = get(ek);
      const e: TwinEntry = {
        worker: ek,
        own: Math.max(1, own),
        cached: Math.max(0, cached),
        at: now,
        done: 0,
        state: 0,
        blocks: blocks || null,
        ahead: w.q.length,
        pendingAhead: 0,
        decoding: w.decodes,
        predicted: null,
      };
      for (let i = 0; i < w.q.length; i++) e.pendingAhead += Math.max(0, w.q[i].own - w.q[i].done);
      if (w.q.length >= MAX_QUEUE) {
        const old = w.q.shift();
        if (old) old.state = 2;
      }
      w.q.push(e);
      return e;
    },
    first(e, now) {
      const w = workers[e.worker];
      if (!w || e.state !== 0) return;
      const idx = w.q.indexOf(e);
      if (idx < 0) return;
      const f = factorOf(w);
      // Out of the step that gave the last first token there: the engine
      // batched it with that one (the wire's order or the phase the replica
      // assumed put it a step later). It is no reading of its own (its busy
      // stretch would be the gap between two tokens of one step); the last
      // reading's step also prefilled what it had left.
      const same = now - w.lastFirst < Math.min(SAME_STEP_MS, (f * ref.STEP_BASE_MS) / 2);
      w.lastFirst = now;
      if (!same) w.last = null;
      if (e.done < e.own && same) {
        if (w.last) fold(w, w.last, e.own - e.done, e.cached + e.done);
        for (let i = 0; i < idx; i++) w.q[i].done = w.q[i].own;
      } else if (e.done < e.own) {
        const r = replay(w, idx, 0, 0, 0, f, -Infinity, w.anchor);
        if (r.end === r.end && r.ref > 0 && now > r.busyFrom) {
          const g: Reading = {
            wt: 0,
            l: 0,
            obs: now - r.busyFrom,
            ref: r.ref,
            prefill: r.prefill,
            attn: r.attn,
            decodes: r.decodes,
            decodeCtx: r.decodeCtx,
          };
          read(w, g);
          w.n++;
        }
        // Those sent before it are prefilled too (FCFS); those after keep what
        // the step that completed it gave them.
        for (let i = 0; i < w.q.length; i++) {
          if (i < idx) w.q[i].done = w.q[i].own;
          else if (i > idx && i < r.done.length) w.q[i].done = r.done[i];
        }
      }
      w.q.splice(idx, 1);
      e.state = 1;
      if (w.dec.length >= MAX_QUEUE) w.dec.shift();
      w.dec.push(e);
      w.decodes++;
      w.decodeCtx += e.cached + e.own;
      w.anchor = now;
    },
    tick(ek, now) {
      const w = workers[ek];
      if (!w || !w.decodes || !(now > w.anchor) || !(now > w.phase)) return;
      for (let i = 0; i < w.q.length; i++) if (w.q[i].done < w.q[i].own) return;
      w.phase = now;
    },
    ended(e, now) {
      const w = workers[e.worker];
      if (!w || e.state === 2) return;
      if (e.state === 0) {
        const idx = w.q.indexOf(e);
        if (idx >= 0) w.q.splice(idx, 1);
      } else {
        const di = w.dec.indexOf(e);
        if (di >= 0) w.dec.splice(di, 1);
        w.decodes = Math.max(0, w.decodes - 1);
        w.decodeCtx = w.decodes ? Math.max(0, w.decodeCtx - e.cached - e.own) : 0;
        // Only decodes were running (no prefill left in the replica): the
        // step that ended is the phase of the decode steps from here on.
        let pending = false;
        for (let i = 0; i < w.q.length && !pending; i++) if (w.q[i].done < w.q[i].own) pending = true;
        if (!pending && now !== undefined && now > w.anchor) w.anchor = now;
      }
      e.state = 2;
    },
    factor(ek) {
      const w = workers[ek];
      return w && w.n >= opts.minSamples ? factorOf(w) : null;
    },
    samples(ek) {
      return workers[ek] ? workers[ek].n : 0;
    },
    view(ek) {
      const w = workers[ek];
      let pending = 0;
      if (w) for (let i = 0; i < w.q.length; i++) pending += Math.max(0, w.q[i].own - w.q[i].done);
      return w
        ? { waiting: w.q.length, pending: pending, decodes: w.decodes, anchor: w.anchor }
        : { waiting: 0, pending: 0, decodes: 0, anchor: -Infinity };
    },
    forget(ek) {
      delete workers[ek];
    },
  };
}
