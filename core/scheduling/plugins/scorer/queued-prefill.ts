// Prefill work already queued on the worker: the uncached blocks of requests
// routed there that have not produced a first token yet. A new request waits
// behind them, so they cost what its own uncached blocks cost (the overlap
// weight): weight x (own uncached + queued) is the prefill time ahead of it.
import { overlapWeight, Scorer } from "../../framework";

export const queuedPrefillScorer: Scorer = {
  name: "queued-prefill",
  profiles: ["prefill"],
  weight: (ctx) => overlapWeight(ctx),
  score(ctx, rows) {
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(ctx.state.load.pendingBlocks(rows[i].worker.epochKey));
    return out;
  },
};
