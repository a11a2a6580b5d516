// LoRA affinity: a worker that must load the request's adapter first costs as
// much as LORA_COLD_BLOCKS uncached blocks (priced at the overlap weight like
// the prefix-overlap term, so a loaded adapter weighs against load the way a
// cached prefix does). Loaded there (running, waiting, or sent since the last
// scrape): 0. Sent there within the last minute but idle, so probably still in
// a slot: a quarter. A free slot only by evicting an adapter sent there
// lately: one and a half (its next request pays the load again). Full of other
// adapters (only reached when every candidate is, see the lora-slots filter):
// twice. Zero weight for base-model requests and without LoRA state
// (core/lora.ts).
import { overlapWeight, Scorer } from "../../framework";

/**
 * A cold adapter load, in uncached-block equivalents: 256 blocks (4096 tokens
 * at block size 16). Loading an adapter into a GPU slot takes tens to hundreds
 * of ms, the prefill time of thousands of tokens, and it evicts another.
 */
export const LORA_COLD_BLOCKS = 256;

export const loraAffinityScorer: Scorer = {
  name: "lora-affinity",
  profiles: ["prefill", "decode"],
  weight(ctx) {
    const t = ctx.state.lora;
    const m = ctx.features.model;
    return t && m && t.isAdapter(m) ? overlapWeight(ctx) : 0;
  },
  score(ctx, rows) {
    const t = ctx.state.lora!;
    const m = ctx.features.model as string;
    const now = ctx.now();
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) {
      const f = t.fit(rows[i].worker.id, m, now);
      out.push(
        f === "loaded"
          ? 0
          : f === "recent"
            ? LORA_COLD_BLOCKS / 4
            : f === "full"
              ? 2 * LORA_COLD_BLOCKS
              : f === "evicts"
                ? 1.5 * LORA_COLD_BLOCKS
                : LORA_COLD_BLOCKS,
      );
    }
    return out;
  },
};
