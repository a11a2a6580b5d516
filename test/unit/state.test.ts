// One behaviour suite for every RouterState backend: the Map/Set one Node runs
// and the key-encoded one njs runs over its shared dicts (here over memStore,
// the same Store interface the shared-dict adapter implements).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { memoryMirror, memoryState } from "../../core/state/memory";
import { typedMirror } from "../../core/state/typed-mirror";
import { keyedState } from "../../core/state/keyed";
import { memStore } from "../../core/store";
import { RouterState } from "../../core/state/types";
import { BlockHash, EpochKey } from "../../core/types";

const backends: [string, () => RouterState][] = [
  ["memory (typed mirror, the default)", memoryState],
  ["memory (Map mirror)", () => memoryState(memoryMirror())],
  ["keyed (njs shared dict)", () => keyedState(memStore())],
];
const B = (s: string) => s as BlockHash;
const E = (s: string) => s as EpochKey;

for (const [name, make] of backends) {
  test(`${name}: mirror store/lookup/remove/count, engine aliases of one block`, () => {
    const { mirror } = make();
    assert.equal(mirror.store(E("a#1"), "e1", B("h1")), true);
    assert.equal(mirror.store(E("a#1"), "e1", B("h1")), false, "same engine block again");
    assert.equal(mirror.store(E("a#1"), "e2", B("h1")), false, "second engine hash for the same block");
    assert.equal(mirror.count(E("a#1")), 1);
    assert.equal(mirror.lookup(E("a#1"), "e2"), "h1");
    assert.equal(mirror.remove(E("a#1"), "e1"), false, "still held through e2");
    assert.equal(mirror.remove(E("a#1"), "e2"), true);
    assert.equal(mirror.remove(E("a#1"), "e2"), false);
    assert.equal(mirror.count(E("a#1")), 0);
    assert.equal(mirror.lookup(E("a#1"), "e2"), undefined);
    // an engine hash re-pointed to another block moves its reference
    mirror.store(E("a#1"), "e3", B("h3"));
    mirror.store(E("a#1"), "e3", B("h4"));
    assert.equal(mirror.count(E("a#1")), 1);
    assert.deepEqual(mirror.prefixHits([B("h4")], { "a#1": true }), { "a#1": 1 });
    assert.deepEqual(mirror.prefixHits([B("h3")], { "a#1": true }), {});
  });

  test(`${name}: prefix hits are the longest cached prefix per live worker; clear drops one worker only`, () => {
    const { mirror } = make();
    const req = ["p0", "p1", "p2", "p3"].map(B);
    ["p0", "p1", "p3"].forEach((h, i) => mirror.store(E("a#1"), "a" + i, B(h)));
    ["p0", "p1", "p2", "p3"].forEach((h, i) => mirror.store(E("b#2"), "b" + i, B(h)));
    mirror.store(E("c#3"), "c0", B("p0"));
    assert.deepEqual(mirror.prefixHits(req, { "a#1": true, "b#2": true, "c#3": true }), {
      "a#1": 2,
      "b#2": 4,
      "c#3": 1,
    });
    assert.deepEqual(mirror.prefixHits(req, { "a#1": true }), { "a#1": 2 }, "only live workers count");
    mirror.clear(E("b#2"));
    assert.equal(mirror.count(E("b#2")), 0);
    assert.equal(mirror.count(E("a#1")), 3);
    assert.deepEqual(mirror.prefixHits(req, { "a#1": true, "b#2": true, "c#3": true }), { "a#1": 2, "c#3": 1 });
    mirror.setSequence(E("a#1"), 7);
    assert.equal(mirror.sequence(E("a#1")), 7);
    mirror.setSequence(E("a#1"), undefined);
    assert.equal(mirror.sequence(E("a#1")), undefined);
  });

  test(`${name}: load ledger counts distinct blocks once per worker and returns to zero`, () => {
    const { load } = make();
    const g1 = load.hold(E("a#1"), ["x", "y"].map(B), 100, 1);
    const g2 = load.hold(E("a#1"), ["x", "z"].map(B), 50, 1);
    load.hold(E("b#2"), [B("x")], 0, 0);
    assert.equal(load.activeBlocks(E("a#1")), 3);
    assert.deepEqual(load.demand(E("a#1")), { tokens: 150, requests: 2 });
    assert.equal(load.openGuards(), 3);
    assert.equal(load.heldGuards(E("a#1")), 2);
    load.release(g1);
    assert.equal(load.activeBlocks(E("a#1")), 2);
    load.release(g2);
    assert.equal(load.activeBlocks(E("a#1")), 0);
    assert.deepEqual(load.demand(E("a#1")), { tokens: 0, requests: 0 });
    assert.equal(load.activeBlocks(E("b#2")), 1);
    assert.equal(load.heldGuards(E("a#1")), 0);
    assert.equal(load.heldGuards(E("b#2")), 1);
    assert.equal(load.openGuards(), 1);
  });

  test(`${name}: queued-prefill guards book their blocks as queued, not held, and give them back`, () => {
    const { load } = make();
    const req = ["d0", "d1", "d2", "d3", "q9"].map(B);
    // A first request for a document: all of it in flight, d1..d3 still to prefill (d0 was cached).
    const main = load.hold(E("a#1"), ["d0", "d1", "d2", "d3", "q1"].map(B), 0, 0);
    const queued = load.hold(E("a#1"), ["d1", "d2", "d3", "q1"].map(B), 0, 0, 4);
    const other = load.hold(E("b#2"), ["d2"].map(B), 0, 0, 1);
    assert.equal(load.activeBlocks(E("a#1")), 5, "queued blocks are not held a second time");
    assert.equal(load.pendingBlocks(E("a#1")), 4);
    // Within the in-flight prefix only: b#2 queues d2, but nothing of this request is in flight there.
    assert.deepEqual(load.queuedShared(req, { "a#1": 4, "b#2": 0 }), { "a#1": 3 });
    assert.deepEqual(load.queuedShared(req, { "a#1": 2 }), { "a#1": 1 });
    load.release(queued);
    assert.deepEqual(load.queuedShared(req, { "a#1": 4 }), {}, "prefilled: nothing queued");
    assert.equal(load.activeBlocks(E("a#1")), 5);
    load.release(main);
    load.release(other);
    assert.equal(load.pendingBlocks(E("b#2")), 0);
    assert.deepEqual(load.queuedShared(req, { "a#1": 5, "b#2": 5 }), {});
    assert.equal(load.openGuards(), 0);
  });

  test(`${name}: registry epochs, health, exclusion`, () => {
    const { workers } = make();
    const a = workers.add({ id: "a", address: "127.0.0.1:1", role: "mixed" });
    const b = workers.add({ id: "b", address: "127.0.0.1:2", role: "decode", blockSize: 16 });
    assert.deepEqual(
      workers.list().map((w) => w.id),
      ["a", "b"],
    );
    assert.equal(workers.get("b")!.blockSize, 16);
    assert.notEqual(a.epochKey, b.epochKey);
    workers.setHealthy(a.epochKey, false);
    assert.equal(workers.healthy(a.epochKey), false);
    workers.exclude(b.epochKey, "why");
    assert.equal(workers.excluded(b.epochKey), "why");
    assert.equal(workers.remove("a")!.id, "a");
    assert.equal(workers.remove("a"), null);
    workers.forget(a.epochKey);
    const a2 = workers.add({ id: "a", address: "127.0.0.1:1", role: "mixed" });
    assert.notEqual(a2.epochKey, a.epochKey, "a new stay, a new epoch");
    assert.equal(workers.healthy(a2.epochKey), true);
  });

  test(`${name}: sessions bounded, image LRU most recent last`, () => {
    const st = make();
    st.sessions.bind("s", { prefill: E("a#1") });
    assert.deepEqual(st.sessions.get("s"), { prefill: "a#1" });
    assert.equal(st.sessions.get("nope"), null);
    st.images.touch(E("a#1"), ["i1", "i2", "i3"], 2);
    assert.deepEqual(st.images.list(E("a#1")), ["i2", "i3"]);
    st.images.touch(E("a#1"), ["i2"], 2);
    assert.deepEqual(st.images.list(E("a#1")), ["i3", "i2"]);
    assert.equal(st.images.hits(E("a#1"), ["i1", "i2", "i3"]), 2);
    st.images.drop(E("a#1"));
    assert.equal(st.images.hits(E("a#1"), ["i2"]), 0);
    assert.equal(st.next("RR"), 1);
    assert.equal(st.next("RR"), 2);
  });
}

test("keyed backend: worker ids with colons never collide with another worker's keys", () => {
  const st = keyedState(memStore());
  st.mirror.store(E("127.0.0.1:8001#1"), "e", B("h"));
  st.mirror.store(E("127.0.0.1:8001#10"), "e", B("h"));
  st.mirror.clear(E("127.0.0.1:8001#1"));
  assert.equal(st.mirror.count(E("127.0.0.1:8001#10")), 1);
  assert.deepEqual(st.mirror.prefixHits([B("h")], { "127.0.0.1:8001#10": true, "127.0.0.1:8001#1": true }), {
    "127.0.0.1:8001#10": 1,
  });
});

test("prometheus label values are escaped and secrets compare by content", async () => {
  const { promLabel, sameSecret } = await import("../../core/util");
  assert.equal(promLabel('w"1\\\n'), 'w\\"1\\\\\\n');
  assert.equal(sameSecret("abc", "abc"), true);
  assert.equal(sameSecret("abc", "abd"), false);
  assert.equal(sameSecret("abc", "abcd"), false);
  assert.equal(sameSecret("", ""), true);
});

// The typed index must behave exactly like the Map one it replaces: a long
// random run of every mutation (aliases, re-pointed engine hashes, blocks
// shared across workers and tiers, clears, oldest-first eviction) through
// several table growths, compared after every step.
test("typed mirror matches the Map mirror on a random run through table growth and deletions", () => {
  let seed = 12345;
  const rnd = (n: number) => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return (seed >>> 8) % n;
  };
  const hex = (i: number) =>
    ((i * 2654435761) >>> 0).toString(16).padStart(8, "0") + (i >>> 0).toString(16).padStart(8, "0");
  const workers = ["127.0.0.1:8001#1", "127.0.0.1:8001#10", "w:3#3"];
  const targets = workers.flatMap((w) => [w, w + "|CPU", w + "|DISK"]).map(E);
  const live = Object.fromEntries(workers.map((w) => [w, true]));
  const weights = { GPU: 1, CPU: 0.75, DISK: 0.25 };
  const a = memoryMirror();
  // Cleared entries linger in the graveyard (reclaimed 4 per store) so the comparison runs over stale ones too.
  const b = typedMirror({ sweepOnClear: 0 });
  let peak = 0;
  for (let step = 0; step < 40000; step++) {
    const t = targets[rnd(targets.length)];
    const op = rnd(1000);
    // Engine hashes: decimal u64 (the wire form), hex bytes, and a few arbitrary names.
    const ehN = rnd(20000);
    const eh =
      ehN % 7 === 0 ? "ext-" + ehN : ehN % 5 === 0 ? "18446744073709" + String(551000 + ehN) : String(ehN * 7919);
    const bh = B(rnd(10) === 0 ? "name-" + rnd(200) : hex(rnd(1500)));
    if (op < 750) assert.equal(b.store(t, eh, bh), a.store(t, eh, bh), `store ${step}`);
    else if (op < 870) assert.equal(b.remove(t, eh), a.remove(t, eh), `remove ${step}`);
    else if (op < 999) assert.equal(b.evictOldest(t), a.evictOldest(t), `evict ${step}`);
    else {
      a.clear(t);
      b.clear(t);
    }
    assert.equal(b.lookup(t, eh), a.lookup(t, eh), `lookup ${step}`);
    peak = Math.max(peak, b.stats().entries);
    if (step % 97 === 0) {
      for (const x of targets) {
        assert.equal(b.count(x), a.count(x), `count ${x} at ${step}`);
        assert.equal(b.entries(x), a.entries(x), `entries ${x} at ${step}`);
      }
      const req = Array.from({ length: 40 }, (_, i) => B(hex(i * 3 + rnd(3))));
      assert.deepEqual(b.prefixHits(req, live, weights), a.prefixHits(req, live, weights), `weighted hits at ${step}`);
      assert.deepEqual(b.prefixHits(req, live), a.prefixHits(req, live), `GPU hits at ${step}`);
    }
  }
  assert.ok(peak > 4096, `the run must outgrow the initial tables (peak ${peak} entries)`);
  const st = b.stats();
  assert.ok(st.entries > 0 && st.entries === targets.reduce((n, x) => n + b.entries(x), 0));
  for (const x of targets) b.clear(x);
  b.sweep(Infinity);
  assert.deepEqual(b.stats().entries, 0);
  assert.deepEqual(b.stats().blocks, 0, "no block outlives its last holder");
});

test("typed mirror: engine hashes are exact u64 decimals, other spellings never alias them", () => {
  const m = typedMirror();
  const w = E("w#1");
  m.store(w, "12", B("00000000000000aa"));
  m.store(w, "012", B("00000000000000bb"));
  m.store(w, "18446744073709551615", B("00000000000000cc"));
  m.store(w, "18446744073709551616", B("00000000000000dd")); // past u64: folded, still its own key
  m.store(w, "c", B("00000000000000ee"));
  assert.equal(m.lookup(w, "12"), "00000000000000aa");
  assert.equal(m.lookup(w, "012"), "00000000000000bb");
  assert.equal(m.lookup(w, "18446744073709551615"), "00000000000000cc");
  assert.equal(m.lookup(w, "18446744073709551616"), "00000000000000dd");
  assert.equal(m.lookup(w, "c"), "00000000000000ee");
  assert.equal(m.lookup(w, "13"), undefined);
  assert.equal(m.count(w), 5);
  // Upper-case hex is not the hasher's spelling: kept verbatim, a distinct block.
  m.store(w, "1", B("00000000000000AA"));
  assert.equal(m.lookup(w, "1"), "00000000000000AA");
  assert.equal(m.count(w), 6);
});

test("typed mirror: a cleared worker vanishes at once; its entries are reclaimed later without touching the others", () => {
  const m = typedMirror({ sweepOnClear: 100 });
  const a = E("a:1#1");
  const b = E("b:1#2");
  const hx = (i: number) => B(i.toString(16).padStart(16, "0"));
  for (let i = 0; i < 5000; i++) m.store(a, String(i), hx(i));
  for (let i = 0; i < 10; i++) m.store(b, String(i), hx(i)); // shared with a
  const live = { "a:1#1": true, "b:1#2": true };
  assert.deepEqual(m.prefixHits([hx(0), hx(1), hx(2)], live), { "a:1#1": 3, "b:1#2": 3 });
  m.clear(a);
  assert.equal(m.stats().graveyard, 4900, "clear reclaimed its budget only");
  assert.equal(m.count(a), 0);
  assert.equal(m.entries(a), 0);
  assert.equal(m.lookup(a, "4999"), undefined);
  assert.equal(m.remove(a, "4999"), false);
  assert.equal(m.evictOldest(a), false);
  assert.deepEqual(m.prefixHits([hx(0), hx(1), hx(2)], live), { "b:1#2": 3 });
  assert.deepEqual(m.prefixHits([hx(4000)], live), {});
  // the same epoch key keeps going (a sequence-gap clear): only new stores count
  assert.equal(m.store(a, "4999", hx(4999)), true);
  assert.equal(m.count(a), 1);
  assert.deepEqual(m.prefixHits([hx(4999)], live), { "a:1#1": 1 });
  assert.equal(m.stats().graveyard, 4900 - 4, "each store reclaims a few");
  for (let i = 0; i < 300; i++) m.store(b, "x" + i, hx(100000 + i));
  assert.equal(m.stats().graveyard, 4900 - 4 - 1200);
  m.sweep(Infinity);
  assert.equal(m.stats().graveyard, 0);
  assert.equal(m.stats().entries, 1 + 10 + 300);
  assert.equal(m.stats().blocks, 1 + 10 + 300, "blocks held only by a are freed, shared ones stay");
  assert.deepEqual(m.prefixHits([hx(0), hx(1)], live), { "b:1#2": 2 });
  assert.equal(m.count(b), 310);
});
