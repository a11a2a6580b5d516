// weight * (request blocks - longest cached prefix on the worker). The cached
// prefix is what the worker's KV events reported, or what requests in flight
// there hold right now (their blocks are in its cache before any event says
// so): a burst of same-prefix requests does not look cold. Image requests on
// the prefill side score by image affinity instead (image-affinity.ts).
import { overlapWeight, Scorer, usesImageAffinity } from "../../framework";

export const prefixOverlapScorer: Scorer = {
  name: "prefix-overlap",
  profiles: ["prefill", "decode"],
  weight: (ctx) => (ctx.features.blocks.length && !usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
  score(ctx, rows) {
    const nb = ctx.features.blocks.length;
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(nb - rows[i].data.hits);
    return out;
  },
};
