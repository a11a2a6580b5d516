// LoRA affinity: a worker that must load the request's adapter first costs as
// much as LORA_COLD_BLOCKS uncached blocks (priced at the overlap weight like
// the prefix-overlap term, so a loaded adapter weighs against load the way a
// cached prefix does). Loaded there (running, waiting, or sent since the last
// scrape): 0. Sent there within the last minute but idle, so probably still in
// a slot: a quarter. Full of other adapters (only reached when every
// candidate is, see the lora-slots filter): twice. Zero weight for base-model
// requests and without LoRA state (core/lora.ts).
import { overlapWeight, Scorer } from "../../framework";

/** A cold adapter load, in uncached-block equivalents: 64 blocks (1024 tokens at block size 16). */
export const LORA_COLD_BLOCKS = 64;

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
              : LORA_COLD_BLOCKS,
      );
    }
    return out;
  },
};
