// Prefill/decode pools. Disaggregated (PD) only when both prefill and decode
// workers are usable; mixed workers then serve either side, after the
// dedicated ones. Otherwise the prefill profile is the only one and gets all.
import { Filter } from "../../framework";
import { Worker } from "../../../types";

export const rolePoolFilter: Filter = {
  name: "role-pool",
  profiles: ["prefill", "decode"],
  filter(ctx, workers) {
    if (!ctx.pd) return ctx.profile === "prefill" ? workers : [];
    const own: Worker[] = [];
    const mixed: Worker[] = [];
    for (let i = 0; i < workers.length; i++) {
      const r = workers[i].role;
      if (r === ctx.profile) own.push(workers[i]);
      else if (r !== "prefill" && r !== "decode") mixed.push(workers[i]);
    }
    return own.concat(mixed);
  },
};
