// Credit for queued prefill this request shares. When requests for one new
// document arrive together, the first is still computing it when the others
// are routed: its blocks are queued on that worker, and queued-prefill.ts
// charges them to every later request there as a wait. But a copy elsewhere is
// no cheaper for the request itself (it computes the same blocks instead of
// waiting for them), and it costs the fleet the document a second time, which
// delays whatever that worker serves next. So the shared queued blocks are
// taken back out of the wait, and the burst stays with the worker computing
// its document.
//
// Only while every worker in the pool is busy: a copy on an idle worker delays
// nobody, and there it buys spread. Agent loops that all start from one tool
// preamble are the case: credited while workers sat idle, the first burst of
// them went to the preamble's first holder, their histories grew there and
// other workers idled for the whole run. On an engine that reuses a prefix
// still being computed (as vLLM V1 does, so riding along costs the fleet
// nothing), the gate costs the document burst less than the agent loops gain
// from it: bench:policy-sim with and without the gate,
// docs/benchmarks/2026-12-05-policy-sim.md#measurements-behind-the-defaults
import { overlapWeight, Scorer, usesImageAffinity } from "../../framework";

export const queuedSharedScorer: Scorer = {
  name: "queued-shared",
  profiles: ["prefill"],
  weight: (ctx) => (ctx.features.blocks.length && !usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
  score(_ctx, rows) {
    const out: number[] = [];
    let idle = false;
    for (let i = 0; i < rows.length; i++) {
      out.push(0);
      if (!rows[i].data.held) idle = true;
    }
    if (idle) return out;
    for (let i = 0; i < rows.length; i++) if (rows[i].data.queuedShared) out[i] = -rows[i].data.queuedShared;
    return out;
  },
};
