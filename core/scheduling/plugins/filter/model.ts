// Only workers serving the request's model (rules in core/models.ts).
import { Filter } from "../../framework";
import { eligible } from "../../../models";

export const modelFilter: Filter = {
  name: "model",
  profiles: ["prefill", "decode"],
  filter(ctx, workers) {
    return eligible(ctx.state.models, workers, ctx.fleet, ctx.features.model);
  },
};
