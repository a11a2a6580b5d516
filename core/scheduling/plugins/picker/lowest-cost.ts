// kv-aware: lowest cost. Ties go to fewer active blocks, then fewer requests
// in flight (prompts under one block and non-LLM calls hold no blocks, and
// must not all land on the first worker), then a rotation among the workers
// still tied (one shared position, state.next("TB"), so every VM and pool
// turns the same wheel). The rotation replaced "fewer cached blocks": that
// rule sent every cold prompt to the emptiest worker, and the emptiest worker
// is the one that just died or restarted (its mirror was cleared), so a dead
// worker took all cold traffic until a health check noticed. Deterministic
// for a given state.
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
    return tied[(ctx.state.next("TB") - 1) % tied.length];
  },
};
