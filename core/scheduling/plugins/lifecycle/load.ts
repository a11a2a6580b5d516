// Load accounting as lifecycle hooks. After the pick: the request's blocks are
// held on its target (and on the prefill worker under PD), and its uncached
// blocks are queued prefill on the prefill target. At the first token the
// queued prefill is done (and, in first-token mode, the PD prefill worker's
// part). At completion everything still held goes back. On a decode-first
// path (--pd-decider) the decode worker is the prefill side and no prefill
// worker holds anything.
import { demandN, LifecyclePlugin, prefillSide } from "../../framework";

export const loadReservation: LifecyclePlugin = {
  name: "load-reservation",
  preRequest(ctx, result) {
    const f = ctx.features;
    const load = ctx.state.load;
    const side = prefillSide(result);
    const prefill = side.worker;
    const media = f.mediaHashes.length > 0 && ctx.config.policy === "kv-aware";
    const uncached = media ? f.blocks.length : f.blocks.length - side.data.hits;
    // The queued blocks themselves, so that a later request sharing them can tell (queued-shared.ts).
    const queued = media ? f.blocks : f.blocks.slice(Math.floor(side.data.hits));
    result.guards.queued =
      uncached > 0 ? load.hold(prefill.epochKey, queued, 0, 0, uncached, f.blocks.length - queued.length) : null;
    if (!result.decode) {
      result.guards.main = load.hold(prefill.epochKey, f.blocks, 0, 0);
      return;
    }
    const demandOn = ctx.config.decodeInputDemand !== "off";
    // Decode-first: no prefill worker takes part, so nothing is held on one.
    result.guards.prefill = result.decodeFirst ? null : load.hold(prefill.epochKey, f.blocks, 0, 0);
    result.guards.main = load.hold(
      result.decode.worker.epochKey,
      f.blocks,
      demandOn ? f.inputTokens * demandN(f) : 0,
      demandOn ? 1 : 0,
    );
  },
  firstToken(result, release) {
    release(result.guards.queued);
    if (result.config.pdPrefillGuardRelease === "first-token") release(result.guards.prefill);
  },
  complete(result, release) {
    release(result.guards.queued);
    release(result.guards.prefill);
    release(result.guards.main);
  },
};
