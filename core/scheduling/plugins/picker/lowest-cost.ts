// kv-aware: lowest cost; ties go to fewer active blocks, then fewer cached
// blocks (cold prompts spread instead of piling on the warmest worker), then
// candidate order. Deterministic for a given state.
import { Picker } from "../../framework";

export const lowestCostPicker: Picker = {
  name: "kv-aware",
  pick(ctx, rows) {
    let bi = 0;
    let bc = rows.length ? ctx.state.mirror.count(rows[0].worker.epochKey) : 0;
    for (let i = 1; i < rows.length; i++) {
      const c = rows[i];
      const b = rows[bi];
      if (c.cost > b.cost || (c.cost === b.cost && c.active > b.active)) continue;
      const cc = ctx.state.mirror.count(c.worker.epochKey);
      if (c.cost < b.cost || c.active < b.active || cc < bc) {
        bi = i;
        bc = cc;
      }
    }
    return bi;
  },
};
