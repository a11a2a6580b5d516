// Prefill admission: at most `slots` cold prefills in flight per worker; the
// rest wait at the router, in arrival order, bound to the worker they were
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
// highest priority band, then, within the band, the flow (tenant) served
// least recently, so one flow sending ten times the others cannot take the
// band's turns; within a flow, arrival order. A waiting request never
// overtakes one already holding a slot: slots are not preempted.
//
// Pure and clock-free (core/): the adapter bounds the wait with its own timer
// (force) and frees the slot at first token or at the end of the request
// (leave), whichever comes first.

export interface AdmissionConfig {
  /** Cold prefills in flight per worker; 0 turns admission off. */
  slots: number;
  /** Uncached prefill tokens up to which a request is warm. */
  warmTokens: number;
}

export interface Ticket {
  /** True once the request may go (at once, by a freed slot, or forced). */
  readonly admitted: boolean;
  /** True while it holds one of the worker's slots. */
  readonly slot: boolean;
  /** Gives the slot back, or leaves the queue; idempotent. */
  leave(): void;
  /** Admits now, past the limit (the wait bound ran out); it still takes a slot. */
  force(): void;
}

interface Waiter {
  t: TicketState;
  go: () => void;
  priority: number;
  flow: string;
  /** Arrival order. */
  n: number;
}

/** Where a request stands among others waiting: its band and its flow. */
export interface QueueClass {
  priority: number;
  flow: string;
}

interface TicketState extends Ticket {
  admitted: boolean;
  slot: boolean;
  gone: boolean;
}

export interface PrefillAdmission {
  readonly config: AdmissionConfig;
  /**
   * Asks to send a request with `uncachedTokens` of prefill to worker `key`.
   * go() runs once, when the request is admitted: before enter() returns when
   * it can go at once.
   */
  enter(key: string, uncachedTokens: number, go: () => void, cls?: QueueClass): Ticket;
  /** Whether a request with this much uncached prefill would wait for worker key now. */
  wouldWait(key: string, uncachedTokens: number): boolean;
  /** Requests waiting, for one worker or all. */
  waiting(key?: string): number;
  /** Requests waiting per priority band, over every worker. */
  waitingByPriority(): { [priority: string]: number };
  /** Slots taken on a worker. */
  busy(key: string): number;
}

export function prefillAdmission(config: AdmissionConfig): PrefillAdmission {
  const busy: { [key: string]: number } = {};
  const queues: { [key: string]: Waiter[] } = {};
  // When each flow was last let go (a counter, not a clock), for fairness within a band.
  const served: { [flow: string]: number } = {};
  let turn = 0;
  let arrivals = 0;

  /** Marks t admitted on a slot of key's worker. */
  function take(key: string, t: TicketState): void {
    t.admitted = true;
    t.slot = true;
    busy[key] = (busy[key] || 0) + 1;
  }

  /** Takes t out of key's queue, if it is there. */
  function dequeue(key: string, t: TicketState): void {
    const q = queues[key];
    for (let i = 0; q && i < q.length; i++)
      if (q[i].t === t) {
        q.splice(i, 1);
        if (!q.length) delete queues[key];
        return;
      }
  }

  /** Index of the waiter to go next: highest band, least recently served flow, earliest arrival. */
  function first(q: Waiter[]): number {
    let b = 0;
    for (let i = 1; i < q.length; i++) {
      const w = q[i];
      const c = q[b];
      if (w.priority !== c.priority) {
        if (w.priority > c.priority) b = i;
        continue;
      }
      const ws = served[w.flow] || 0;
      const cs = served[c.flow] || 0;
      if (ws !== cs ? ws < cs : w.n < c.n) b = i;
    }
    return b;
  }

  function next(key: string): void {
    const q = queues[key];
    while (q && q.length && (busy[key] || 0) < config.slots) {
      const w = q.splice(first(q), 1)[0];
      served[w.flow] = ++turn;
      take(key, w.t);
      w.go();
    }
    if (q && !q.length) delete queues[key];
  }

  function waits(key: string, uncachedTokens: number): boolean {
    if (config.slots <= 0 || uncachedTokens <= config.warmTokens) return false;
    return (busy[key] || 0) >= config.slots || !!queues[key];
  }

  function enter(key: string, uncachedTokens: number, go: () => void, cls?: QueueClass): Ticket {
    const t: TicketState = {
      admitted: false,
      slot: false,
      gone: false,
      leave() {
        if (t.gone) return;
        t.gone = true;
        if (t.slot) {
          t.slot = false;
          busy[key]--;
          if (!busy[key]) delete busy[key];
          next(key);
        } else if (!t.admitted) dequeue(key, t);
      },
      force() {
        if (t.admitted || t.gone) return;
        dequeue(key, t);
        take(key, t);
        go();
      },
    };
    if (config.slots <= 0 || uncachedTokens <= config.warmTokens) {
      t.admitted = true;
      go();
      return t;
    }
    const flow = cls ? cls.flow : "";
    // Behind others already waiting even if a slot is free at this instant.
    if (!waits(key, uncachedTokens)) {
      served[flow] = ++turn;
      take(key, t);
      go();
      return t;
    }
    if (!queues[key]) queues[key] = [];
    queues[key].push({ t: t, go: go, priority: cls ? cls.priority : 0, flow: flow, n: arrivals++ });
    return t;
  }

  return {
    config: config,
    enter: enter,
    wouldWait: waits,
    waitingByPriority() {
      const out: { [priority: string]: number } = {};
      for (const k in queues)
        for (let i = 0; i < queues[k].length; i++)
          out[String(queues[k][i].priority)] = (out[String(queues[k][i].priority)] || 0) + 1;
      return out;
    },
    waiting(key?: string): number {
      if (key !== undefined) return queues[key] ? queues[key].length : 0;
      let n = 0;
      for (const k in queues) n += queues[k].length;
      return n;
    },
    busy(key: string): number {
      return busy[key] || 0;
    },
  };
}
