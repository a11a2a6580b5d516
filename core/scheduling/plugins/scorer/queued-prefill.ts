// Prefill work already queued on the worker: the uncached blocks of requests
// routed there that have not produced a first token yet. A new request waits
// for every one of them before its own prefill starts, so a queued block costs
// it what one of its own uncached blocks costs: the overlap weight. At weight 1
// (the old fixed weight) the backlog was cheap next to the cache, and agentic
// tool loops over one shared preamble all piled onto its holder: 0.79x
// round-robin's mean TTFT at concurrency 16, 1.30x with this weight (bench:trace).
// Overlap weight 0 (pure load balance) leaves in-flight blocks only.
import { overlapWeight, Scorer } from "../../framework";

export const queuedPrefillScorer: Scorer = {
  name: "queued-prefill",
  profiles: ["prefill"],
  weight: overlapWeight,
  score(ctx, rows) {
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(ctx.state.load.pendingBlocks(rows[i].worker.epochKey));
    return out;
  },
};
