// Flow control at the router (Envoy path): the clock and the answers around
// core/admission.ts. A cold request waits for a prefill slot on its worker
// (runtime/app.ts admit() hands it here); while it waits it can be
// - sent anyway at --prefill-admission-max-wait-ms (no TTL set: the old rule),
// - expired at --queue-ttl-ms: 503, as the Inference Extension's flow control
//   answers a request whose queue TTL ran out; a request of priority 0 or
//   below that carries x-slo-ttft-ms expires at that SLO if it comes first,
//   since it can no longer meet it and the slot is worth more to one that can;
//   higher bands wait out the whole TTL (a late critical answer is still wanted),
// - evicted by a request of a higher band when the queue is full: 429 with
//   Retry-After, like a request refused at a full queue,
// - cancelled by its stream ending: it leaves the queue at once.
// Every refusal names its reason in x-llm-d-request-dropped-reason (llm-d's
// header and values), so a client or gateway can tell them apart.
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { PrefillAdmission, Refusal } from "../core/admission";
import { Objective } from "../core/objectives";
import { Pick } from "../core/router";

export const DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason";

/** --queue-late-binding: how a pick is made again on one named worker (set by the app at the pick). */
export const repickers = new WeakMap<Pick, (workerId: string) => Pick>();

export interface FlowRefusal {
  status: number;
  message: string;
  /** OpenAI-style error type (core/errors.ts maps it per API). */
  type: string;
  headers: Record<string, string>;
  /** outcomeOf()'s hint for infera_router_requests_total. */
  outcome?: string;
}

export function refusalOf(reason: Refusal, waitedMs: number): FlowRefusal | null {
  if (reason === "queue_full")
    return {
      status: 429,
      message: "the router's queue for this priority is full; retry later",
      type: "rate_limited",
      headers: { "retry-after": "1", [DROPPED_REASON_HEADER]: "rejected-saturated" },
    };
  if (reason === "evicted")
    return {
      status: 429,
      message: "a request of higher priority took this request's place in the router's queue; retry later",
      type: "rate_limited",
      headers: { "retry-after": "1", [DROPPED_REASON_HEADER]: "evicted-priority" },
    };
  if (reason === "expired")
    return {
      status: 503,
      message: `the request waited ${Math.round(waitedMs)} ms in the router's queue without a worker free for it; retry later`,
      type: "service_unavailable",
      headers: { [DROPPED_REASON_HEADER]: "rejected-ttl-expired" },
      outcome: "expired",
    };
  return null;
}

export interface FlowMetrics {
  wait: Histogram<"priority" | "outcome">;
  refused: Counter<"priority" | "reason">;
  expired: Counter<"priority">;
}

export function flowMetrics(registry: Registry, admission: PrefillAdmission): FlowMetrics {
  for (const n of [
    "infera_router_flow_wait_seconds",
    "infera_router_flow_refused_total",
    "infera_router_flow_expired_total",
    "infera_router_flow_queued_bytes",
  ])
    registry.removeSingleMetric(n);
  new Gauge({
    name: "infera_router_flow_queued_bytes",
    help: "Request body bytes waiting at the router (--queue-max-bytes)",
    registers: [registry],
    collect() {
      this.set(admission.waitingBytes());
    },
  });
  return {
    wait: new Histogram({
      name: "infera_router_flow_wait_seconds",
      help: "Time a request waited at the router for a prefill slot, per priority band and how the wait ended: dispatched, forced, expired, evicted, cancelled",
      labelNames: ["priority", "outcome"],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    }),
    refused: new Counter({
      name: "infera_router_flow_refused_total",
      help: "Requests flow control refused with 429, per priority band and reason: saturated (sheddable, its worker busy), queue_full, evicted (a higher band took its place)",
      labelNames: ["priority", "reason"],
      registers: [registry],
    }),
    expired: new Counter({
      name: "infera_router_flow_expired_total",
      help: "Requests that waited out --queue-ttl-ms (or their SLO TTFT) in the router's queue and got 503, per priority band",
      labelNames: ["priority"],
      registers: [registry],
    }),
  };
}

export interface FlowDeps {
  admission: PrefillAdmission;
  flow: FlowMetrics;
  /** The older admission metrics: wait of dispatched requests, forced count, 429s per band. */
  admissionWait: { observe(v: number): void };
  admissionForced: { inc(): void };
  shed: { inc(l: { priority: string }): void };
  maxWaitMs: number;
  ttlMs: number;
  log: (level: "info" | "warn", line: string) => void;
  /** Late binding: the pick made again on one worker (absent: the request waits for its own worker). */
  repick?: (workerId: string) => Pick;
}

/**
 * Whether a waiting pick may go to another worker at no cost: no worker holds
 * any of its prompt (a cold prompt costs the same everywhere), and it is one
 * worker's request (not a prefill/decode pair).
 */
function movable(pick: Pick): boolean {
  return !pick.prefill && !pick.decodeCandidates && pick.candidates.every((c) => c.hits === 0);
}

/**
 * Resolves when the pick may be sent (null), or with the refusal to answer
 * instead: at once, when a slot frees on its prefill worker, at the wait
 * bound, at the TTL, or when a higher band evicts it. The pick's reservation
 * is wrapped so its slot is given back at first token or at its end,
 * whichever comes first; finishing it while it waits (the client went away)
 * takes it out of the queue and resolves it too.
 */
export function admitFlow(d: FlowDeps, pick: Pick, objective?: Objective, bytes?: number): Promise<FlowRefusal | null> {
  const key = (pick.prefill ?? pick.target).id;
  const band = String(objective ? objective.priority : 0);
  const t0 = performance.now();
  let timer: NodeJS.Timeout | null = null;
  let resolve!: (r: FlowRefusal | null) => void;
  const ready = new Promise<FlowRefusal | null>((r) => (resolve = r));
  const waited = () => performance.now() - t0;
  let over = false;
  const ended = (outcome: string) => {
    if (over) return;
    over = true;
    if (timer) {
      clearTimeout(timer);
      timer = null;
    }
    d.flow.wait.observe({ priority: band, outcome }, waited() / 1000);
  };
  let forced = false;
  let queued = false;
  const ticket = d.admission.enter(
    key,
    pick.uncachedTokens,
    () => {
      // Its worker's first token is timed from here, not from the pick.
      pick.reservation.dispatched();
      if (queued) {
        d.admissionWait.observe(waited() / 1000);
        ended(forced ? "forced" : "dispatched");
      }
      resolve(null);
    },
    objective ? { priority: objective.priority, flow: objective.flow, bytes: bytes || 0 } : undefined,
    () => {
      ended("evicted");
      d.flow.refused.inc({ priority: band, reason: "evicted" });
      d.shed.inc({ priority: band });
      resolve(refusalOf("evicted", waited()));
    },
    d.repick && movable(pick) ? (id) => move(id) : undefined,
  );
  // Late binding: the pick made again on the worker that freed a slot; its
  // load moves there (the old reservation is finished, the new one held).
  const move = (id: string): boolean => {
    let next: Pick;
    try {
      next = d.repick!(id);
    } catch (e) {
      return false;
    }
    if ((next.prefill ?? next.target).id !== id) {
      next.reservation.finish();
      return false;
    }
    const old = inner;
    inner = next.reservation;
    old.finish();
    pick.target = next.target;
    pick.candidates = next.candidates;
    pick.uncachedTokens = next.uncachedTokens;
    pick.mmImages = next.mmImages;
    pick.mmAffinityHits = next.mmAffinityHits;
    return true;
  };
  if (ticket.refused) {
    d.flow.refused.inc({ priority: band, reason: ticket.refused });
    d.shed.inc({ priority: band });
    return Promise.resolve(refusalOf(ticket.refused, 0));
  }
  // Warm (or admission off): no slot to give back, nothing to wrap.
  if (ticket.admitted && !ticket.slot) return ready;
  if (!ticket.admitted) {
    queued = true;
    let expireMs = d.ttlMs;
    if (expireMs > 0 && objective && objective.priority <= 0 && objective.sloTtftMs)
      expireMs = Math.min(expireMs, objective.sloTtftMs);
    if (expireMs > 0)
      timer = setTimeout(() => {
        timer = null;
        if (!ticket.expire()) return;
        ended("expired");
        d.flow.expired.inc({ priority: band });
        resolve(refusalOf("expired", waited()));
      }, expireMs);
    else
      timer = setTimeout(() => {
        timer = null;
        d.admissionForced.inc();
        d.log("info", `prefill admission: a request waited ${d.maxWaitMs} ms for ${key}; sent past the limit`);
        forced = true;
        ticket.force();
      }, d.maxWaitMs);
    timer.unref();
  }
  let inner = pick.reservation;
  pick.reservation = {
    get open() {
      return inner.open;
    },
    guards: () => inner.guards(),
    dispatched: () => inner.dispatched(),
    firstToken() {
      ticket.leave();
      inner.firstToken();
    },
    finish() {
      if (!ticket.admitted && !ticket.refused) ended("cancelled");
      if (timer) clearTimeout(timer);
      ticket.leave();
      resolve(null);
      inner.finish();
    },
  };
  return ready;
}
