// kv-aware: lowest cost. Ties go to fewer active blocks, then fewer requests
// in flight (prompts under one block and non-LLM calls hold no blocks, and
// must not all land on the first worker), then fewer cached blocks (cold
// prompts spread instead of piling on the warmest worker), then fleet order.
// Deterministic for a given state.
import { Picker, PickContext, Row } from "../../framework";

function better(ctx: PickContext, c: Row, b: Row): boolean {
  if (c.cost !== b.cost) return c.cost < b.cost;
  if (c.active !== b.active) return c.active < b.active;
  if (c.data.held !== b.data.held) return c.data.held < b.data.held;
  return ctx.state.mirror.count(c.worker.epochKey) < ctx.state.mirror.count(b.worker.epochKey);
}

export const lowestCostPicker: Picker = {
  name: "kv-aware",
  pick(ctx, rows) {
    let bi = 0;
    for (let i = 1; i < rows.length; i++) if (better(ctx, rows[i], rows[bi])) bi = i;
    return bi;
  },
};
