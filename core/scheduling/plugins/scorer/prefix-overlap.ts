// weight * (request blocks - longest cached prefix on the worker). Image
// requests on the prefill side score by image affinity instead (image-affinity.ts).
import { overlapWeight, Scorer } from "../../framework";
import { usesImageAffinity } from "./image-affinity";

export const prefixOverlapScorer: Scorer = {
  name: "prefix-overlap",
  profiles: ["prefill", "decode"],
  weight: (ctx) => (ctx.features.blocks.length && !usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
  score(ctx, rows) {
    const live: { [ek: string]: boolean } = {};
    for (let i = 0; i < rows.length; i++) live[rows[i].worker.epochKey] = true;
    const hits = ctx.state.mirror.prefixHits(ctx.features.blocks, live);
    const nb = ctx.features.blocks.length;
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) {
      const h = hits[rows[i].worker.epochKey] || 0;
      rows[i].hits = h;
      out.push(nb - h);
    }
    return out;
  },
};
