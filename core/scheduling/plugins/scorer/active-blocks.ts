// Load: distinct prompt blocks in flight on the worker (shared prefixes once).
import { Scorer } from "../../framework";

export const activeBlocksScorer: Scorer = {
  name: "active-blocks",
  profiles: ["prefill", "decode"],
  weight: () => 1,
  score(ctx, rows) {
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) {
      const a = ctx.state.load.activeBlocks(rows[i].worker.epochKey);
      rows[i].active = a;
      out.push(a);
    }
    return out;
  },
};
