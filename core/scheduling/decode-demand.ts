// Decode input-demand: demand(w) = in-flight input tokens on w + this request's
// input tokens x n + W x requests held on w. Lowest wins; ties go to the
// original cost, then candidate order. `shadow` records the suggestion beside
// the original choice; `on` uses it.
import { demandN, PickContext, Row } from "./framework";
import { DemandMode } from "../types";

export interface DemandDecision {
  mode: DemandMode;
  input: "exact" | "estimate";
  original: string;
  suggestion: string;
  actual: string;
  agrees: boolean;
  candidates: { id: string; demand: number; originalCost: number }[];
}

export function decideDemand(
  ctx: PickContext,
  rows: Row[],
  original: number,
): { index: number; decision: DemandDecision } {
  const need = ctx.features.inputTokens * demandN(ctx.features);
  const out: { id: string; demand: number; originalCost: number }[] = [];
  let bi = 0;
  for (let i = 0; i < rows.length; i++) {
    const d = ctx.state.load.demand(rows[i].worker.epochKey);
    const demand = d.tokens + need + ctx.config.decodeRequestWeight * d.requests;
    out.push({ id: rows[i].worker.id, demand: demand, originalCost: rows[i].cost });
    const b = out[bi];
    if (demand < b.demand || (demand === b.demand && rows[i].cost < b.originalCost)) bi = i;
  }
  const mode = ctx.config.decodeInputDemand;
  const actual = mode === "on" ? bi : original;
  return {
    index: actual,
    decision: {
      mode: mode,
      input: ctx.features.exact ? "exact" : "estimate",
      original: rows[original].worker.id,
      suggestion: rows[bi].worker.id,
      actual: rows[actual].worker.id,
      agrees: bi === original,
      candidates: out,
    },
  };
}
