// LoRA slots: a request for an adapter never goes to a worker whose adapter
// slots are all taken by other adapters while another worker has room (or
// the adapter already). There it would wait for a slot behind every request
// of those adapters; elsewhere it runs now. When every worker is full the
// pool is left as it is and the scorers choose. Inert without LoRA state
// (state.lora, scraped from the workers' /metrics: core/lora.ts).
import { Filter } from "../../framework";
import { Worker } from "../../../types";

export const loraSlotsFilter: Filter = {
  name: "lora-slots",
  profiles: ["prefill", "decode"],
  filter(ctx, workers) {
    const t = ctx.state.lora;
    const m = ctx.features.model;
    if (!t || !m || workers.length < 2 || !t.isAdapter(m)) return workers;
    const now = ctx.now();
    const room: Worker[] = [];
    for (let i = 0; i < workers.length; i++) if (t.fit(workers[i].id, m, now) !== "full") room.push(workers[i]);
    return room.length ? room : workers;
  },
};
