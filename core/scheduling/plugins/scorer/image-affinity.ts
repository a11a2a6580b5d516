// Multimodal prefill: text overlap means nothing when images differ, so images
// already seen by a worker stand in for it, scaled so that every image hit is
// worth as much as a fully cached prompt: (images - hits) * max(1, blocks/images).
import { overlapWeight, PickContext, Scorer } from "../../framework";

export function usesImageAffinity(ctx: PickContext): boolean {
  return ctx.profile === "prefill" && ctx.features.mediaHashes.length > 0 && ctx.config.policy === "kv-aware";
}

export const imageAffinityScorer: Scorer = {
  name: "image-affinity",
  profiles: ["prefill"],
  weight: (ctx) => (usesImageAffinity(ctx) ? overlapWeight(ctx) : 0),
  score(ctx, rows) {
    const media = ctx.features.mediaHashes;
    const unit = Math.max(1, ctx.features.blocks.length / media.length);
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) {
      const h = ctx.state.images.hits(rows[i].worker.epochKey, media);
      rows[i].hits = h;
      out.push((media.length - h) * unit);
    }
    return out;
  },
};
