// Workers that can take a pick at all: block size matches, not excluded, healthy.
import { Filter } from "../../framework";
import { RouterConfig, Worker } from "../../../types";
import { RouterState } from "../../../state/types";

export function isUsable(w: Worker, config: RouterConfig, state: RouterState): boolean {
  return (
    (w.blockSize === undefined || w.blockSize === config.blockSize) &&
    state.workers.excluded(w.epochKey) === null &&
    state.workers.healthy(w.epochKey)
  );
}

export const usableFilter: Filter = {
  name: "usable",
  profiles: ["prefill", "decode"],
  filter(ctx, workers) {
    const out: Worker[] = [];
    for (let i = 0; i < workers.length; i++) if (isUsable(workers[i], ctx.config, ctx.state)) out.push(workers[i]);
    return out;
  },
};
