// Applies engine KV events (vLLM / SGLang semantics) to a worker's mirror.
// Engine hashes are opaque: we rehash token_ids with our own chained XXH3 and
// keep engine-hash -> our-hash per worker (and per storage tier) so
// BlockRemoved can find its block.
//
// Rules, all documented in docs/kv-events.md:
// - Tiers: each `medium` is its own mirror target (GPU under the epoch key,
//   others under `<ek>|<TIER>`); a removal touches only its tier.
// - KV-cache groups: only the full-attention group is mirrored. A store whose
//   kv_cache_spec_kind / sliding window says otherwise is skipped (never
//   checked against --block-size, never excluding the worker), and a removal
//   applies only when its group_idx is the mirrored one (default 0).
// - Salts: a chain that starts here (parent null) takes a root from the LoRA
//   name and the first block's cache_salt, exactly what requests compute with
//   chainRoot(); multimodal / prompt-embedding blocks are poisoned so no text
//   prompt can ever hit them.
import { chainNext, blockBuffer, Hasher, jsHasher } from "./hash";
import { MirrorIndex } from "./state/types";
import { BlockHash, EngineHash, EpochKey } from "./types";
import { utf8 } from "./util";

/**
 * One entry of extra_keys per block: what the engine folded into that block's
 * hash (LoRA name, multimodal ids as nested arrays, cache_salt, prompt-embedding
 * bytes as { b: hex }). JSON-safe so the bridge can push it to njs.
 */
export type ExtraKeys = (unknown[] | null)[];

export type KvEvent =
  | {
      type: "BlockStored";
      hashes: EngineHash[];
      parent: EngineHash | null;
      tokens: number[];
      blockSize: number;
      loraId?: number | null;
      medium?: string | null;
      loraName?: string | null;
      extraKeys?: ExtraKeys | null;
      groupIdx?: number | null;
      specKind?: string | null;
      slidingWindow?: number | null;
      /**
       * Not from the engine: our chained hash of each block, computed by the
       * bridge (njs/bridge.ts) in Node, and the parent hash its chain started
       * from. applyBatch takes them instead of hashing when oursFrom is the
       * parent it finds itself; else (or when absent) it hashes the tokens.
       */
      ours?: BlockHash[] | null;
      oursFrom?: BlockHash | null;
    }
  | { type: "BlockRemoved"; hashes: EngineHash[]; medium?: string | null; groupIdx?: number | null }
  | { type: "AllBlocksCleared"; medium?: string | null }
  /**
   * Not on the wire: a resync from SGLang's placement snapshot (snapshot-v1).
   * The engine holds exactly these blocks (any tier) as of this batch's seq;
   * the batch's earlier events are the live ones up to that cut.
   */
  | { type: "Snapshot"; hashes: EngineHash[] };

export interface ApplyResult {
  stored: number;
  removed: number;
  cleared: boolean;
  skipped: number;
  /** Blocks of stores from a KV-cache group we do not mirror (sliding window, mamba, ...). */
  otherGroup: number;
  gap: boolean;
  /** Set when the worker must be excluded (block size mismatch). */
  fatal: string | null;
  /** A Snapshot event was applied: blocks kept, and snapshot blocks we never saw stored (no tokens to hash, left out). */
  resync: { kept: number; unknown: number } | null;
}

/** Storage tiers we mirror separately; anything unrecognised is EXTERNAL. */
export const TIERS = ["GPU", "CPU", "DISK", "EXTERNAL"];

/** vLLM/SGLang medium names -> our tier (None means GPU). */
export function tierOf(medium: string | null | undefined): string {
  if (medium === null || medium === undefined || medium === "") return "GPU";
  const m = String(medium).toUpperCase();
  if (m === "GPU" || m === "HBM" || m === "DEVICE") return "GPU";
  if (m.indexOf("CPU") === 0 || m === "HOST" || m === "DRAM") return "CPU";
  if (m.indexOf("DISK") >= 0 || m === "SSD" || m === "FILE" || m === "LOCAL") return "DISK";
  return "EXTERNAL";
}

/** The mirror target holding one tier of a worker. GPU keeps the plain epoch key. */
export function tierKey(ek: EpochKey, tier: string): EpochKey {
  return (tier === "GPU" ? ek : ek + "|" + tier) as EpochKey;
}

/** Parses `gpu=1,cpu=0.75,disk=0.25` (the Dynamo defaults) into tier -> weight. */
export function parseTierWeights(s: string): { [tier: string]: number } {
  const out: { [tier: string]: number } = {};
  const parts = s.split(",");
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i].trim();
    if (!p) continue;
    const eq = p.indexOf("=");
    const w = Number(p.substr(eq + 1));
    if (eq <= 0 || !(w >= 0 && w <= 1))
      throw new Error("--kv-tier-weights: '" + p + "' is not tier=weight with 0 <= weight <= 1");
    out[tierOf(p.substr(0, eq))] = w;
  }
  return out;
}

export function defaultTierWeights(): { [tier: string]: number } {
  return { GPU: 1, CPU: 0.75, DISK: 0.25, EXTERNAL: 0 };
}

/**
 * Root of a block chain for requests and events alike: a LoRA adapter name
 * and vLLM's cache_salt (folded into block 0 only, so the whole chain differs).
 * null for plain base-model prompts, which keeps their hashes unchanged.
 */
export function chainRoot(
  loraName: string | null | undefined,
  cacheSalt: string | null | undefined,
  hasher?: Hasher,
): BlockHash | null {
  if (!loraName && !cacheSalt) return null;
  const h = hasher || jsHasher;
  return h(utf8("infera-root\u0000" + (loraName || "") + "\u0000" + (cacheSalt || ""))) as BlockHash;
}

/** Where the learned full-attention group of a worker is kept (MirrorIndex meta). */
const FULL_GROUP = "full-group";
/** Global meta: adapter names seen in events, so a request for one salts its chain. */
export function adapterMetaKey(name: string): string {
  return "lora:" + name;
}
export const GLOBAL_META = "*" as EpochKey;

function isFullAttention(kind: string | null | undefined, window: number | null | undefined): boolean | null {
  if (window !== null && window !== undefined && window > 0) return false;
  if (kind === null || kind === undefined || kind === "") return null;
  const k = String(kind).toLowerCase();
  return k.indexOf("full") >= 0 || k === "attention" || k === "mla" || k.indexOf("mla_") === 0;
}

function groupOf(v: number | null | undefined): number {
  return v === null || v === undefined ? -1 : v;
}

/** The group index whose blocks we mirror: learned from full-attention stores, else 0. */
function mirroredGroup(mirror: MirrorIndex, ek: EpochKey): number {
  const g = mirror.meta(ek, FULL_GROUP);
  return g === undefined ? 0 : Number(g);
}

/** Splits one block's extra keys into its cache salt and whether it holds non-text content. */
function readExtra(
  keys: unknown[] | null | undefined,
  loraName: string | null | undefined,
): { salt: string | null; nonText: boolean } {
  let salt: string | null = null;
  let nonText = false;
  if (!keys) return { salt: salt, nonText: nonText };
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i];
    if (typeof k === "string") {
      if (loraName && k === loraName) continue;
      salt = salt === null ? k : salt + "\u0000" + k;
    } else if (k !== null && k !== undefined) nonText = true; // (mm id, offset) tuples, embedding bytes
  }
  return { salt: salt, nonText: nonText };
}

function lookupAnyTier(mirror: MirrorIndex, ek: EpochKey, first: string, eh: EngineHash): BlockHash | undefined {
  const p = mirror.lookup(tierKey(ek, first), eh);
  if (p !== undefined) return p;
  for (let i = 0; i < TIERS.length; i++) {
    if (TIERS[i] === first) continue;
    const q = mirror.lookup(tierKey(ek, TIERS[i]), eh);
    if (q !== undefined) return q;
  }
  return undefined;
}

/** Drops every tier of a worker's mirror (AllBlocksCleared without medium, gap, restart). */
export function clearAllTiers(mirror: MirrorIndex, ek: EpochKey): void {
  for (let i = 0; i < TIERS.length; i++) mirror.clear(tierKey(ek, TIERS[i]));
}

export interface ApplyOptions {
  hasher?: Hasher;
  /** Per-target bound on mirrored engine blocks (0 = unbounded); the oldest go first. */
  maxBlocks?: number;
  /** Called with the number of blocks evicted by maxBlocks. */
  onEvict?: (target: EpochKey, n: number) => void;
  /**
   * Called for each BlockStored event applied: its index in the batch, the
   * parent hash its chain started from and our hash of each of its blocks
   * (what the bridge sends njs as ours / oursFrom).
   */
  onChain?: (event: number, from: BlockHash | null, hashes: BlockHash[]) => void;
  /**
   * This batch is part `part` (0-based) of `partOf` parts of engine batch seq,
   * which the bridge cut so that no single push (one step of the nginx
   * worker) applies thousands of blocks (njs/bridge.ts splitBatch). A part
   * after the first must follow the part before it of the same seq (the
   * mirror's OPEN_PART marker), else it is a gap; the sequence moves to seq
   * with the last part, so a batch after an unfinished one is a gap too.
   */
  part?: number;
  partOf?: number;
}

/** Meta of a worker whose split batch is under way: "<seq>:<last part applied>". */
const OPEN_PART = "open-part";

/**
 * Resync to a placement snapshot: keep exactly the mirrored blocks the engine
 * still holds (in whichever tiers we had them), drop the rest. The snapshot
 * carries hashes and parents only, no tokens, so a block we never saw stored
 * cannot be hashed our way: it stays out (counted) until it is stored again.
 */
function retainOnly(mirror: MirrorIndex, ek: EpochKey, hashes: EngineHash[]): { kept: number; unknown: number } {
  const keepT: string[] = [];
  const keepE: EngineHash[] = [];
  const keepB: BlockHash[] = [];
  let unknown = 0;
  for (let i = 0; i < hashes.length; i++) {
    let any = false;
    for (let t = 0; t < TIERS.length; t++) {
      const b = mirror.lookup(tierKey(ek, TIERS[t]), hashes[i]);
      if (b === undefined) continue;
      keepT.push(TIERS[t]);
      keepE.push(hashes[i]);
      keepB.push(b);
      any = true;
    }
    if (!any) unknown++;
  }
  clearAllTiers(mirror, ek);
  let kept = 0;
  for (let i = 0; i < keepE.length; i++) if (mirror.store(tierKey(ek, keepT[i]), keepE[i], keepB[i])) kept++;
  return { kept: kept, unknown: unknown };
}

/**
 * Applies one batch with sequence number seq. A gap (or a restart: seq going
 * backwards) that the transport could not repair clears the mirror first: we
 * resync rather than drift. A batch holding a Snapshot is itself the resync:
 * no gap check, its live events first, then the snapshot's cut.
 */
export function applyBatch(
  mirror: MirrorIndex,
  ek: EpochKey,
  seq: number,
  events: KvEvent[],
  blockSize: number,
  hasherOrOpts?: Hasher | ApplyOptions,
): ApplyResult {
  const opts: ApplyOptions = typeof hasherOrOpts === "function" ? { hasher: hasherOrOpts } : hasherOrOpts || {};
  const h = opts.hasher || jsHasher;
  const res: ApplyResult = {
    stored: 0,
    removed: 0,
    cleared: false,
    skipped: 0,
    otherGroup: 0,
    gap: false,
    fatal: null,
    resync: null,
  };
  const hadSeq = mirror.sequence(ek);
  let snapshot = false;
  for (let i = 0; i < events.length; i++) if (events[i].type === "Snapshot") snapshot = true;
  const part = opts.part || 0;
  const partOf = opts.partOf && opts.partOf > 1 ? opts.partOf : 1;
  const open = mirror.meta(ek, OPEN_PART);
  const follows =
    part > 0 ? open === seq + ":" + (part - 1) : open === undefined && (hadSeq === undefined || seq === hadSeq + 1);
  if (!follows && !snapshot) {
    clearAllTiers(mirror, ek);
    res.gap = true;
  }
  if (part < partOf - 1) mirror.setMeta(ek, OPEN_PART, seq + ":" + part);
  else {
    if (open !== undefined) mirror.setMeta(ek, OPEN_PART, undefined);
    mirror.setSequence(ek, seq);
  }
  const buf = blockBuffer(blockSize);
  for (let i = 0; i < events.length; i++) {
    const ev = events[i];
    if (ev.type === "Snapshot") {
      res.resync = retainOnly(mirror, ek, ev.hashes);
    } else if (ev.type === "AllBlocksCleared") {
      if (ev.medium) mirror.clear(tierKey(ek, tierOf(ev.medium)));
      else clearAllTiers(mirror, ek);
      res.cleared = true;
    } else if (ev.type === "BlockRemoved") {
      const g = groupOf(ev.groupIdx);
      if (g >= 0 && g !== mirroredGroup(mirror, ek)) continue;
      const target = tierKey(ek, tierOf(ev.medium));
      for (let j = 0; j < ev.hashes.length; j++) if (mirror.remove(target, ev.hashes[j])) res.removed++;
    } else if (ev.type === "BlockStored") {
      const full = isFullAttention(ev.specKind, ev.slidingWindow);
      const g = groupOf(ev.groupIdx);
      if (full === true && g >= 0 && mirror.meta(ek, FULL_GROUP) !== String(g))
        mirror.setMeta(ek, FULL_GROUP, String(g));
      if (full === false || (full === null && g >= 0 && g !== mirroredGroup(mirror, ek))) {
        res.otherGroup += ev.hashes.length;
        continue;
      }
      if (ev.blockSize !== blockSize) {
        res.fatal = "block size " + ev.blockSize + " in KV events != router --block-size " + blockSize;
        return res;
      }
      if (ev.tokens.length !== ev.hashes.length * blockSize) {
        res.skipped += ev.hashes.length;
        continue;
      }
      const tier = tierOf(ev.medium);
      const target = tierKey(ek, tier);
      if (ev.loraName) mirror.setMeta(GLOBAL_META, adapterMetaKey(ev.loraName), "1");
      const extra = ev.extraKeys || null;
      let parent: BlockHash | null = null;
      let found = false;
      if (ev.parent !== null && ev.parent !== undefined) {
        const p = lookupAnyTier(mirror, ek, tier, ev.parent);
        if (p !== undefined) {
          parent = p;
          found = true;
        } else if (ev.parent !== "0") {
          // Unknown parent (evicted, or we joined mid-stream): this chain cannot match a prompt.
          res.skipped += ev.hashes.length;
          continue;
        }
        // SGLang-style parent 0 that we never saw stored: the chain starts here.
      }
      if (!found) {
        const first = readExtra(extra ? extra[0] : null, ev.loraName);
        parent = chainRoot(ev.loraName, first.salt, h);
        // Deprecated lora_id without a name: a root no request can produce.
        if (parent === null && ev.loraId !== undefined && ev.loraId !== null)
          parent = h(utf8("lora:" + ev.loraId)) as BlockHash;
      }
      // The bridge's hashes of this chain, when they start where ours does: a
      // chained hash is a function of its start and the tokens, so they are
      // the ones hashing here would give, without the cost of hashing in njs.
      const ours = ev.ours;
      const given =
        ours && ours.length === ev.hashes.length && ev.oursFrom !== undefined && ev.oursFrom === parent ? ours : null;
      const from = parent;
      const chain: BlockHash[] = [];
      for (let j = 0; j < ev.hashes.length; j++) {
        if (given) parent = given[j];
        else {
          if (extra && extra[j] && readExtra(extra[j], ev.loraName).nonText)
            parent = h(
              utf8("infera-nontext\u0000" + (parent || "") + "\u0000" + JSON.stringify(extra[j])),
            ) as BlockHash;
          parent = chainNext(parent, ev.tokens, j * blockSize, blockSize, buf, h);
        }
        chain.push(parent as BlockHash);
      }
      if (mirror.storeRun) res.stored += mirror.storeRun(target, ev.hashes, chain);
      else for (let j = 0; j < chain.length; j++) if (mirror.store(target, ev.hashes[j], chain[j])) res.stored++;
      if (opts.onChain) opts.onChain(i, from, chain);
      if (opts.maxBlocks && opts.maxBlocks > 0) {
        let n = 0;
        while (mirror.entries(target) > opts.maxBlocks && n < 1000000) {
          if (!mirror.evictOldest(target)) break;
          n++;
        }
        if (n && opts.onEvict) opts.onEvict(target, n);
      }
    }
  }
  return res;
}

/** Forgets everything mirrored for a worker (every tier) and its event sequence: it left, or its engine restarted. */
export function forgetMirror(mirror: MirrorIndex, ek: EpochKey): void {
  clearAllTiers(mirror, ek);
  mirror.setSequence(ek, undefined);
  mirror.setMeta(ek, OPEN_PART, undefined);
}

/**
 * Keeps a mirror whose store has a fixed size (nginx's shared-dict zones)
 * within `fit` engine blocks in all, before a batch that stores `incoming`
 * more is applied. It evicts the oldest block of whichever target holds the
 * most, one at a time, so a worker that arrives late gets room from the
 * largest and the targets converge on equal shares, each keeping its newest
 * blocks (the order --max-mirror-blocks evicts in). Returns how many blocks
 * it evicted; bounded by the blocks there were.
 */
export function makeRoom(mirror: MirrorIndex, targets: EpochKey[], incoming: number, fit: number): number {
  const held: number[] = [];
  let total = 0;
  for (let i = 0; i < targets.length; i++) {
    held.push(mirror.entries(targets[i]));
    total += held[i];
  }
  let evicted = 0;
  for (let budget = total; total + incoming > fit && budget > 0; budget--) {
    let big = 0;
    for (let i = 1; i < held.length; i++) if (held[i] > held[big]) big = i;
    if (!held.length || held[big] === 0) break;
    if (mirror.evictOldest(targets[big])) {
      evicted++;
      held[big]--;
      total--;
    } else {
      // a count with no queue behind it: nothing more to evict there
      total -= held[big];
      held[big] = 0;
    }
  }
  return evicted;
}

/** Engine blocks a batch stores (its BlockStored events' hashes): what makeRoom makes room for. */
export function storedIn(events: KvEvent[]): number {
  let n = 0;
  for (let i = 0; i < events.length; i++) {
    const ev = events[i];
    if (ev.type === "BlockStored") n += ev.hashes.length;
  }
  return n;
}

/** Block counts per tier for admin views. */
export function tierCounts(mirror: MirrorIndex, ek: EpochKey): { [tier: string]: number } {
  const out: { [tier: string]: number } = {};
  for (let i = 0; i < TIERS.length; i++) out[TIERS[i]] = mirror.count(tierKey(ek, TIERS[i]));
  return out;
}

/**
 * The chain root of a request: its cache_salt, and its model when that is a
 * LoRA adapter some worker's events named (lora_name), so an adapter request
 * matches that adapter's blocks and a base-model request never does.
 */
export function requestRoot(
  mirror: MirrorIndex,
  model: string,
  cacheSalt: string | null | undefined,
  hasher?: Hasher,
): BlockHash | null {
  const lora = model && mirror.meta(GLOBAL_META, adapterMetaKey(model)) !== undefined ? model : null;
  return chainRoot(lora, cacheSalt, hasher);
}
