// Router state behind small interfaces. Node runs the Map/Set backend
// (state/memory.ts); njs keeps everything in js_shared_dict_zone through the
// key-encoded backend (state/keyed.ts). Both pass test/unit/state.test.ts.
import { BlockHash, EngineHash, EpochKey, Guard, SessionBinding, Worker, WorkerSpec } from "../types";
import type { ModelTable } from "../models";
import type { LoraTable } from "../lora";
import type { EngineReadings } from "../engine-readings";

/** Which blocks each worker's engine holds, as reported by its KV events. */
export interface MirrorIndex {
  /** Records that engine block engineHash on epochKey is our blockHash. True when blockHash is new there. */
  store(epochKey: EpochKey, engineHash: EngineHash, blockHash: BlockHash): boolean;
  /**
   * store() of a run of blocks, in order (one BlockStored event): how many
   * block hashes are new there. Optional: a backend whose writes cost a
   * round trip each (the shared dicts) books the run's counters once.
   */
  storeRun?(epochKey: EpochKey, engineHashes: EngineHash[], blockHashes: BlockHash[]): number;
  /** Our hash for an engine hash, if mirrored. */
  lookup(epochKey: EpochKey, engineHash: EngineHash): BlockHash | undefined;
  /** Forgets one engine block. True when its blockHash is no longer held there. */
  remove(epochKey: EpochKey, engineHash: EngineHash): boolean;
  /** Drops everything mirrored for epochKey (AllBlocksCleared, sequence gap, worker leave). */
  clear(epochKey: EpochKey): void;
  /**
   * Optional, for a backend whose clear of a large mirror is deferred (the
   * shared dicts: core/state/keyed.ts): removes up to about n blocks of
   * mirrors cleared earlier and returns the work done. Cleared blocks are
   * out of every answer before they are swept; they only take room.
   */
  sweep?(n: number): number;
  /** Engine blocks of cleared mirrors not yet swept (the room they take). */
  unswept?(): number;
  /** Distinct blocks held by epochKey. */
  count(epochKey: EpochKey): number;
  /**
   * Longest cached prefix of blocks for each live epoch key (O(request blocks)).
   * Without weights only the GPU target (the plain epoch key) counts. With
   * tier weights, a block counts the best weight among the tiers holding it
   * (targets `<ek>|<TIER>`, see core/kvevents.ts tierKey) and the prefix runs
   * while some tier with a weight > 0 holds the next block.
   */
  prefixHits(
    blocks: BlockHash[],
    live: { [epochKey: string]: boolean },
    weights?: { [tier: string]: number },
  ): { [epochKey: string]: number };
  /** Engine blocks mirrored for a target (>= count: several engine blocks may share one hash). */
  entries(epochKey: EpochKey): number;
  /** Forgets the engine block mirrored longest ago on a target (the --max-mirror-blocks bound). False when empty. */
  evictOldest(epochKey: EpochKey): boolean;
  /** Small per-worker facts learned from events (e.g. the full-attention group); "*" for global ones. */
  meta(epochKey: EpochKey, name: string): string | undefined;
  setMeta(epochKey: EpochKey, name: string, value: string | undefined): void;
  /** Last applied event sequence number for epochKey, if any. */
  sequence(epochKey: EpochKey): number | undefined;
  setSequence(epochKey: EpochKey, seq: number | undefined): void;
}

/** In-flight load: distinct prompt blocks, input tokens and requests per worker epoch. */
export interface LoadLedger {
  /**
   * Books load; shared prefixes count once per worker. pending = blocks queued
   * for prefill: a guard with pending > 0 is a queued-prefill guard, and its
   * blocks (if given) are those queued blocks, booked as queued, not as held.
   * from: the position of blocks[0] in the request (a queued guard's blocks are
   * its uncached tail); only the key-encoded backend uses it.
   */
  hold(
    epochKey: EpochKey,
    blocks: BlockHash[],
    tokens: number,
    requests: number,
    pending?: number,
    from?: number,
  ): Guard;
  /**
   * Holds the load of g on another worker (failover, served elsewhere), for
   * backends whose guards are compact (Guard.at); absent: hold(g.blocks, ...).
   */
  holdLike?(epochKey: EpochKey, g: Guard): Guard;
  /** Gives a guard's load back. Callers make it happen once (Guard.done or an atomic pop). */
  release(g: Guard): void;
  activeBlocks(epochKey: EpochKey): number;
  /** Guards held on the worker: in-flight requests, whether or not they hold blocks. */
  heldGuards(epochKey: EpochKey): number;
  /** Prefill work queued on the worker: uncached blocks of requests before their first token. */
  pendingBlocks(epochKey: EpochKey): number;
  /**
   * For each worker, how many leading request blocks are in flight there: a
   * request routed a moment ago is in that worker's KV cache before any event says so.
   */
  activePrefix(blocks: BlockHash[], epochKeys: EpochKey[]): { [epochKey: string]: number };
  /**
   * For each worker, how many of the request's first upto[ek] blocks are queued
   * for prefill there by requests already routed (computed once, for all of them).
   */
  queuedShared(blocks: BlockHash[], upto: { [epochKey: string]: number }): { [epochKey: string]: number };
  demand(epochKey: EpochKey): { tokens: number; requests: number };
  /** Guards still held across all workers. */
  openGuards(): number;
}

/** The fleet: workers with their epoch, health and exclusion. */
export interface WorkerRegistry {
  list(): Worker[];
  get(id: string): Worker | null;
  /** Adds a worker under a fresh epoch key (the caller removes an older entry first). */
  add(spec: WorkerSpec): Worker;
  remove(id: string): Worker | null;
  setHealthy(epochKey: EpochKey, ok: boolean): void;
  healthy(epochKey: EpochKey): boolean;
  exclude(epochKey: EpochKey, reason: string): void;
  /** Why a worker is out of every pool, or null. */
  excluded(epochKey: EpochKey): string | null;
  /** Per-worker bookkeeping that goes with an epoch (health, exclusion). */
  forget(epochKey: EpochKey): void;
}

/** Session id -> where its requests went; bounded. */
export interface SessionTable {
  get(sessionId: string): SessionBinding | null;
  bind(sessionId: string, b: SessionBinding): void;
  size(): number;
}

/** Per-worker most-recently-used media hashes. */
export interface ImageAffinity {
  /** Marks hashes as just used on epochKey, keeping at most cap (most recent last). */
  touch(epochKey: EpochKey, hashes: string[], cap: number): void;
  hits(epochKey: EpochKey, hashes: string[]): number;
  list(epochKey: EpochKey): string[];
  drop(epochKey: EpochKey): void;
}

export interface RouterState {
  workers: WorkerRegistry;
  mirror: MirrorIndex;
  load: LoadLedger;
  sessions: SessionTable;
  images: ImageAffinity;
  /** Monotonic counters shared by every VM (round-robin position). */
  next(counter: string): number;
  /** Which models each worker serves (core/models.ts); absent = no model routing. */
  models?: ModelTable;
  /** Each worker's LoRA adapters (core/lora.ts), scraped from /metrics; absent = no LoRA routing. */
  lora?: LoraTable;
  /** Each worker's KV capacity and headroom from its engine's /metrics (core/engine-readings.ts); absent = none known. */
  engine?: EngineReadings;
}

/** The optional spec fields a registered worker keeps (replay endpoint, DP rank, engine), present only when set. */
export function copyEventFields(spec: WorkerSpec, w: Worker): void {
  if (spec.replay !== undefined) w.replay = spec.replay;
  if (spec.snapshot !== undefined) w.snapshot = spec.snapshot;
  if (spec.dpRank !== undefined) w.dpRank = spec.dpRank;
  if (spec.dpEvents !== undefined) w.dpEvents = spec.dpEvents;
  if (spec.engine !== undefined) w.engine = spec.engine;
}

/**
 * MirrorIndex.prefixHits over any backend: holdersOf(i, visit) calls
 * visit(base epoch key, tier) for each target holding block i and returns
 * false when none does. A block counts the best tier weight per worker, and a
 * worker's run ends at the first block it does not hold (a later block it
 * holds is no hit: its prefix differs).
 */
export function prefixRun(
  count: number,
  holdersOf: (i: number, visit: (base: string, tier: string) => void) => boolean,
  live: { [epochKey: string]: boolean },
  weights?: { [tier: string]: number },
): { [epochKey: string]: number } {
  const hits: { [ek: string]: number } = {};
  let cand: { [ek: string]: boolean } | null = null;
  for (let i = 0; i < count; i++) {
    const best: { [ek: string]: number } = {};
    let any = false;
    const prev = cand;
    const held = holdersOf(i, (base, tier) => {
      // Without weights only the GPU tier counts.
      let w = tier === "GPU" ? 1 : 0;
      if (weights) {
        const x = weights[tier];
        w = x === undefined ? 0 : x;
      }
      if (w <= 0 || !live[base] || (prev !== null && !prev[base])) return;
      if (!(best[base] >= w)) best[base] = w;
      any = true;
    });
    if (!held || !any) break;
    const next: { [ek: string]: boolean } = {};
    for (const ek in best) {
      hits[ek] = (hits[ek] || 0) + best[ek];
      next[ek] = true;
    }
    cand = next;
  }
  return hits;
}

/** A mirror target `<ek>` or `<ek>|<TIER>` (core/kvevents.ts tierKey) as (base, tier). */
export function visitTarget(t: string, visit: (base: string, tier: string) => void): void {
  const bar = t.indexOf("|");
  if (bar < 0) visit(t, "GPU");
  else visit(t.substr(0, bar), t.substr(bar + 1));
}

/** Past this many sessions the table starts over (a session then simply picks afresh). */
export const MAX_SESSIONS = 100000;
