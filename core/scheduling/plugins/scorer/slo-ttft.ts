// Predicted time to first token against the request's SLO (x-slo-ttft-ms,
// after llm-d's predicted-latency scheduler): a worker the replica of its
// step scheduler (core/twin.ts; the speed model, core/latency.ts, until the
// replica has learned it) predicts to miss the target is priced above every worker
// predicted to meet it, so the usual cost (cache fit, load, both turned into
// time by slowness) picks among those that meet it. When none does, the
// misses rank by how far they miss, which is the lowest predicted TTFT.
//
// A worker the model cannot predict yet counts as meeting the target (cold
// start is today's cost). Without an SLO, or with --speed-learning off, the
// scorer does not run.
import { Scorer } from "../../framework";
import { predictTtft } from "../lifecycle/speed";

/** Above any block cost: a predicted miss outranks every cost difference among the workers that meet the SLO. */
const MISS = 1e7;

export const sloTtftScorer: Scorer = {
  name: "slo-ttft",
  profiles: ["prefill"],
  weight: (ctx) => (ctx.latency && ctx.features.sloTtftMs && ctx.features.sloTtftMs > 0 ? 1 : 0),
  score(ctx, rows) {
    const out: number[] = [];
    const slo = ctx.features.sloTtftMs || 0;
    for (let i = 0; i < rows.length; i++) {
      const p = predictTtft(ctx, rows[i].worker.epochKey, rows[i].data);
      out.push(p === null || p <= slo ? 0 : MISS * (1 + p / slo));
    }
    return out;
  },
};
