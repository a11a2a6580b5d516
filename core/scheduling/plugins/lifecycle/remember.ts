// After a pick: the prefill worker now holds the request's images, and the
// session remembers where it went.
import { LifecyclePlugin, prefillSide } from "../../framework";
import { SessionBinding } from "../../../types";

export const imageTouch: LifecyclePlugin = {
  name: "image-touch",
  preRequest(ctx, result) {
    if (ctx.features.mediaHashes.length)
      ctx.state.images.touch(prefillSide(result).worker.epochKey, ctx.features.mediaHashes, ctx.config.mmLruSize);
  },
};

export const sessionBind: LifecyclePlugin = {
  name: "session-bind",
  preRequest(ctx, result) {
    if (!ctx.session || !ctx.sessionId) return;
    const b: SessionBinding = { prefill: result.prefill.worker.epochKey };
    if (result.decode && ctx.config.sessionAffinity === "both") b.decode = result.decode.worker.epochKey;
    ctx.state.sessions.bind(ctx.sessionId, b);
  },
};
