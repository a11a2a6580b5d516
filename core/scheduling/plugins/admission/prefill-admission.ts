// Prefill admission (core/admission.ts): a cold prompt waits at the router
// while its prefill worker already has --prefill-admission-slots cold prefills
// without a first token; warm prompts go at once. Waiters go by priority band,
// then fairly across flows.
import { Admitter } from "../../framework";

export const prefillAdmitter: Admitter = {
  name: "prefill-admission",
  enter: (ctx, go) => ctx.queue.enter(ctx.worker, ctx.uncachedTokens, go, ctx.objective),
};
