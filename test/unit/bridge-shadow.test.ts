// The bridge's resync must rebuild exactly what live streaming built: a
// random engine (LRU cache, shared prefixes, evictions that can take a parent
// before its children) feeds core's applyBatch live, and the bridge's Shadow
// replays into a fresh mirror; both mirrors must hold the same blocks, and
// keep agreeing as live batches continue after the replay.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { Shadow } from "../../njs/bridge";
import { applyBatch, KvEvent, tierCounts, tierKey } from "../../core/kvevents";
import { memoryState } from "../../core/state/memory";
import { MirrorIndex } from "../../core/state/types";
import { EpochKey } from "../../core/types";

const BS = 4;

function engine(seed: number, capacity: number) {
  let s = seed;
  const rnd = (n: number) => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) % n;
  const resident = new Map<string, number>(); // hash -> last use
  let clock = 0;
  let seq = 0;
  return {
    resident,
    /** One request: a prompt of 1-6 blocks on one of a few prefixes; returns its batch. */
    step(): { seq: number; events: KvEvent[] } {
      const events: KvEvent[] = [];
      const root = rnd(5);
      const n = 1 + rnd(6);
      let parent: string | null = null;
      const fresh: { h: string; tokens: number[] }[] = [];
      for (let i = 0; i < n; i++) {
        const h: string = `${parent ?? "r" + root}/${i === 0 ? root : rnd(3)}`;
        const tokens = Array.from({ length: BS }, (_, j) => (h.length * 31 + j * 7 + i) % 1000);
        if (!resident.has(h)) fresh.push({ h, tokens });
        resident.set(h, ++clock);
        parent = h;
      }
      if (fresh.length) {
        const first = fresh[0].h;
        const p = first.slice(0, first.lastIndexOf("/"));
        events.push({
          type: "BlockStored",
          hashes: fresh.map((f) => f.h),
          parent: p.includes("/") ? p : null,
          tokens: fresh.flatMap((f) => f.tokens),
          blockSize: BS,
        });
      }
      const evict: string[] = [];
      while (resident.size > capacity) {
        let lru = "";
        let t = Infinity;
        for (const [h, u] of resident) if (u < t) [lru, t] = [h, u];
        resident.delete(lru);
        evict.push(lru);
      }
      if (evict.length) events.push({ type: "BlockRemoved", hashes: evict });
      if (rnd(200) === 0) {
        resident.clear();
        events.push({ type: "AllBlocksCleared" });
      }
      return { seq: ++seq, events };
    },
  };
}

function same(a: MirrorIndex, ea: EpochKey, b: MirrorIndex, eb: EpochKey, hashes: Iterable<string>) {
  assert.equal(b.count(eb), a.count(ea), "block counts");
  for (const h of hashes) assert.equal(b.lookup(eb, h as never), a.lookup(ea, h as never), `block ${h}`);
}

test("a Shadow replay rebuilds the live mirror exactly, ghosts (evicted parents of resident blocks) included", () => {
  for (const seed of [1, 7, 42, 99]) {
    const eng = engine(seed, 25);
    const live = memoryState().mirror;
    const shadow = new Shadow();
    const ek = "w#1" as EpochKey;
    const seen = new Set<string>();
    let replays = 0;
    let ghosts = 0;
    let rebuilt: MirrorIndex | null = null;
    for (let i = 0; i < 600; i++) {
      const b = eng.step();
      for (const e of b.events) if (e.type !== "AllBlocksCleared") e.hashes.forEach((h) => seen.add(h));
      applyBatch(live, ek, b.seq, b.events, BS);
      shadow.apply(b.seq, b.events);
      if (rebuilt) applyBatch(rebuilt, ek, b.seq, b.events, BS);
      assert.equal(shadow.live, eng.resident.size, "the shadow counts what the engine holds");
      ghosts = Math.max(ghosts, shadow.blocks.size - shadow.live);
      if (i % 97 === 50) {
        // nginx restarted: a fresh mirror gets the replay, then keeps following live batches.
        rebuilt = memoryState().mirror;
        const batches = shadow.replay(7);
        batches.forEach((evs, j) =>
          applyBatch(rebuilt!, ek, (shadow.seq as number) - (batches.length - 1 - j), evs, BS),
        );
        same(live, ek, rebuilt, ek, seen);
        replays++;
      }
      if (rebuilt) same(live, ek, rebuilt, ek, seen);
    }
    assert.ok(replays >= 5);
    assert.ok(ghosts > 0, "the stream evicted parents of resident blocks");
  }
});

/**
 * An engine with a CPU tier (vLLM's offloading connector, SGLang's HiCache):
 * a block leaving the GPU is stored on CPU first (medium "CPU", its chain
 * parent named), the CPU tier evicts its least recently used, a prompt whose
 * blocks sit only on CPU stores them on the GPU again, and now and then the
 * CPU tier alone is cleared (AllBlocksCleared with a medium).
 */
function tieredEngine(seed: number, gpuCap: number, cpuCap: number) {
  let s = seed;
  const rnd = (n: number) => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) % n;
  const gpu = new Map<string, number>();
  const cpu = new Map<string, number>();
  const meta = new Map<string, { parent: string | null; tokens: number[] }>();
  let clock = 0;
  let seq = 0;
  const lru = (m: Map<string, number>) => {
    let k = "";
    let t = Infinity;
    for (const [h, u] of m) if (u < t) [k, t] = [h, u];
    return k;
  };
  return {
    gpu,
    cpu,
    step(): { seq: number; events: KvEvent[] } {
      const events: KvEvent[] = [];
      const root = rnd(5);
      const n = 1 + rnd(6);
      let parent: string | null = null;
      const fresh: string[] = [];
      for (let i = 0; i < n; i++) {
        const h: string = `${parent ?? "r" + root}/${i === 0 ? root : rnd(3)}`;
        if (!meta.has(h))
          meta.set(h, { parent, tokens: Array.from({ length: BS }, (_, j) => (h.length * 31 + j * 7 + i) % 1000) });
        if (!gpu.has(h)) fresh.push(h);
        gpu.set(h, ++clock);
        if (cpu.has(h)) cpu.set(h, clock);
        parent = h;
      }
      // Stores of one event must chain; a prompt's fresh blocks can skip over ones still on the GPU.
      let run: string[] = [];
      const flush = () => {
        if (run.length)
          events.push({
            type: "BlockStored",
            hashes: run,
            parent: meta.get(run[0])!.parent,
            tokens: run.flatMap((h) => meta.get(h)!.tokens),
            blockSize: BS,
            medium: "GPU",
          });
        run = [];
      };
      for (const h of fresh) {
        if (run.length && meta.get(h)!.parent !== run[run.length - 1]) flush();
        run.push(h);
      }
      flush();
      const out: string[] = [];
      while (gpu.size > gpuCap) {
        const h = lru(gpu);
        gpu.delete(h);
        out.push(h);
        if (!cpu.has(h))
          events.push({
            type: "BlockStored",
            hashes: [h],
            parent: meta.get(h)!.parent,
            tokens: meta.get(h)!.tokens.slice(),
            blockSize: BS,
            medium: "CPU",
          });
        cpu.set(h, ++clock);
      }
      if (out.length) events.push({ type: "BlockRemoved", hashes: out, medium: "GPU" });
      const gone: string[] = [];
      while (cpu.size > cpuCap) {
        const h = lru(cpu);
        cpu.delete(h);
        gone.push(h);
      }
      if (gone.length) events.push({ type: "BlockRemoved", hashes: gone, medium: "CPU" });
      if (rnd(150) === 0) {
        cpu.clear();
        events.push({ type: "AllBlocksCleared", medium: "CPU" });
      }
      return { seq: ++seq, events };
    },
  };
}

test("lower tiers too: a Shadow replay rebuilds the GPU and CPU mirrors exactly (removals per tier, CPU-only clears, ghosts)", () => {
  const ek = "w#1" as EpochKey;
  for (const seed of [3, 11, 77]) {
    const eng = tieredEngine(seed, 20, 30);
    const live = memoryState().mirror;
    const shadow = new Shadow();
    const seen = new Set<string>();
    let rebuilt: MirrorIndex | null = null;
    let replays = 0;
    let maxCpu = 0;
    for (let i = 0; i < 600; i++) {
      const b = eng.step();
      for (const e of b.events) if (e.type !== "AllBlocksCleared") e.hashes.forEach((h) => seen.add(h));
      applyBatch(live, ek, b.seq, b.events, BS);
      shadow.apply(b.seq, b.events);
      if (rebuilt) applyBatch(rebuilt, ek, b.seq, b.events, BS);
      const tc = shadow.tierCounts();
      assert.deepEqual([tc.GPU, tc.CPU], [eng.gpu.size, eng.cpu.size], "the shadow holds what each tier holds");
      maxCpu = Math.max(maxCpu, tc.CPU);
      if (i % 97 === 50) {
        rebuilt = memoryState().mirror;
        const batches = shadow.replay(7);
        batches.forEach((evs, j) =>
          applyBatch(rebuilt!, ek, (shadow.seq as number) - (batches.length - 1 - j), evs, BS),
        );
        replays++;
      }
      if (rebuilt)
        for (const t of ["GPU", "CPU"]) {
          const k = tierKey(ek, t);
          assert.equal(rebuilt.count(k), live.count(k), `${t} count after ${i}`);
          for (const h of seen)
            assert.equal(rebuilt.lookup(k, h as never), live.lookup(k, h as never), `${t} block ${h}`);
        }
    }
    assert.ok(replays >= 5 && maxCpu === 30, `replays ${replays}, CPU tier reached ${maxCpu}`);
    assert.ok(tierCounts(live, ek).CPU > 0, "the mirrors compared hold CPU blocks");
  }
});
