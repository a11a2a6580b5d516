// Objectives (core/objectives.ts): a sheddable request (priority < 0) whose
// worker has no free prefill slot is refused now with a time to come back,
// rather than wait; anything of priority 0 or more waits its band's turn in
// prefill admission instead.
import { Refusal, Shedder } from "../../framework";

/** The answer to a sheddable request refused because its worker is busy (also given before the pick, when that is already certain). */
export function sheddableRefusal(priority: number): Refusal {
  return {
    status: 429,
    message: "the workers are saturated; sheddable request refused, retry later",
    type: "rate_limited",
    headers: { "retry-after": "1" },
    log: null,
    shedPriority: priority,
  };
}

export const objectiveShedder: Shedder = {
  name: "objective-sheddable",
  shed(ctx) {
    if (
      ctx.objective.priority >= 0 ||
      !ctx.queue.wouldWait(ctx.worker, ctx.uncachedTokens, ctx.objective.flow, ctx.objective.priority)
    )
      return null;
    return sheddableRefusal(ctx.objective.priority);
  },
};
