// Request objectives, after the Gateway API Inference Extension: the
// x-gateway-inference-objective header names an objective, which the
// operator's table (--objectives, like InferenceObjective's spec.priority)
// maps to an integer priority; an unknown or missing objective is 0, and a
// negative priority is sheddable. x-gateway-inference-fairness-id names the
// flow the request belongs to (a tenant, an app); requests of one band share
// the router's queues fairly across flows. Both headers are the client's
// unless a gateway sets them, so they count only with --objective-headers
// trust; otherwise every request is priority 0 in one flow and no client can
// raise its own priority. The same holds for the per-request latency
// objectives llm-d's predicted-latency scheduler reads, x-slo-ttft-ms and
// x-slo-tpot-ms (milliseconds, decimals allowed; missing, unparsable or not
// positive = none, and a bad value never refuses the request). Every one of
// these headers is the router's input only: CONTROL_HEADERS never reach a
// worker. ES5-safe: njs bundles this file.

import { hasOwn } from "./util";

export const OBJECTIVE_HEADER = "x-gateway-inference-objective";
export const FAIRNESS_HEADER = "x-gateway-inference-fairness-id";
/** The flow of a request without a fairness id (the Inference Extension's name for it). */
export const DEFAULT_FLOW = "default-flow";
/** Target time to first token, ms (llm-d's TTFTSLOHeaderKey). */
export const SLO_TTFT_HEADER = "x-slo-ttft-ms";
/** Target time per output token, ms (llm-d's TPOTSLOHeaderKey). */
export const SLO_TPOT_HEADER = "x-slo-tpot-ms";
/** The request headers the router reads for objectives; removed before the worker. */
export const CONTROL_HEADERS = [OBJECTIVE_HEADER, FAIRNESS_HEADER, SLO_TTFT_HEADER, SLO_TPOT_HEADER];

export interface Objective {
  /** The objective's name as sent ("" when none or not trusted). */
  name: string;
  priority: number;
  flow: string;
  /** x-slo-ttft-ms when trusted and a positive number. */
  sloTtftMs?: number;
  /** x-slo-tpot-ms when trusted and a positive number. */
  sloTpotMs?: number;
}

/** --objectives: "name=priority,..." with integer priorities; throws naming the bad entry. */
export function parseObjectives(spec: string): { [name: string]: number } {
  const out: { [name: string]: number } = {};
  const parts = (spec || "").split(",");
  for (let i = 0; i < parts.length; i++) {
    const item = parts[i].trim();
    if (!item) continue;
    const eq = item.lastIndexOf("=");
    const name = eq > 0 ? item.substring(0, eq).trim() : "";
    const p = eq > 0 ? Number(item.substring(eq + 1).trim()) : NaN;
    if (!name || !(p % 1 === 0) || Math.abs(p) > 1000000)
      throw new Error(
        "'" + item + "': expected objective=priority with an integer priority, e.g. critical=100,batch=-10",
      );
    out[name] = p;
  }
  return out;
}

export function objectivesProblem(spec: string): string | null {
  try {
    parseObjectives(spec);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/** Flow ids and objective names are the client's: bounded before they key a queue or a log line. */
function clip(s: string): string {
  return s.length > 128 ? s.substring(0, 128) : s;
}

export function objectiveOf(
  header: (name: string) => string | undefined,
  table: { [name: string]: number },
  trust: boolean,
): Objective {
  if (!trust) return { name: "", priority: 0, flow: DEFAULT_FLOW };
  const name = clip(header(OBJECTIVE_HEADER) || "");
  const flow = clip(header(FAIRNESS_HEADER) || "") || DEFAULT_FLOW;
  const p = hasOwn(table, name) ? table[name] : 0;
  const o: Objective = { name: name, priority: p, flow: flow };
  const ttft = sloMs(header(SLO_TTFT_HEADER));
  const tpot = sloMs(header(SLO_TPOT_HEADER));
  if (ttft > 0) o.sloTtftMs = ttft;
  if (tpot > 0) o.sloTpotMs = tpot;
  return o;
}

/** A latency objective header's value in ms; 0 when missing or not a finite positive number (llm-d: treated as no SLO). */
export function sloMs(v: string | undefined): number {
  if (!v) return 0;
  const t = v.trim();
  if (!/^[0-9]+(\.[0-9]+)?$/.test(t)) return 0;
  const n = Number(t);
  return n > 0 && n < 1e9 ? n : 0;
}
