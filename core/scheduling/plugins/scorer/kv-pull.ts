// KV source hint pricing (active with --kv-source-hint on): a worker that lacks
// a prefix another worker holds cached can pull those blocks over the KV
// transfer link instead of computing them (kv-source.ts names the holder).
// prefix-overlap prices every block the worker lacks as compute, so a busy
// holder keeps its requests until its queue outweighs recomputing the whole
// prefix elsewhere. This term gives back part of that price for the blocks a
// pull covers: each worker is charged weight x the pullable blocks it lacks
// less than the best-placed worker lacks them, i.e. a holder keeps only
// (1 - credit) of its advantage, where credit = this weight / overlap weight.
//
// Default weight: 0.7 x the overlap weight. A pull moves 128 KiB per token of
// an 8B-class model (32 layers x 8 KV heads x 128 dims x K,V x 2 bytes) over
// a 100 Gbit/s link, about 10.5 us a token, against about 35 us a token to
// compute it on an H100 (docs/simulator.md's calibration): a pulled block
// costs about 30% of a computed one. Other models and links: --scorer-weights
// kv-pull=W (W = overlap weight x (1 - pull time / compute time)).
// Only blocks KV events report cached count as pullable (blocks in flight on
// the holder are not computed yet).
import { overlapWeight, Scorer, usesImageAffinity } from "../../framework";

export const kvPullScorer: Scorer = {
  name: "kv-pull",
  profiles: ["prefill"],
  weight: (ctx) =>
    ctx.config.kvSourceHint === "on" && !ctx.pd && ctx.features.blocks.length && !usesImageAffinity(ctx)
      ? 0.7 * overlapWeight(ctx)
      : 0,
  score(_ctx, rows) {
    // pull[i]: blocks worker i could pull beyond its own hits (best cached elsewhere).
    const pull: number[] = [];
    let most = 0;
    for (let i = 0; i < rows.length; i++) {
      let best = 0;
      for (let j = 0; j < rows.length; j++) if (j !== i && rows[j].data.cached > best) best = rows[j].data.cached;
      const p = Math.max(0, best - rows[i].data.hits);
      pull.push(p);
      if (p > most) most = p;
    }
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(most - pull[i]);
    return out;
  },
};
