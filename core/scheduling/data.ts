// The data stage: for every candidate that passed the filters, what several
// plugins need, computed once per profile run before any scorer (the
// Inference Extension calls these data producers). Scorers, pickers, the
// load reservation, admission and shedding all read Row.data; nothing after
// this stage writes it. Costly reads (the mirror's prefix walk, the in-flight
// prefix) happen only when the request has blocks.
import { CandidateData, overlapWeight, PickContext, Row, usesImageAffinity } from "./framework";
import { EpochKey, Worker } from "../types";

export function produce(ctx: PickContext, pool: Worker[]): Row[] {
  const rows: Row[] = [];
  if (!pool.length) return rows;
  const f = ctx.features;
  const load = ctx.state.load;
  const images = usesImageAffinity(ctx);
  const eks: EpochKey[] = [];
  const live: { [ek: string]: boolean } = {};
  for (let i = 0; i < pool.length; i++) {
    eks.push(pool[i].epochKey);
    live[pool[i].epochKey] = true;
  }
  // Leading request blocks in flight on each worker: prefill side only (a
  // decode worker's cache is what was transferred to it and reported, and
  // decode load stays whole), and not under pure load balance (weight 0).
  const inflight: { [ek: string]: number } =
    f.blocks.length && ctx.profile === "prefill" && overlapWeight(ctx) > 0 ? load.activePrefix(f.blocks, eks) : {};
  // Of those, the blocks still queued for prefill there.
  const queued: { [ek: string]: number } = f.blocks.length ? load.queuedShared(f.blocks, inflight) : {};
  // The cached prefix: what KV events reported (a lower tier earns its --kv-tier-weights
  // share of a GPU hit), or what requests in flight there hold, whichever is longer.
  const cached: { [ek: string]: number } =
    f.blocks.length && !images ? ctx.state.mirror.prefixHits(f.blocks, live, ctx.config.kvTierWeights) : {};
  const slow: { [ek: string]: number } = ctx.latency ? ctx.latency.slowness(eks) : {};
  const engine = ctx.state.engine;
  for (let i = 0; i < pool.length; i++) {
    const ek = eks[i];
    const d: CandidateData = {
      hits: images ? 0 : Math.max(cached[ek] || 0, inflight[ek] || 0),
      inflight: inflight[ek] || 0,
      cached: images ? 0 : cached[ek] || 0,
      queuedShared: queued[ek] || 0,
      imageHits: images ? ctx.state.images.hits(ek, f.mediaHashes) : 0,
      active: load.activeBlocks(ek),
      pending: load.pendingBlocks(ek),
      held: load.heldGuards(ek),
      slowness: slow[ek] || 1,
      capacityBlocks: null,
      kvUsage: null,
      waitingRequests: null,
    };
    const r = engine ? engine.get(ek) : null;
    if (r) {
      d.capacityBlocks = r.capacityBlocks;
      d.kvUsage = r.kvUsage;
      d.waitingRequests = r.waitingRequests;
    }
    rows.push({ worker: pool[i], cost: 0, hits: images ? d.imageHits : d.hits, active: d.active, data: d, terms: {} });
  }
  return rows;
}
