// The key-encoded ledger (njs shared dicts) marks a request's blocks at a few
// grid positions (core/state/marks.ts), not one key per block: long prompts
// must cost a few hundred shared-dict keys, and the in-flight prefix, queued
// blocks and active-block counts it derives must stay close to the exact
// Map/Set ledger's (equal below 32 blocks, within the grid's 1/16 above).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { guardJson, keyedState } from "../../core/state/keyed";
import { memoryState } from "../../core/state/memory";
import { blockAt, gridPositions, markPositions, markedPrefix, packedBlocks } from "../../core/state/marks";
import { memStore, Store } from "../../core/store";
import { BlockHash, EpochKey } from "../../core/types";
import { blockHashes } from "../../core/hash";
import { moveGuard } from "../../core/failover";
import { clearAllTiers } from "../../core/kvevents";
import { createRouter, defaultConfig } from "../../core/router";

const E = (s: string) => s as EpochKey;

/** A chained prompt of n blocks: the first `shared` blocks common to every prompt with that seed. */
function prompt(seed: number, shared: number, n: number, tail: number): BlockHash[] {
  const ids: number[] = [];
  for (let i = 0; i < n * 16; i++) ids.push(i < shared * 16 ? (seed * 7919 + i) % 50000 : (tail * 104729 + i) % 50000);
  return blockHashes(ids, 16);
}

/** Counts the store's writes (new keys and increments) so a test can bound them. */
function counted(): { st: Store; ops: () => number; keys: (p: string) => number } {
  const inner = memStore();
  let ops = 0;
  return {
    st: {
      get: inner.get,
      set: (k, v) => {
        ops++;
        inner.set(k, v);
      },
      del: inner.del,
      incr: (k, d) => {
        ops++;
        return inner.incr(k, d);
      },
      num: inner.num,
      delNum: inner.delNum,
      keys: inner.keys,
      keysMany: inner.keysMany,
    },
    ops: () => ops,
    keys: (p) => inner.keys(p).length,
  };
}

test("grid: dense below 32 blocks, 16 positions per doubling above, the last block always marked", () => {
  assert.deepEqual(gridPositions(0, 40), [...Array(32).keys()].concat([33, 35, 37, 39]));
  const m = markPositions(0, 7000);
  assert.ok(m.length < 170, `${m.length} marks for 7,000 blocks`);
  assert.equal(m[m.length - 1], 6999);
  for (let i = 1; i < m.length; i++) {
    assert.ok(m[i] > m[i - 1]);
    // Gaps stay within 1/16 of the position (the rounding of a found prefix).
    assert.ok(m[i] - m[i - 1] <= Math.max(1, (m[i] + 1) / 16), `gap at ${m[i]}`);
  }
  assert.deepEqual(markPositions(100, 100), []);
  assert.deepEqual(markPositions(5, 8), [5, 6, 7]);
});

test("markedPrefix is exact on the dense part and rounds down to the grid above it", () => {
  const hashes = [...Array(5000).keys()].map((i) => "h" + i);
  const at = markPositions(0, 5000);
  const hs = at.map((p) => hashes[p]);
  for (const len of [0, 1, 17, 31, 32, 33, 100, 999, 4999, 5000]) {
    const got = markedPrefix(hs, at, 5000, (h) => Number(h.slice(1)) < len);
    assert.ok(got <= len && got >= len - Math.max(1, len / 16), `prefix ${len}: ${got}`);
    if (len <= 32 || len === 5000) assert.equal(got, len);
  }
});

test("keyed ledger: a 7,000-block prompt costs a few hundred shared-dict writes, not one per block", () => {
  const c = counted();
  const s = keyedState(c.st);
  const blocks = prompt(1, 7000, 7000, 0);
  const before = c.ops();
  const main = s.load.hold(E("a#1"), blocks, 0, 0);
  const queued = s.load.hold(E("a#1"), blocks.slice(100), 0, 0, 6900, 100);
  const writes = c.ops() - before;
  assert.ok(writes < 400, `${writes} writes`);
  assert.ok(c.keys("A:a#1:") < 200 && c.keys("Q:a#1:") < 200, "one key per mark");
  assert.ok(JSON.stringify(main).length < 8000, "the guard record is compact");
  assert.equal(s.load.activeBlocks(E("a#1")), 7000);
  assert.equal(s.load.pendingBlocks(E("a#1")), 6900);
  s.load.release(queued);
  s.load.release(main);
  assert.equal(s.load.activeBlocks(E("a#1")), 0);
  assert.equal(c.keys("A:") + c.keys("Q:") + c.keys("AC:"), 0, "nothing left behind");
});

test("keyed ledger on long prompts: in-flight prefix, queued blocks and active blocks near the exact ledger's", () => {
  const exact = memoryState().load;
  const keyed = keyedState(memStore()).load;
  const a = E("a#1");
  const b = E("b#2");
  // Agents sharing a 3,000-block system prompt, then their own conversations.
  const p1 = prompt(1, 3000, 6000, 1);
  const p2 = prompt(1, 3000, 5000, 2);
  const p3 = prompt(1, 3000, 8000, 3);
  const guards: [ReturnType<typeof exact.hold>, ReturnType<typeof keyed.hold>][] = [];
  const both = (ek: EpochKey, bl: BlockHash[], pending?: number, from?: number) =>
    guards.push([exact.hold(ek, bl, 0, 0, pending, from), keyed.hold(ek, bl, 0, 0, pending, from)]);
  both(a, p1);
  both(a, p1.slice(2000), 4000, 2000);
  both(b, p2);
  const near = (got: number, want: number, what: string) =>
    assert.ok(got <= want && got >= want - Math.max(1, want / 16), `${what}: ${got}, exact ${want}`);
  for (const q of [p1, p2, p3, prompt(9, 10, 200, 9)]) {
    const ex = exact.activePrefix(q, [a, b]);
    const ke = keyed.activePrefix(q, [a, b]);
    for (const ek of [a, b]) near(ke[ek] || 0, ex[ek] || 0, `in-flight prefix on ${ek}`);
    const up = { [a]: ex[a] || 0, [b]: ex[b] || 0 };
    const qe = exact.queuedShared(q, up);
    const qk = keyed.queuedShared(q, up);
    for (const ek of [a, b]) {
      const want = qe[ek] || 0;
      const got = qk[ek] || 0;
      assert.ok(Math.abs(got - want) <= Math.max(1, want / 8), `queued on ${ek}: ${got}, exact ${want}`);
    }
  }
  // The same prompt in flight twice: found whole, and counted once.
  assert.equal(keyed.activePrefix(p1, [a])[a], 6000);
  both(a, p1);
  both(a, p3);
  for (const ek of [a, b]) near(keyed.activePrefix(p3, [ek])[ek] || 0, exact.activePrefix(p3, [ek])[ek] || 0, "p3");
  // A shared prefix found rounded down counts a few of its blocks twice.
  const act = keyed.activeBlocks(a);
  assert.ok(act >= exact.activeBlocks(a) && act <= exact.activeBlocks(a) * 1.0625, `active blocks: ${act}`);
  for (let i = 0; i < guards.length; i++) {
    exact.release(guards[i][0]);
    keyed.release(guards[i][1]);
    for (const ek of [a, b]) {
      const want = exact.activeBlocks(ek);
      const got = keyed.activeBlocks(ek);
      assert.ok(
        Math.abs(got - want) <= Math.max(1, want / 16),
        `active on ${ek} after ${i + 1} releases: ${got} vs ${want}`,
      );
    }
  }
  assert.equal(keyed.activeBlocks(a), 0);
  assert.equal(keyed.openGuards(), 0);
});

test("keyed ledger: a compact guard moves to another worker whole and is released there once", () => {
  const r = createRouter(keyedState(memStore()), defaultConfig());
  r.addWorker({ id: "w1", address: "127.0.0.1:1", role: "mixed" });
  r.addWorker({ id: "w2", address: "127.0.0.1:2", role: "mixed" });
  const p = r.pick({ blocks: prompt(3, 4000, 4000, 0), inputTokens: 64000, exact: true, mediaHashes: [], n: 1 });
  const from = p.target.id;
  const to = from === "w1" ? "w2" : "w1";
  const g = JSON.parse(JSON.stringify(p.reservation.guards().main));
  const moved = moveGuard(r, g, to)!;
  assert.ok(moved);
  assert.equal(r.activeBlocks(from), 0);
  assert.equal(r.activeBlocks(to), 4000);
  r.releaseGuard(JSON.parse(JSON.stringify(moved)));
  const q = p.reservation.guards().queued;
  if (q) r.releaseGuard(JSON.parse(JSON.stringify(q)));
  assert.equal(r.activeBlocks(to), 0);
  assert.equal(r.openGuards(), 0);
});

test("keyed mirror: a long prompt's cached prefix from a few hundred reads, equal to the exact walk without holes", () => {
  const inner = memStore();
  let reads = 0;
  const st: Store = {
    ...inner,
    get: (k) => {
      reads++;
      return inner.get(k);
    },
  };
  const keyed = keyedState(st).mirror;
  const exact = memoryState().mirror;
  const blocks = prompt(5, 7000, 7000, 0);
  const held: [string, number, number][] = [
    ["a#1", 0, 5000],
    ["b#2", 0, 1234],
    ["c#3", 0, 7000],
    ["d#4", 0, 40],
    ["e#5", 0, 3000],
    ["e#5|CPU", 3000, 6100],
  ];
  for (const [t, from, to] of held)
    for (let i = from; i < to; i++) {
      keyed.store(E(t), "e" + i, blocks[i]);
      exact.store(E(t), "e" + i, blocks[i]);
    }
  const live = { "a#1": true, "b#2": true, "c#3": true, "d#4": true, "e#5": true };
  reads = 0;
  const got = keyed.prefixHits(blocks, live);
  assert.ok(reads < 300, `${reads} reads`);
  assert.deepEqual(got, exact.prefixHits(blocks, live));
  assert.deepEqual(got, { "a#1": 5000, "b#2": 1234, "c#3": 7000, "d#4": 40, "e#5": 3000 });
  // Lower tiers at their weight: within a grid span of the exact figure.
  const w = { GPU: 1, CPU: 0.5 };
  const kw = keyed.prefixHits(blocks, live, w);
  const ew = exact.prefixHits(blocks, live, w);
  for (const ek in ew) assert.ok(Math.abs(kw[ek] - ew[ek]) <= ew[ek] / 16, `${ek}: ${kw[ek]} vs ${ew[ek]}`);
  // Short prompts still walk every block: a hole ends the run where it is.
  keyed.remove(E("a#1"), "e20");
  exact.remove(E("a#1"), "e20");
  assert.equal(keyed.prefixHits(blocks.slice(0, 64), live)["a#1"], 20);
  assert.deepEqual(keyed.prefixHits(blocks.slice(0, 64), live), exact.prefixHits(blocks.slice(0, 64), live));
});

test("clearing a worker's mirror walks its own queue, not the store's keys, and lists them only for what the queue does not name", () => {
  // njs's shared dicts list every key on each listing: an AllBlocksCleared
  // clears four tiers, and each tier cleared by one listing per key family
  // was sixteen listings of the whole zone per event; one listing per tier
  // still cost every key of both zones, other workers' included.
  const inner = memStore();
  let listings = 0;
  const st: Store = {
    ...inner,
    keys: (p) => (listings++, inner.keys(p)),
    keysMany: (ps) => (listings++, inner.keysMany(ps)),
  };
  const m = keyedState(st).mirror;
  const blocks = prompt(3, 40, 40, 0);
  for (let i = 0; i < blocks.length; i++) {
    m.store(E("a#1"), "e" + i, blocks[i]);
    m.store(E("b#2"), "e" + i, blocks[i]);
  }
  m.store(E("a#1|CPU"), "c0", blocks[0]);
  listings = 0;
  clearAllTiers(m, E("a#1"));
  assert.equal(listings, 0, "each tier's queue names its blocks");
  assert.equal(m.count(E("a#1")), 0);
  assert.equal(m.count(E("a#1|CPU")), 0);
  assert.equal(m.entries(E("a#1")), 0);
  assert.equal(inner.keys("ME:a#1").length + inner.keys("MR:a#1").length + inner.keys("MQ:a#1").length, 0);
  assert.equal(m.count(E("b#2")), blocks.length, "the other worker keeps its blocks");
  assert.deepEqual(m.prefixHits(blocks, { "a#1": true, "b#2": true }), { "b#2": blocks.length });
  listings = 0;
  clearAllTiers(m, E("a#1"));
  assert.equal(listings, 0, "an empty mirror is cleared without a listing");
  // A store torn by a full zone (an ME entry with no queue slot): the listing finds it.
  for (let i = 0; i < blocks.length; i++) m.store(E("a#1"), "e" + i, blocks[i]);
  inner.set("ME:a#1:torn", blocks[0]);
  inner.incr("MEN:a#1", 1);
  listings = 0;
  m.clear(E("a#1"));
  assert.equal(listings, 1);
  assert.equal(inner.keys("ME:a#1").length + inner.keys("MR:a#1").length + inner.keys("MQ:a#1").length, 0);
  // A queue of more holes than blocks (blocks removed since they were stored): one listing, not a long walk.
  const many = prompt(1500, 1500, 1500, 2);
  for (let i = 0; i < many.length; i++) m.store(E("a#1"), "m" + i, many[i]);
  for (let i = 0; i < many.length - 10; i++) m.remove(E("a#1"), "m" + i);
  listings = 0;
  m.clear(E("a#1"));
  assert.equal(listings, 1);
  assert.equal(inner.keys("ME:a#1").length + inner.keys("MR:a#1").length + inner.keys("MQ:a#1").length, 0);
  assert.equal(m.count(E("b#2")), blocks.length, "the other worker keeps its blocks");
  assert.deepEqual(m.prefixHits(blocks, { "a#1": true, "b#2": true }), { "b#2": blocks.length });
});

test("a saved guard's record is JSON.stringify's text, byte for byte, for every guard the ledger books and odd ones", () => {
  const s = keyedState(memStore());
  const ek = E("127.0.0.1:8000#3");
  const guards: unknown[] = [];
  for (const n of [0, 1, 2, 31, 32, 33, 100, 1000, 7019]) {
    const blocks = prompt(n, n, n, 1);
    guards.push(s.load.hold(ek, blocks, n * 16, 1));
    if (n > 2) guards.push(s.load.hold(ek, blocks.slice(2), 0, 0, (n - 2) * 16, 2));
  }
  const main = s.load.hold(ek, prompt(9, 50, 50, 2), 800, 1) as unknown as Record<string, unknown>;
  // A guard of a bundle from before the compact marks (no at/n), one done, and ones JSON has to escape or reformat.
  guards.push({ epochKey: ek, blocks: ["a", "b"], tokens: 5, requests: 1, pending: 0, done: false });
  guards.push({ ...main, done: true });
  guards.push({ ...main, epochKey: 'w"1\\x#2' });
  guards.push({ ...main, blocks: ["a\nb", "c"] });
  guards.push({ ...main, tokens: NaN, requests: Infinity });
  guards.push({ ...main, at: [1.5, -2], n: 3 });
  guards.push({ ...main, pending: undefined });
  for (const g of guards) {
    const text = guardJson(g as Parameters<typeof guardJson>[0]);
    assert.equal(text, JSON.stringify(g));
    assert.deepEqual(JSON.parse(text), JSON.parse(JSON.stringify(g)));
  }
});

test("a prompt's hashes packed (the tokenizer helper's answer to njs) pick, hit, hold and release exactly as the full list", () => {
  let seed = 7;
  const rnd = (n: number) => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  const tiers = ["", "|CPU", "|DISK"];
  for (let c = 0; c < 40; c++) {
    const cfg = { ...defaultConfig(), kvTierWeights: { GPU: 1, CPU: 0.3, DISK: 0.1 } };
    const routers = [createRouter(keyedState(memStore()), cfg), createRouter(keyedState(memStore()), cfg)];
    const n = 40 + rnd(9000);
    const base = prompt(c, n, n, 0);
    for (const r of routers)
      for (let w = 0; w < 3; w++) r.addWorker({ id: "w" + w, address: "127.0.0.1:" + (w + 1), role: "mixed" });
    const eks = routers.map((r) => r.workers().map((w) => w.epochKey));
    // Cached runs (some with holes, some in lower tiers) on random workers, the same in both routers.
    for (let h = 0; h < 1 + rnd(4); h++) {
      const w = rnd(3);
      const t = tiers[rnd(3)];
      const from = rnd(3) ? 0 : rnd(n);
      const to = from + rnd(n - from + 1);
      for (let i = from; i < to; i++) {
        if (rnd(500) === 0) continue;
        for (let k = 0; k < 2; k++) routers[k].state.mirror.store(E(eks[k][w] + t), "e" + h + ":" + i, base[i]);
      }
    }
    // A few requests sharing a prefix of it, picked in both routers, some left in flight.
    const open: [ReturnType<(typeof routers)[0]["pick"]>, ReturnType<(typeof routers)[0]["pick"]>][] = [];
    for (let q = 0; q < 4; q++) {
      const m = 1 + rnd(n);
      const blocks = q === 0 ? base : base.slice(0, m).concat(prompt(c * 10 + q, 0, rnd(200), q + 1));
      const full = { blocks, inputTokens: blocks.length * 16, exact: true, mediaHashes: [], n: 1 };
      const packed = { ...full, blocks: packedBlocks(blocks.join(""), blocks.length) as BlockHash[] };
      const p = [routers[0].pick(full), routers[1].pick(packed)] as const;
      assert.equal(p[1].target.id, p[0].target.id, `case ${c}.${q}: the same worker`);
      assert.deepEqual(p[1].candidates, p[0].candidates, `case ${c}.${q}: the same costs and hits`);
      assert.equal(p[1].uncachedTokens, p[0].uncachedTokens);
      const g = [p[0].reservation.guards(), p[1].reservation.guards()];
      assert.equal(JSON.stringify(g[1].main), JSON.stringify(g[0].main));
      assert.equal(JSON.stringify(g[1].queued), JSON.stringify(g[0].queued));
      if (rnd(2)) open.push([p[0], p[1]]);
      else for (const x of p) x.reservation.finish();
    }
    for (const [a, b] of open) {
      a.reservation.finish();
      b.reservation.finish();
    }
    assert.equal(routers[1].openGuards(), 0);
  }
});

test("a packed list holds the marks' hashes and cuts any other position on first read", () => {
  const blocks = prompt(2, 500, 500, 0);
  const p = packedBlocks(blocks.join(""), blocks.length);
  assert.equal(p.length, 500);
  for (const i of markPositions(0, 500)) assert.equal(p[i], blocks[i]);
  assert.equal(p[34], undefined, "off the grid: not made yet");
  for (let i = 0; i < 500; i++) assert.equal(blockAt(p, i), blocks[i]);
  assert.equal(blockAt(p, 500), undefined);
  assert.equal(blockAt(blocks, 7), blocks[7]);
});
