// Router state in Maps and Sets, for the Node process (ext_proc server, tests).
// Not part of the njs bundle (njs has no Map/Set); njs uses state/keyed.ts.
import { BlockHash, EngineHash, EpochKey, SessionBinding, Worker } from "../types";
import {
  copyEventFields,
  ImageAffinity,
  LoadLedger,
  MAX_SESSIONS,
  MirrorIndex,
  prefixRun,
  RouterState,
  SessionTable,
  visitTarget,
  WorkerRegistry,
} from "./types";
import { typedMirror } from "./typed-mirror";
import { generations, Generations } from "./generations";

interface Held {
  /** engine hash -> our hash */
  byEngine: Map<EngineHash, BlockHash>;
  /** Where evictOldest left off. */
  oldest?: Iterator<EngineHash>;
  /** our hash -> engine blocks that map to it */
  refs: Map<BlockHash, number>;
  seq: number | undefined;
  meta: { [name: string]: string };
}

/**
 * The first Node mirror: string-keyed Maps. Kept as the reference the typed
 * index (state/typed-mirror.ts, the default) is compared with in tests and
 * bench/mirror.ts; it costs several times the typed index's bytes a block and its
 * ingest slows as its Maps grow (docs/benchmarks/2026-12-03-mirror-index.md).
 */
export function memoryMirror(): MirrorIndex {
  const holders = new Map<BlockHash, EpochKey[]>();
  const targets = new Map<EpochKey, Held>();
  const held = (ek: EpochKey): Held => {
    let h = targets.get(ek);
    if (!h) targets.set(ek, (h = { byEngine: new Map(), refs: new Map(), seq: undefined, meta: {} }));
    return h;
  };
  const dropHolder = (h: BlockHash, ek: EpochKey) => {
    const list = holders.get(h);
    if (!list) return;
    const i = list.indexOf(ek);
    if (i >= 0) list.splice(i, 1);
    if (!list.length) holders.delete(h);
  };
  const mirror: MirrorIndex = {
    store(ek, eh, h) {
      const t = held(ek);
      const prev = t.byEngine.get(eh);
      if (prev === h) return false;
      if (prev !== undefined) mirror.remove(ek, eh);
      t.byEngine.set(eh, h);
      const n = (t.refs.get(h) ?? 0) + 1;
      t.refs.set(h, n);
      if (n > 1) return false;
      const list = holders.get(h);
      if (list) list.push(ek);
      else holders.set(h, [ek]);
      return true;
    },
    lookup: (ek, eh) => targets.get(ek)?.byEngine.get(eh),
    remove(ek, eh) {
      const t = targets.get(ek);
      const h = t?.byEngine.get(eh);
      if (!t || h === undefined) return false;
      t.byEngine.delete(eh);
      const n = (t.refs.get(h) ?? 0) - 1;
      if (n > 0) {
        t.refs.set(h, n);
        return false;
      }
      t.refs.delete(h);
      dropHolder(h, ek);
      return true;
    },
    clear(ek) {
      const t = targets.get(ek);
      if (!t) return;
      // Cost: the blocks this worker held, never the whole index.
      for (const h of t.refs.keys()) dropHolder(h, ek);
      targets.set(ek, { byEngine: new Map(), refs: new Map(), seq: t.seq, meta: t.meta });
    },
    count: (ek) => targets.get(ek)?.refs.size ?? 0,
    prefixHits: (blocks, live, weights) =>
      prefixRun(
        blocks.length,
        (i, visit) => {
          const list = holders.get(blocks[i]);
          if (!list) return false;
          for (const t of list) visitTarget(t, visit);
          return true;
        },
        live,
        weights,
      ),
    entries: (ek) => targets.get(ek)?.byEngine.size ?? 0,
    evictOldest(ek) {
      const t = targets.get(ek);
      if (!t) return false;
      // The iterator lives across calls: a fresh one would re-walk every slot
      // deleted since V8 last rehashed the Map, quadratic under steady eviction.
      let first = t.oldest ? t.oldest.next() : { done: true as const, value: undefined };
      if (first.done) {
        t.oldest = t.byEngine.keys();
        first = t.oldest.next();
      }
      if (first.done) return false;
      mirror.remove(ek, first.value);
      return true;
    },
    meta: (ek, name) => targets.get(ek)?.meta[name],
    setMeta(ek, name, value) {
      if (value === undefined) {
        const t = targets.get(ek);
        if (t) delete t.meta[name];
      } else held(ek).meta[name] = value;
    },
    sequence: (ek) => targets.get(ek)?.seq,
    setSequence(ek, seq) {
      if (seq === undefined && !targets.has(ek)) return;
      held(ek).seq = seq;
    },
  };
  return mirror;
}

export function memoryLedger(): LoadLedger {
  // A released block keeps its key at count 0 instead of being deleted: the
  // same hot prefix is held and released by every request, and V8 keeps a
  // deleted key in its hash chain until the Map rehashes, so delete + set of
  // one key made each later lookup of it longer. Zeros (blocks.size - live)
  // are swept once they outnumber the live blocks.
  const per = new Map<
    EpochKey,
    {
      blocks: Map<BlockHash, number>;
      queued: Map<BlockHash, number>;
      live: number;
      tokens: number;
      requests: number;
      pending: number;
      guards: number;
    }
  >();
  let open = 0;
  return {
    hold(ek, blocks, tokens, requests, pending = 0) {
      let p = per.get(ek);
      if (!p)
        per.set(
          ek,
          (p = { blocks: new Map(), queued: new Map(), live: 0, tokens: 0, requests: 0, pending: 0, guards: 0 }),
        );
      p.guards++;
      if (pending > 0) for (const b of blocks) p.queued.set(b, (p.queued.get(b) ?? 0) + 1);
      else
        for (const b of blocks) {
          const n = p.blocks.get(b) ?? 0;
          if (!n) p.live++;
          p.blocks.set(b, n + 1);
        }
      p.tokens += tokens;
      p.requests += requests;
      p.pending += pending;
      open++;
      return { epochKey: ek, blocks, tokens, requests, pending, done: false };
    },
    release(g) {
      const p = per.get(g.epochKey);
      open--;
      if (!p) return;
      if (g.pending > 0)
        for (const b of g.blocks) {
          const n = p.queued.get(b) ?? 0;
          if (n > 1) p.queued.set(b, n - 1);
          else p.queued.delete(b);
        }
      else
        for (const b of g.blocks) {
          const n = p.blocks.get(b);
          if (!n) continue;
          p.blocks.set(b, n - 1);
          if (n === 1) p.live--;
        }
      const zeros = p.blocks.size - p.live;
      if (zeros > 1024 && zeros > p.live) {
        const kept = new Map<BlockHash, number>();
        p.blocks.forEach((n, b) => {
          if (n > 0) kept.set(b, n);
        });
        p.blocks = kept;
      }
      p.tokens -= g.tokens;
      p.requests -= g.requests;
      p.pending -= g.pending || 0;
      p.guards--;
      if (p.guards <= 0) per.delete(g.epochKey);
    },
    activeBlocks: (ek) => per.get(ek)?.live ?? 0,
    heldGuards: (ek) => Math.max(0, per.get(ek)?.guards ?? 0),
    pendingBlocks: (ek) => Math.max(0, per.get(ek)?.pending ?? 0),
    activePrefix(blocks, eks) {
      const out: { [ek: string]: number } = {};
      for (const ek of eks) {
        const held = per.get(ek)?.blocks;
        if (!held) continue;
        let n = 0;
        while (n < blocks.length && (held.get(blocks[n]) ?? 0) > 0) n++;
        if (n) out[ek] = n;
      }
      return out;
    },
    queuedShared(blocks, upto) {
      const out: { [ek: string]: number } = {};
      for (const ek in upto) {
        const q = per.get(ek as EpochKey)?.queued;
        if (!q || !q.size) continue;
        let n = 0;
        for (let i = 0; i < upto[ek] && i < blocks.length; i++) if (q.has(blocks[i])) n++;
        if (n) out[ek] = n;
      }
      return out;
    },
    demand(ek) {
      const p = per.get(ek);
      return { tokens: Math.max(0, p?.tokens ?? 0), requests: Math.max(0, p?.requests ?? 0) };
    },
    openGuards: () => open,
  };
}

export function memoryRegistry(): WorkerRegistry {
  let list: Worker[] = [];
  let epoch = 0;
  const down = new Set<string>();
  const out = new Map<string, string>();
  return {
    list: () => list,
    get: (id) => list.find((w) => w.id === id) ?? null,
    add(spec) {
      const w: Worker = {
        id: spec.id,
        address: spec.address,
        role: spec.role || "mixed",
        blockSize: spec.blockSize,
        events: spec.events,
        epochKey: (spec.id + "#" + ++epoch) as EpochKey,
      };
      copyEventFields(spec, w);
      // Copy on write: callers may hold the previous list while picking.
      list = list.concat([w]);
      return w;
    },
    remove(id) {
      const gone = list.find((w) => w.id === id) ?? null;
      if (gone) list = list.filter((w) => w !== gone);
      return gone;
    },
    setHealthy: (ek, ok) => void (ok ? down.delete(ek) : down.add(ek)),
    healthy: (ek) => !down.has(ek),
    exclude: (ek, reason) => void out.set(ek, reason),
    excluded: (ek) => out.get(ek) ?? null,
    forget(ek) {
      down.delete(ek);
      out.delete(ek);
    },
  };
}

export function memorySessions(max = MAX_SESSIONS): SessionTable {
  let table = new Map<string, SessionBinding>();
  return {
    get: (sid) => table.get(sid) ?? null,
    bind(sid, b) {
      if (!table.has(sid) && table.size >= max) table = new Map();
      table.set(sid, b);
    },
    size: () => table.size,
  };
}

export function memoryImages(): ImageAffinity {
  // Per worker two generations of up to cap/2 hashes each (generations.ts).
  const gens = new Map<EpochKey, Generations<true>>();
  return {
    touch(ek, hashes, cap) {
      let g = gens.get(ek);
      if (!g) gens.set(ek, (g = generations<true>(() => 1)));
      const half = Math.max(1, Math.floor(cap / 2));
      for (const h of hashes) g.set(h, true, half);
    },
    hits(ek, hashes) {
      const g = gens.get(ek);
      if (!g) return 0;
      let n = 0;
      for (const h of hashes) if (g.has(h)) n++;
      return n;
    },
    list: (ek) => gens.get(ek)?.keys() ?? [],
    drop: (ek) => void gens.delete(ek),
  };
}

export function memoryState(mirror?: MirrorIndex): RouterState {
  const counters = new Map<string, number>();
  return {
    workers: memoryRegistry(),
    mirror: mirror || typedMirror(),
    load: memoryLedger(),
    sessions: memorySessions(),
    images: memoryImages(),
    next(c) {
      const v = (counters.get(c) ?? 0) + 1;
      counters.set(c, v);
      return v;
    },
  };
}
