// weight * (request blocks - longest cached prefix on the worker). The cached
// prefix is what the worker's KV events reported, or what requests in flight
// there hold right now (their blocks are in its cache before any event says
// so): a burst of same-prefix requests does not look cold. Image requests on
// the prefill side score by image affinity instead (image-affinity.ts).
import { inflightPrefix, overlapWeight, Scorer } from "../../framework";
import { usesImageAffinity } from "./image-affinity";

export const prefixOverlapScorer: Scorer = {
  name: "prefix-overlap",
  profiles: ["prefill", "decode"],
  weight: (ctx) => (ctx.features.blocks.length && !usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
  score(ctx, rows) {
    const live: { [ek: string]: boolean } = {};
    for (let i = 0; i < rows.length; i++) live[rows[i].worker.epochKey] = true;
    // Tiers: a block offloaded to CPU/disk earns its tier's share of a GPU hit (--kv-tier-weights).
    const hits = ctx.state.mirror.prefixHits(ctx.features.blocks, live, ctx.config.kvTierWeights);
    const inflight = inflightPrefix(ctx, rows);
    const nb = ctx.features.blocks.length;
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) {
      const ek = rows[i].worker.epochKey;
      const h = Math.max(hits[ek] || 0, inflight[ek] || 0);
      rows[i].hits = h;
      out.push(nb - h);
    }
    return out;
  },
};
