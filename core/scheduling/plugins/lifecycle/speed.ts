// Speed learning (core/latency.ts) as lifecycle hooks. After the pick: the
// prefill work the request waits for on its worker (prefill queued there plus
// its own uncached tokens), its own prefill's attention over its cached
// prefix, the requests already running there, and the time.
// At the first token: one observation. When the request leaves for its
// worker, the replica of the worker's scheduler (core/twin.ts) predicts its
// time to first token and takes it into its queue; at the first token it
// learns the worker's step time, and at the end drops it. Each later chunk of
// the stream marks a step's end there: the replica's decode phase.
// Disaggregated picks teach nothing (their first token also waits for the KV
// transfer and the decode worker), nor do picks whose worker is not the one
// that prefilled alone.
import { CandidateData, LifecyclePlugin, PickContext, PickResult } from "../../framework";
import { attentionWork } from "../../../latency";
import { StepTwin } from "../../../twin";
import { EpochKey } from "../../../types";

/** What the speed model reads for a request on a candidate: prefill tokens it waits for (its own included), running requests, its attention work. */
export function ttftInputs(
  ctx: PickContext,
  d: Pick<CandidateData, "hits" | "pending" | "held">,
): { tokens: number; running: number; attention: number; queued: number; own: number; cached: number } {
  const bs = ctx.config.blockSize;
  const own = Math.max(0, ctx.features.inputTokens - d.hits * bs);
  const cached = Math.min(ctx.features.inputTokens, d.hits * bs);
  return {
    tokens: d.pending * bs + own,
    running: d.held,
    attention: attentionWork(own, cached),
    queued: d.pending * bs,
    own: own,
    cached: cached,
  };
}

/**
 * Predicted time to first token of the request on a candidate: the
 * scheduler replica's (core/twin.ts), or while it has not learned the
 * worker, the speed model's; null when neither has.
 */
export function predictTtft(
  ctx: PickContext,
  worker: EpochKey,
  d: Pick<CandidateData, "hits" | "pending" | "held" | "cached">,
): number | null {
  const model = ctx.latency;
  if (!model) return null;
  let p: number | null = null;
  if (model.twin) {
    const c = twinCached(ctx, model.twin, worker, d.cached);
    p = model.twin.predict(worker, ctx.features.inputTokens - c, c, ctx.now());
  }
  if (p !== null) return p;
  const x = ttftInputs(ctx, d);
  return model.predict(worker, x.tokens, x.running, x.attention, x.queued);
}

/**
 * The prompt tokens the engine will find cached, for the replica: what its
 * KV events reported, or the prefix a request the replica has in that
 * engine shares (core/twin.ts sharedPrefix), whichever is longer. Not the
 * ledger's in-flight prefix: its holder may still wait at the router, and
 * then the engine computes it again. Whole blocks, one token left to compute.
 */
function twinCached(ctx: PickContext, twin: StepTwin, worker: EpochKey, cached: number): number {
  const f = ctx.features;
  const blocks = Math.max(cached, f.blocks.length ? twin.sharedPrefix(worker, f.blocks) : 0);
  return Math.max(0, Math.min(f.inputTokens - 1, blocks * ctx.config.blockSize));
}

/** The load guards this request holds on its worker (load-reservation: the main one, and its queued prefill until the first token). */
function ownGuards(result: PickResult): number {
  const g = result.guards;
  return (g.main && !g.main.done ? 1 : 0) + (g.queued && !g.queued.done ? 1 : 0);
}

export const speedLearning: LifecyclePlugin = {
  name: "speed-learning",
  preRequest(ctx, result) {
    if (!ctx.latency || result.decode || ctx.features.mediaHashes.length) return;
    const model = ctx.latency;
    const x = ttftInputs(ctx, result.prefill.data);
    const d = result.prefill.data;
    const ek = result.prefill.worker.epochKey;
    const timing: NonNullable<PickResult["timing"]> = {
      model: ctx.latency,
      now: ctx.now,
      worker: result.prefill.worker.epochKey,
      tokens: x.tokens,
      running: x.running,
      attention: x.attention,
      queued: x.queued,
      start: ctx.now(),
      refresh: function (waited) {
        let y = x;
        if (waited) {
          // After a wait at the router the worker's queue is what is left of
          // it: guards held now, less this request's own; its prefix may have
          // been computed meanwhile (the KV events of the prefill it waited for).
          const live: { [ek: string]: boolean } = {};
          live[ek] = true;
          const cachedNow = ctx.features.blocks.length
            ? ctx.state.mirror.prefixHits(ctx.features.blocks, live, ctx.config.kvTierWeights)[ek] || 0
            : 0;
          y = ttftInputs(ctx, {
            hits: Math.max(d.hits, cachedNow),
            pending: 0,
            held: Math.max(0, ctx.state.load.heldGuards(ek) - ownGuards(result)),
          });
        }
        // Queued prefill ahead in the engine, in tokens: what was sent there
        // and has no first token yet. The ledger's pending blocks also count
        // requests still waiting at the router, which are not ahead of this one.
        const own = y.tokens - y.queued;
        const ahead = model.inEngine(ek);
        if (model.twin) {
          // What the engine will find cached: the KV events' prefix (read
          // again after a wait at the router), or a prefix it is computing.
          const at = ctx.now();
          let mirrored = d.cached;
          if (waited && ctx.features.blocks.length) {
            const live: { [ek: string]: boolean } = {};
            live[ek] = true;
            mirrored = Math.max(
              mirrored,
              ctx.state.mirror.prefixHits(ctx.features.blocks, live, ctx.config.kvTierWeights)[ek] || 0,
            );
          }
          const c = twinCached(ctx, model.twin, ek, mirrored);
          const n = ctx.features.inputTokens - c;
          timing.predicted = model.twin.predict(ek, n, c, at);
          timing.entry = model.twin.sent(ek, n, c, at, ctx.features.blocks);
          timing.entry.predicted = timing.predicted;
        }
        timing.tokens = own + ahead;
        timing.queued = ahead;
        timing.running = y.running;
        timing.attention = y.attention;
        timing.own = own;
        model.sent(ek, own);
      },
    };
    result.timing = timing;
  },
  firstToken(result) {
    const t = result.timing;
    if (!t) return;
    if (t.own !== undefined) t.model.sent(t.worker, -t.own);
    t.own = undefined;
    const at = t.now();
    if (t.entry && t.model.twin) t.model.twin.first(t.entry, at);
    const p = t.predicted;
    t.model.observe(
      t.worker,
      t.tokens,
      t.running,
      at - t.start,
      t.attention,
      t.queued,
      p !== undefined && p !== null ? p : undefined,
      t.entry,
    );
  },
  chunk(result) {
    // A step of the worker ended: the replica's decode phase.
    const t = result.timing;
    if (t && t.model.twin) t.model.twin.tick(t.worker, t.now());
  },
  complete(result) {
    // Ended before its first token (cancelled, failed): its prefill is no longer ahead of anyone.
    const t = result.timing;
    if (t && t.own !== undefined) t.model.sent(t.worker, -t.own);
    if (t) t.own = undefined;
    if (t && t.entry && t.model.twin) t.model.twin.ended(t.entry, t.now());
  },
};
