// kv-aware: lowest cost. Ties go to fewer active blocks, then fewer requests
// in flight (prompts under one block and non-LLM calls hold no blocks, and
// must not all land on the first worker), then, among the workers still tied,
// to the highest rendezvous hash of (the prompt's first block, the worker's
// place in the pool): cold prompts spread across the fleet by content,
// prompts that open alike land together (the second finds the first's
// prefix), and every router replica, holding the same mirror and the same
// worker list, picks the same worker. A request without
// blocks (under one block, or no prompt) takes turns instead (one shared
// position, state.next("TB"), so every njs VM turns the same wheel). Both
// replaced "fewer cached blocks": that rule sent every cold prompt to the
// emptiest worker, and the emptiest worker is the one that just died or
// restarted (its mirror was cleared), so a dead worker took all cold traffic
// until a health check noticed.
import { Picker, PickContext, Row } from "../../framework";
import { utf8 } from "../../../util";
import { xxh3Pair } from "../../../xxh3";

/** -1: c before b, 1: b before c, 0: tied. */
function order(c: Row, b: Row): number {
  if (c.cost !== b.cost) return c.cost < b.cost ? -1 : 1;
  if (c.active !== b.active) return c.active < b.active ? -1 : 1;
  if (c.data.held !== b.data.held) return c.data.held < b.data.held ? -1 : 1;
  return 0;
}

export const lowestCostPicker: Picker = {
  name: "kv-aware",
  pick(ctx: PickContext, rows: Row[]) {
    let bi = 0;
    let tied: number[] = [0];
    for (let i = 1; i < rows.length; i++) {
      const o = order(rows[i], rows[bi]);
      if (o < 0) {
        bi = i;
        tied = [i];
      } else if (o === 0) tied.push(i);
    }
    if (tied.length === 1) return bi;
    const blocks = ctx.features.blocks;
    if (!blocks.length) return tied[(ctx.state.next("TB") - 1) % tied.length];
    let best = tied[0];
    let top = -1;
    for (let i = 0; i < tied.length; i++) {
      // XXH3 of (first block, place in the pool): independent scores per worker for one prompt.
      const h = xxh3Pair(utf8(blocks[0] + ":" + tied[i]))[1];
      if (h > top) {
        top = h;
        best = tied[i];
      }
    }
    return best;
  },
};
