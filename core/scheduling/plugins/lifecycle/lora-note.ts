// After a pick of an adapter request: the chosen workers now run that adapter
// (until their next /metrics scrape says otherwise), so a burst of requests
// for one adapter follows the first instead of loading it everywhere.
import { LifecyclePlugin } from "../../framework";

export const loraNote: LifecyclePlugin = {
  name: "lora-note",
  preRequest(ctx, result) {
    const t = ctx.state.lora;
    const m = ctx.features.model;
    if (!t || !m || !t.isAdapter(m)) return;
    const now = ctx.now();
    t.note(result.prefill.worker.id, m, now);
    if (result.decode && result.decode.worker.id !== result.prefill.worker.id) t.note(result.decode.worker.id, m, now);
  },
};
