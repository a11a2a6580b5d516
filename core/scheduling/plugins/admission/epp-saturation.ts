// EPP saturation shedding (--epp-shed-active-blocks, --epp-sheddable-objectives):
// a request of a sheddable objective is refused with 429 when every candidate
// of its pool already holds at least the threshold of active blocks, as the
// Inference Extension's saturation detector drops sheddable requests. Reads
// the objective header as sent (the gateway sets it on this path).
import { Shedder } from "../../framework";
import { OBJECTIVE_HEADER } from "../../../objectives";

export const eppSaturationShedder: Shedder = {
  name: "epp-saturation",
  shed(ctx) {
    const at = ctx.settings.eppShedActiveBlocks;
    if (!(at > 0)) return null;
    const objective = ctx.header(OBJECTIVE_HEADER) || "";
    if (ctx.settings.eppSheddableObjectives.indexOf(objective) < 0) return null;
    for (let i = 0; i < ctx.pool.length; i++) if (ctx.pool[i].active < at) return null;
    return {
      status: 429,
      message: "all endpoints are saturated; sheddable request dropped",
      type: "rate_limited",
      log: "shed a '" + objective + "' request: every candidate holds >= " + at + " active blocks",
    };
  },
};
