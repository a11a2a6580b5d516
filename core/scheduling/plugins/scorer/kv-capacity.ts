// KV memory: blocks this request would need on the worker beyond what its KV
// cache can hold. An engine admits a waiting request only when its blocks fit
// (vLLM's scheduler and KV cache manager: the request waits, head of line,
// until running requests free theirs), so past capacity an uncached block does
// not just cost compute, it costs a wait for memory. And every block a full
// worker allocates evicts a cached one: prefixes packed onto a worker whose
// running set already fills its cache push out the prefixes its next requests
// need.
//
// term(w) = max(0, used(w) + blocks(w) - capacity(w)), where
//   used(w)   = the larger of the worker's distinct in-flight prompt blocks
//               (the router's own ledger, exact at the pick) and its engine's
//               last reported KV usage times its capacity (covers generated
//               tokens and other routers' traffic, a scrape late);
//   blocks(w) = the request's blocks not already held by requests running
//               there. A cached prefix no running request holds still takes
//               room: its blocks sit in the engine's free pool, and the
//               request must hold them alongside its new ones.
// A worker of unknown capacity scores 0, so a fleet without readings routes
// as before; so does every worker with room.
//
// Off unless --scorer-weights names it: in bench:policy-sim's KV-pressure runs
// it changed nothing where each cache holds a quarter of the hot set, and cost
// the document workload about 9% where it holds less (the runs and commands:
// docs/benchmarks/2026-12-05-kv-pressure.md). The default's prefix and load
// terms already keep hot prefixes apart and copy one when its holder is busy.
//
// The same term replicates a hot prefix: when its holder's running set fills
// the holder's cache, the next request for it costs the holder its overflow
// and a non-holder with room computes a second copy once; from then on both
// hold it and the prefix term keeps their requests on either.
import { overlapWeight, Scorer, usesImageAffinity } from "../../framework";

export const kvCapacityScorer: Scorer = {
  name: "kv-capacity",
  profiles: ["prefill"],
  // Opt-in (--scorer-weights kv-capacity=W): see the note at the top.
  weight: (ctx) =>
    ctx.config.scorerWeights["kv-capacity"] > 0 && ctx.features.blocks.length && !usesImageAffinity(ctx)
      ? overlapWeight(ctx)
      : 0,
  score(ctx, rows) {
    const nb = ctx.features.blocks.length;
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) {
      const d = rows[i].data;
      const cap = d.capacityBlocks;
      if (cap === null || !(cap > 0)) {
        out.push(0);
        continue;
      }
      let used = d.active;
      if (d.kvUsage !== null && d.kvUsage * cap > used) used = d.kvUsage * cap;
      out.push(Math.max(0, used + (nb - d.inflight) - cap));
    }
    return out;
  },
};
