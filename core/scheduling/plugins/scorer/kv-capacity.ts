// KV memory: blocks this request would need on the worker beyond what its KV
// cache can hold. An engine admits a waiting request only when its blocks fit
// (vLLM's scheduler and KV cache manager: the request waits, head of line,
// until running requests free theirs), so past capacity an uncached block does
// not just cost compute, it costs a wait for memory. And every block a full
// worker allocates evicts a cached one: prefixes packed onto a worker whose
// running set already fills its cache push out the prefixes its next requests
// need.
//
// term(w) = max(0, used(w) + new(w) - capacity(w)), where
//   used(w) = the larger of the worker's distinct in-flight prompt blocks (the
//             router's own ledger, exact at the pick) and its engine's last
//             reported KV usage times its capacity (covers generated tokens
//             and other routers' traffic, a scrape late);
//   new(w)  = the request's blocks the worker does not hold.
// A worker of unknown capacity scores 0, so a fleet without readings routes
// as before; so does every worker with room.
//
// The same term replicates a hot prefix: when its holder's running set fills
// the holder's cache, the next request for it costs the holder its overflow
// and a non-holder with room computes a second copy once; from then on both
// hold it and the prefix term keeps their requests on either.
import { overlapWeight, Scorer, usesImageAffinity } from "../../framework";

export const kvCapacityScorer: Scorer = {
  name: "kv-capacity",
  profiles: ["prefill"],
  weight: (ctx) => (ctx.features.blocks.length && !usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
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
      out.push(Math.max(0, used + (nb - d.hits) - cap));
    }
    return out;
  },
};
