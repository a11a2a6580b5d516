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
  enter(key: string, uncachedTokens: number, go: () => void): Ticket;
  /** Requests waiting, for one worker or all. */
  waiting(key?: string): number;
  /** Slots taken on a worker. */
  busy(key: string): number;
}

export function prefillAdmission(config: AdmissionConfig): PrefillAdmission {
  const busy: { [key: string]: number } = {};
  const queues: { [key: string]: Waiter[] } = {};

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

  function next(key: string): void {
    const q = queues[key];
    while (q && q.length && (busy[key] || 0) < config.slots) {
      const w = q.shift() as Waiter;
      take(key, w.t);
      w.go();
    }
    if (q && !q.length) delete queues[key];
  }

  function enter(key: string, uncachedTokens: number, go: () => void): Ticket {
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
    // Behind others already waiting even if a slot is free at this instant.
    if ((busy[key] || 0) < config.slots && !queues[key]) {
      take(key, t);
      go();
      return t;
    }
    if (!queues[key]) queues[key] = [];
    queues[key].push({ t: t, go: go });
    return t;
  }

  return {
    config: config,
    enter: enter,
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
