// Request objectives, after the Gateway API Inference Extension: the
// x-gateway-inference-objective header names an objective, which the
// operator's table (--objectives, like InferenceObjective's spec.priority)
// maps to an integer priority; an unknown or missing objective is 0, and a
// negative priority is sheddable. x-gateway-inference-fairness-id names the
// flow the request belongs to (a tenant, an app); requests of one band share
// the router's queues fairly across flows. Both headers are the client's
// unless a gateway sets them, so they count only with --objective-headers
// trust; otherwise every request is priority 0 in one flow and no client can
// raise its own priority. ES5-safe: njs bundles this file.

import { hasOwn } from "./util";

export const OBJECTIVE_HEADER = "x-gateway-inference-objective";
export const FAIRNESS_HEADER = "x-gateway-inference-fairness-id";
/** The flow of a request without a fairness id (the Inference Extension's name for it). */
export const DEFAULT_FLOW = "default-flow";

export interface Objective {
  /** The objective's name as sent ("" when none or not trusted). */
  name: string;
  priority: number;
  flow: string;
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
  return { name: name, priority: p, flow: flow };
}
