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
    const key = fnv1a(blocks[0]);
    let best = tied[0];
    let top = -1;
    for (let i = 0; i < tied.length; i++) {
      const h = mix32(key ^ Math.imul(tied[i] + 1, 0x9e3779b9));
      if (h > top) {
        top = h;
        best = tied[i];
      }
    }
    return best;
  },
};

/**
 * MurmurHash3's 32-bit finalizer: every input bit flips about half the output
 * bits, so the per-worker scores of one key are independent draws (FNV-1a's
 * own last step is not: keys one apart score one multiplier apart).
 */
function mix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** 32-bit FNV-1a of a string's UTF-16 code units, as an unsigned number (ES5: njs bundles this file). */
function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}
