// The Node router's mirror index over typed arrays (issue 13). memoryMirror
// keeps two string-keyed Map entries and an array per block: hundreds of bytes
// a block, V8's Map limit at 2^24 entries, and a major GC that walks every key
// (bench/mirror.ts; docs/benchmarks/2026-12-03-mirror-index.md). Here
// every 64-bit hash is two int32s in flat Int32Arrays with open addressing, so
// the heap holds a handful of objects however many blocks are mirrored.
//
// Not part of the njs bundle (Map, closures over growable arrays): njs keeps
// its mirror in shared dicts through state/keyed.ts.
//
// Layout
// - entries (one per engine block on a target): [engHi, engLo, target, block,
//   prev, next, bPrev, bNext]. prev/next chain a target's entries oldest
//   first (evictOldest; clear hands the chain to the graveyard); bPrev/bNext chain every
//   entry holding one block (the block's holders, walked by prefixHits).
// - blocks (one per distinct BlockHash): [hi, lo, head entry]; a block lives
//   while some entry points at it.
// - two linear-probing indexes (Int32Array of ids, -1 empty) with
//   backward-shift deletion, so removals leave no tombstones behind.
// - clear (worker leaves, sequence gap) is O(1) plus a bounded slice of work:
//   the target takes a fresh id, so its old entries stop matching anything
//   at once, and they move to a graveyard that later calls reclaim a few at a
//   time (each store sweeps SWEEP_PER_STORE). Freeing a large target's
//   entries eagerly is a long run of cache misses; this way no pick waits.
//
// Keys: a BlockHash is 16 lowercase hex digits (XXH3-64) and parses exactly;
// anything else (tests, hand-written names) is folded to 64 bits and its text
// kept aside so lookup returns it verbatim. Engine hashes arrive as decimal
// u64 strings (runtime/events.ts hashKey) and parse exactly; other forms
// (hex of ExternalBlockHash bytes) are folded to 64 bits: two such engine
// blocks on one target collide with probability ~2^-64.
import { BlockHash, EngineHash, EpochKey } from "../types";
import { MirrorIndex, prefixRun } from "./types";

interface Target {
  id: number;
  base: string;
  tier: string;
  head: number;
  tail: number;
  /** engine blocks (entries) on this target */
  entries: number;
  /** distinct blocks on this target */
  count: number;
  seq: number | undefined;
  meta: { [name: string]: string };
}

const ES = 8; // entry stride
const BS = 3; // block stride
const MAX_LOAD = 0.7;
/** Graveyard entries reclaimed by each store, and synchronously by clear. */
const SWEEP_PER_STORE = 4;
const SWEEP_ON_CLEAR = 2048;

function mix(a: number, b: number): number {
  let h = Math.imul(a ^ Math.imul(b, 0x9e3779b1), 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

function pow2AtLeast(n: number): number {
  let c = 16;
  while (c < n) c *= 2;
  return c;
}

/** Parsed key halves; module-level so parsing allocates nothing. */
let KH = 0;
let KL = 0;

/** 16 lowercase hex digits -> KH/KL. False for anything else. */
function parseHex16(s: string): boolean {
  if (s.length !== 16) return false;
  let hi = 0;
  let lo = 0;
  for (let i = 0; i < 16; i++) {
    const c = s.charCodeAt(i);
    let d: number;
    if (c >= 48 && c <= 57) d = c - 48;
    else if (c >= 97 && c <= 102) d = c - 87;
    else return false;
    if (i < 8) hi = (hi << 4) | d;
    else lo = (lo << 4) | d;
  }
  KH = hi;
  KL = lo;
  return true;
}

/** Canonical decimal u64 (no sign, no leading zero) -> KH/KL. False otherwise. */
function parseDec64(s: string): boolean {
  const n = s.length;
  if (n === 0 || n > 20) return false;
  if (n > 1 && s.charCodeAt(0) === 48) return false;
  let hi = 0;
  let lo = 0;
  for (let i = 0; i < n; i++) {
    const d = s.charCodeAt(i) - 48;
    if (d < 0 || d > 9) return false;
    lo = lo * 10 + d; // < 2^36: exact in a double
    const carry = Math.floor(lo / 4294967296);
    lo -= carry * 4294967296;
    hi = hi * 10 + carry;
    if (hi > 4294967295) return false;
  }
  KH = hi | 0;
  KL = lo | 0;
  return true;
}

/** Any string -> KH/KL through two independent 32-bit hashes. */
function foldString(s: string): void {
  let a = 0x811c9dc5 ^ s.length;
  let b = 0x2545f491;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
    b ^= b >>> 15;
  }
  KH = mix(a, 0x68e31da4);
  KL = mix(b, a);
}

function hex8(v: number): string {
  const s = (v >>> 0).toString(16);
  return s.length === 8 ? s : "00000000".substr(s.length) + s;
}

export interface TypedMirrorOptions {
  /** Engine blocks to size the tables for up front (avoids growth copies). */
  capacity?: number;
  /** Graveyard entries clear reclaims before returning (default 2048). */
  sweepOnClear?: number;
}

export interface TypedMirror extends MirrorIndex {
  /** Live entries (graveyard included), blocks, graveyard entries and the bytes of the typed arrays. */
  stats(): { entries: number; blocks: number; graveyard: number; bytes: number };
  /** Reclaims up to n entries of cleared targets; returns how many. */
  sweep(n: number): number;
}

export function typedMirror(opts?: TypedMirrorOptions): TypedMirror {
  const initial = Math.max(1024, (opts && opts.capacity) || 0);
  const sweepOnClear = opts && opts.sweepOnClear !== undefined ? opts.sweepOnClear : SWEEP_ON_CLEAR;
  // entries
  let eCap = initial;
  let E = new Int32Array(eCap * ES);
  let eUsed = 0; // high-water mark
  let eFree = -1; // free chain through the next field
  let eLive = 0;
  let eIdx = new Int32Array(pow2AtLeast(Math.ceil(initial / MAX_LOAD))).fill(-1);
  let eMask = eIdx.length - 1;
  // blocks
  let bCap = initial;
  let B = new Int32Array(bCap * BS);
  let bUsed = 0;
  let bFree = -1; // free chain through the head field, encoded -2 - next
  let bLive = 0;
  let bIdx = new Int32Array(pow2AtLeast(Math.ceil(initial / MAX_LOAD))).fill(-1);
  let bMask = bIdx.length - 1;
  /** Text of blocks whose hash is not 16 hex digits (never in production). */
  const names = new Map<number, string>();

  const targets = new Map<EpochKey, Target>();
  /** Target by id; null for a cleared target's old id while its entries wait in the graveyard. */
  const byId: (Target | null)[] = [];
  /** Per old id: graveyard entries still carrying it (the id is reused at 0). */
  const deadLeft: number[] = [];
  const freeIds: number[] = [];
  // graveyard: entries of cleared targets, chained through the next field
  let gHead = -1;
  let gTail = -1;
  let gCount = 0;
  const newId = (t: Target): number => {
    const id = freeIds.length ? (freeIds.pop() as number) : byId.length;
    byId[id] = t;
    deadLeft[id] = 0;
    return id;
  };

  const target = (ek: EpochKey): Target => {
    let t = targets.get(ek);
    if (!t) {
      const bar = ek.indexOf("|");
      t = {
        id: -1,
        base: bar < 0 ? ek : ek.slice(0, bar),
        tier: bar < 0 ? "GPU" : ek.slice(bar + 1),
        head: -1,
        tail: -1,
        entries: 0,
        count: 0,
        seq: undefined,
        meta: {},
      };
      t.id = newId(t);
      targets.set(ek, t);
    }
    return t;
  };

  const eHash = (t: number, hi: number, lo: number) => mix(lo ^ Math.imul(t + 1, 0x27d4eb2d), hi);

  function findEntry(t: number, hi: number, lo: number): number {
    let s = eHash(t, hi, lo) & eMask;
    for (;;) {
      const e = eIdx[s];
      if (e < 0) return -1;
      const o = e * ES;
      if (E[o + 1] === lo && E[o] === hi && E[o + 2] === t) return e;
      s = (s + 1) & eMask;
    }
  }

  function findBlock(hi: number, lo: number): number {
    let s = mix(lo, hi) & bMask;
    for (;;) {
      const b = bIdx[s];
      if (b < 0) return -1;
      const o = b * BS;
      if (B[o + 1] === lo && B[o] === hi) return b;
      s = (s + 1) & bMask;
    }
  }

  function eIndexInsert(e: number): void {
    const o = e * ES;
    let s = eHash(E[o + 2], E[o], E[o + 1]) & eMask;
    while (eIdx[s] >= 0) s = (s + 1) & eMask;
    eIdx[s] = e;
  }

  function bIndexInsert(b: number): void {
    const o = b * BS;
    let s = mix(B[o + 1], B[o]) & bMask;
    while (bIdx[s] >= 0) s = (s + 1) & bMask;
    bIdx[s] = b;
  }

  // Backward-shift deletion: later members of the probe run move up so
  // lookups never need tombstones.
  function eIndexDelete(e: number): void {
    const o = e * ES;
    let i = eHash(E[o + 2], E[o], E[o + 1]) & eMask;
    while (eIdx[i] !== e) i = (i + 1) & eMask;
    let j = i;
    for (;;) {
      j = (j + 1) & eMask;
      const k = eIdx[j];
      if (k < 0) break;
      const ko = k * ES;
      const home = eHash(E[ko + 2], E[ko], E[ko + 1]) & eMask;
      // k may fill the hole at i unless its home lies cyclically in (i, j].
      if (i <= j ? home <= i || home > j : home <= i && home > j) {
        eIdx[i] = k;
        i = j;
      }
    }
    eIdx[i] = -1;
  }

  function bIndexDelete(b: number): void {
    const o = b * BS;
    let i = mix(B[o + 1], B[o]) & bMask;
    while (bIdx[i] !== b) i = (i + 1) & bMask;
    let j = i;
    for (;;) {
      j = (j + 1) & bMask;
      const k = bIdx[j];
      if (k < 0) break;
      const ko = k * BS;
      const home = mix(B[ko + 1], B[ko]) & bMask;
      if (i <= j ? home <= i || home > j : home <= i && home > j) {
        bIdx[i] = k;
        i = j;
      }
    }
    bIdx[i] = -1;
  }

  function growEntries(): void {
    if (eUsed === eCap) {
      eCap = Math.ceil(eCap * 1.5);
      const n = new Int32Array(eCap * ES);
      n.set(E);
      E = n;
    }
    if (eLive + 1 > eIdx.length * MAX_LOAD) {
      eIdx = new Int32Array(eIdx.length * 2).fill(-1);
      eMask = eIdx.length - 1;
      // Rebuild from the chains: every live entry is on one target's or the graveyard's.
      for (let t = 0; t < byId.length; t++) {
        const x = byId[t];
        if (x) for (let e = x.head; e >= 0; e = E[e * ES + 5]) eIndexInsert(e);
      }
      for (let e = gHead; e >= 0; e = E[e * ES + 5]) eIndexInsert(e);
    }
  }

  function growBlocks(): void {
    if (bUsed === bCap) {
      bCap = Math.ceil(bCap * 1.5);
      const n = new Int32Array(bCap * BS);
      n.set(B);
      B = n;
    }
    if (bLive + 1 > bIdx.length * MAX_LOAD) {
      bIdx = new Int32Array(bIdx.length * 2).fill(-1);
      bMask = bIdx.length - 1;
      for (let b = 0; b < bUsed; b++) if (B[b * BS + 2] >= 0) bIndexInsert(b);
    }
  }

  function newBlock(hi: number, lo: number, name: string | null): number {
    growBlocks();
    let b: number;
    if (bFree >= 0) {
      b = bFree;
      bFree = -2 - B[b * BS + 2];
    } else b = bUsed++;
    const o = b * BS;
    B[o] = hi;
    B[o + 1] = lo;
    B[o + 2] = -1; // set by the caller before any scan sees it
    bLive++;
    if (name !== null) names.set(b, name);
    return b;
  }

  function freeBlock(b: number): void {
    bIndexDelete(b);
    B[b * BS + 2] = -2 - bFree;
    bFree = b;
    bLive--;
    if (names.size) names.delete(b);
  }

  /** Does target t hold block b through some entry? */
  function holds(b: number, t: number): boolean {
    for (let e = B[b * BS + 2]; e >= 0; e = E[e * ES + 7]) if (E[e * ES + 2] === t) return true;
    return false;
  }

  /** Unlinks entry e from its block's holders; frees the block when it was the last. */
  function unlinkFromBlock(e: number): number {
    const o = e * ES;
    const b = E[o + 3];
    const p = E[o + 6];
    const n = E[o + 7];
    if (p >= 0) E[p * ES + 7] = n;
    else B[b * BS + 2] = n; // e was the head
    if (n >= 0) E[n * ES + 6] = p;
    return b;
  }

  function freeEntry(e: number): void {
    E[e * ES + 2] = -1;
    E[e * ES + 5] = eFree;
    eFree = e;
    eLive--;
  }

  /** Forgets entry e of target t. True when t no longer holds its block. */
  function drop(t: Target, e: number): boolean {
    const o = e * ES;
    const p = E[o + 4];
    const n = E[o + 5];
    if (p >= 0) E[p * ES + 5] = n;
    else t.head = n;
    if (n >= 0) E[n * ES + 4] = p;
    else t.tail = p;
    eIndexDelete(e);
    const b = unlinkFromBlock(e);
    freeEntry(e);
    t.entries--;
    if (B[b * BS + 2] < 0) {
      freeBlock(b);
      t.count--;
      return true;
    }
    if (holds(b, t.id)) return false;
    t.count--;
    return true;
  }

  function sweep(n: number): number {
    let done = 0;
    while (done < n && gHead >= 0) {
      const e = gHead;
      const o = e * ES;
      gHead = E[o + 5];
      if (gHead < 0) gTail = -1;
      const id = E[o + 2];
      eIndexDelete(e);
      const b = unlinkFromBlock(e);
      freeEntry(e);
      if (B[b * BS + 2] < 0) freeBlock(b);
      if (--deadLeft[id] === 0) freeIds.push(id);
      gCount--;
      done++;
    }
    return done;
  }

  function blockName(b: number): BlockHash {
    const o = b * BS;
    if (names.size) {
      const n = names.get(b);
      if (n !== undefined) return n as BlockHash;
    }
    return (hex8(B[o]) + hex8(B[o + 1])) as BlockHash;
  }

  function engineKey(eh: EngineHash): void {
    if (!parseDec64(eh)) foldString(eh);
  }

  const mirror = {
    store(ek: EpochKey, eh: EngineHash, h: BlockHash): boolean {
      if (gHead >= 0) sweep(SWEEP_PER_STORE);
      const t = target(ek);
      engineKey(eh);
      const ehi = KH;
      const elo = KL;
      const canonical = parseHex16(h);
      if (!canonical) foldString(h);
      const bhi = KH;
      const blo = KL;
      const prev = findEntry(t.id, ehi, elo);
      if (prev >= 0) {
        const pb = E[prev * ES + 3];
        if (B[pb * BS] === bhi && B[pb * BS + 1] === blo) return false;
        drop(t, prev); // the engine re-pointed this hash: move its reference
      }
      let b = findBlock(bhi, blo);
      let fresh: boolean;
      if (b < 0) {
        b = newBlock(bhi, blo, canonical ? null : h);
        bIndexInsert(b);
        fresh = true;
      } else fresh = !holds(b, t.id);
      growEntries();
      let e: number;
      if (eFree >= 0) {
        e = eFree;
        eFree = E[e * ES + 5];
      } else e = eUsed++;
      const o = e * ES;
      E[o] = ehi;
      E[o + 1] = elo;
      E[o + 2] = t.id;
      E[o + 3] = b;
      E[o + 4] = t.tail;
      E[o + 5] = -1;
      if (t.tail >= 0) E[t.tail * ES + 5] = e;
      else t.head = e;
      t.tail = e;
      const head = B[b * BS + 2];
      E[o + 6] = -1;
      E[o + 7] = head;
      if (head >= 0) E[head * ES + 6] = e;
      B[b * BS + 2] = e;
      eIndexInsert(e);
      eLive++;
      t.entries++;
      if (fresh) t.count++;
      return fresh;
    },
    lookup(ek: EpochKey, eh: EngineHash): BlockHash | undefined {
      const t = targets.get(ek);
      if (!t || !t.entries) return undefined;
      engineKey(eh);
      const e = findEntry(t.id, KH, KL);
      return e < 0 ? undefined : blockName(E[e * ES + 3]);
    },
    remove(ek: EpochKey, eh: EngineHash): boolean {
      const t = targets.get(ek);
      if (!t || !t.entries) return false;
      engineKey(eh);
      const e = findEntry(t.id, KH, KL);
      return e < 0 ? false : drop(t, e);
    },
    clear(ek: EpochKey): void {
      const t = targets.get(ek);
      if (!t || t.head < 0) return;
      // The old id stops matching at once (lookups compare ids; prefixHits
      // skips ids without a target); its entries are reclaimed from the graveyard.
      if (gTail >= 0) E[gTail * ES + 5] = t.head;
      else gHead = t.head;
      gTail = t.tail;
      gCount += t.entries;
      deadLeft[t.id] = t.entries;
      byId[t.id] = null;
      t.id = newId(t);
      t.head = t.tail = -1;
      t.entries = 0;
      t.count = 0;
      sweep(sweepOnClear);
    },
    count: (ek: EpochKey): number => {
      const t = targets.get(ek);
      return t ? t.count : 0;
    },
    prefixHits: (
      blocks: BlockHash[],
      live: { [epochKey: string]: boolean },
      weights?: { [tier: string]: number },
    ): { [epochKey: string]: number } =>
      prefixRun(
        blocks.length,
        (i, visit) => {
          const s = blocks[i];
          if (!parseHex16(s)) foldString(s);
          const b = findBlock(KH, KL);
          if (b < 0) return false;
          for (let e = B[b * BS + 2]; e >= 0; e = E[e * ES + 7]) {
            const t = byId[E[e * ES + 2]];
            if (t !== null) visit(t.base, t.tier); // null: a cleared target's entry, not yet reclaimed
          }
          return true;
        },
        live,
        weights,
      ),
    entries: (ek: EpochKey): number => {
      const t = targets.get(ek);
      return t ? t.entries : 0;
    },
    evictOldest(ek: EpochKey): boolean {
      const t = targets.get(ek);
      if (!t || t.head < 0) return false;
      drop(t, t.head);
      return true;
    },
    meta: (ek: EpochKey, name: string): string | undefined => {
      const t = targets.get(ek);
      return t ? t.meta[name] : undefined;
    },
    setMeta(ek: EpochKey, name: string, value: string | undefined): void {
      if (value === undefined) {
        const t = targets.get(ek);
        if (t) delete t.meta[name];
      } else target(ek).meta[name] = value;
    },
    sequence: (ek: EpochKey): number | undefined => {
      const t = targets.get(ek);
      return t ? t.seq : undefined;
    },
    setSequence(ek: EpochKey, seq: number | undefined): void {
      if (seq === undefined && !targets.has(ek)) return;
      target(ek).seq = seq;
    },
    /** Live entries and blocks, and the bytes the typed arrays take. */
    stats() {
      return {
        entries: eLive,
        blocks: bLive,
        graveyard: gCount,
        bytes: E.byteLength + B.byteLength + eIdx.byteLength + bIdx.byteLength,
      };
    },
    sweep,
  };
  return mirror;
}
