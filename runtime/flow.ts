// Flow control at the router (Envoy path): the answers and metrics around
// core/admission.ts; the clock is the director's (runtime/director.ts
// admitWith). A cold request waits for a prefill slot on its worker; while
// it waits it can be
// - sent anyway at --prefill-admission-max-wait-ms (no TTL set: the old rule),
// - expired at --queue-ttl-ms: 503, as the Inference Extension's flow control
//   answers a request whose queue TTL ran out; one that carries x-slo-ttft-ms
//   expires at that SLO if it comes first, since it can no longer meet it and
//   the slot is worth more to one that can. Only priority 0 and below expire:
//   a protected band (above 0) goes at the wait bound instead (a late critical
//   answer is still wanted),
// - evicted by a request of a higher band when the queue is full: 429 with
//   Retry-After, like a request refused at a full queue,
// - cancelled by its stream ending: it leaves the queue at once.
// Every refusal names its reason in x-llm-d-request-dropped-reason (llm-d's
// header and values), so a client or gateway can tell them apart.
import { Counter, Gauge, Registry } from "prom-client";
import { spec } from "./metrics";
import { FastHistogram } from "./fast-histogram";
import { PrefillAdmission, Refusal } from "../core/admission";
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
  /** Labels priority, outcome (observed once per request that waited). */
  wait: FastHistogram;
  /** Labels priority, reason. */
  refused: Counter;
  /** Label priority. */
  expired: Counter;
  /** Label outcome (decisionOutcome): the ext_proc server's time to answer. */
  decision: FastHistogram;
}

/**
 * The outcome label of infera_router_decision_seconds: the request outcome,
 * with flow control's refusals told apart by their dropped reason, so the
 * immediate shed (429 before any wait) is not mixed with the 429s and 503s
 * that end a wait in the queue.
 */
export function decisionOutcome(outcome: string, headers: Record<string, string> | undefined): string {
  const reason = headers ? headers[DROPPED_REASON_HEADER] : undefined;
  if (reason === "rejected-saturated") return "queue_full";
  if (reason === "evicted-priority") return "evicted";
  if (reason === "rejected-ttl-expired") return "expired";
  return outcome;
}

export function flowMetrics(registry: Registry, admission: PrefillAdmission): FlowMetrics {
  for (const n of [
    "infera_router_flow_wait_seconds",
    "infera_router_flow_refused_total",
    "infera_router_flow_expired_total",
    "infera_router_flow_queued_bytes",
    "infera_router_decision_seconds",
  ])
    registry.removeSingleMetric(n);
  new Gauge({
    ...spec("infera_router_flow_queued_bytes"),
    registers: [registry],
    collect() {
      this.set(admission.waitingBytes());
    },
  });
  return {
    wait: new FastHistogram(spec("infera_router_flow_wait_seconds"), registry),
    refused: new Counter({
      ...spec("infera_router_flow_refused_total"),
      registers: [registry],
    }),
    expired: new Counter({
      ...spec("infera_router_flow_expired_total"),
      registers: [registry],
    }),
    decision: new FastHistogram(spec("infera_router_decision_seconds"), registry),
  };
}
