// Prefill admission (core/admission.ts): a cold prompt waits at the router
// while its prefill worker already has --prefill-admission-slots cold prefills
// without a first token; warm prompts go at once. Waiters go by priority band,
// then fairly across flows; bounded queues, eviction by a higher band
// and late binding are core/admission.ts's (flow control).
import { Admitter } from "../../framework";
import { admitsAtOnce } from "../../../admission";

export const prefillAdmitter: Admitter = {
  name: "prefill-admission",
  enter: (ctx, go, evicted) =>
    ctx.queue.enter(
      ctx.worker,
      ctx.uncachedTokens,
      go,
      { priority: ctx.objective.priority, flow: ctx.objective.flow, bytes: ctx.bytes },
      evicted,
      ctx.move,
    ),
  // Warm, or admission off: enter() admits it before returning, holding nothing.
  passes: (ctx) => admitsAtOnce(ctx.queue.config, ctx.uncachedTokens),
  // A cold prompt its worker has a free slot for, with nobody waiting ahead: enter() gives it the slot.
  admitsNow: (ctx) => !ctx.queue.wouldWait(ctx.worker, ctx.uncachedTokens, ctx.objective.flow),
};
