// Multimodal prefill: text overlap means nothing when images differ, so images
// already seen by a worker stand in for it, scaled so that every image hit is
// worth as much as a fully cached prompt: (images - hits) * max(1, blocks/images).
import { overlapWeight, Scorer, usesImageAffinity } from "../../framework";

export const imageAffinityScorer: Scorer = {
  name: "image-affinity",
  profiles: ["prefill"],
  weight: (ctx) => (usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
  score(ctx, rows) {
    const media = ctx.features.mediaHashes;
    const unit = Math.max(1, ctx.features.blocks.length / media.length);
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push((media.length - rows[i].data.imageHits) * unit);
    return out;
  },
};
