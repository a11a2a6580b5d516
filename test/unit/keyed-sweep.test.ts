// A clear of a large key-encoded mirror (the njs shared dicts) moves the
// target to a new generation at once and leaves the old blocks to sweep(),
// a step per push. Meanwhile every answer must be the one an immediate clear
// gives, and once swept the store must hold exactly the keys an immediate
// clear leaves: nothing of the old generations, holder lists unchanged.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { keyedMirror } from "../../core/state/keyed";
import { memoryMirror } from "../../core/state/memory";
import { memStore, Store } from "../../core/store";
import { BlockHash, EngineHash, EpochKey } from "../../core/types";
import { rng } from "../render-corpus";

/**
 * The store's keys and values with generation names folded ("t~3" -> "t"),
 * the generation counters left out, and holder lists sorted (their order is
 * not part of the mirror's answers: a holder a sweep kept stays where it was).
 */
function dump(st: Store): string {
  const fold = (k: string) => k.replace(/~\d+(?=:|$)/, "");
  const out: string[] = [];
  for (const k of st.keys("").sort()) {
    if (k.startsWith("MG:") || k === "MGY") continue;
    const v = st.get(k);
    const value = v !== undefined && k.startsWith("M:") ? v.split(",").sort().join(",") : (v ?? null);
    out.push(JSON.stringify([fold(k), value, st.num(k)]));
  }
  return out.sort().join("\n");
}

test("a deferred clear answers as an immediate one at every step, and leaves the same keys once swept", () => {
  let deferred = 0;
  let sweptSteps = 0;
  let hidden = 0;
  for (let seed = 1; seed <= 40; seed++) {
    const r = rng(seed);
    const ref = memoryMirror();
    const nowSt = memStore();
    const now = keyedMirror(nowSt, 1e9); // every clear at once
    const lazySt = memStore();
    const lazy = keyedMirror(lazySt, 6); // clears of over 6 blocks deferred, sweeps of 6 slots
    const eks = ["w#1", "w#1|CPU", "v#2"] as EpochKey[];
    const live = { "w#1": true, "v#2": true };
    const weights = { GPU: 1, CPU: 0.5 };
    // Chains of hashes from a small pool, so prefixes are shared and re-stored after clears.
    const chain = (n: number) => {
      const base = Math.floor(r() * 4);
      const hs: BlockHash[] = [];
      for (let i = 0; i < n; i++) hs.push(("h" + base + "." + i) as BlockHash);
      return hs;
    };
    for (let step = 0; step < 150; step++) {
      const ek = eks[Math.floor(r() * eks.length)];
      const x = r();
      const where = `seed ${seed} step ${step}`;
      if (x < 0.45) {
        const hs = chain(1 + Math.floor(r() * 30));
        const ehs = hs.map((h) => ("e" + h + "." + Math.floor(r() * 2)) as EngineHash);
        let want = 0;
        for (let i = 0; i < hs.length; i++) if (ref.store(ek, ehs[i], hs[i])) want++;
        for (let i = 0; i < hs.length; i++) now.store(ek, ehs[i], hs[i]);
        assert.equal(lazy.storeRun!(ek, ehs, hs), want, where);
      } else if (x < 0.6) {
        const e = ("eh" + Math.floor(r() * 4) + "." + Math.floor(r() * 30) + "." + Math.floor(r() * 2)) as EngineHash;
        const want = ref.remove(ek, e);
        assert.equal(now.remove(ek, e), want, where);
        assert.equal(lazy.remove(ek, e), want, where);
      } else if (x < 0.7) {
        const want = ref.evictOldest(ek);
        assert.equal(now.evictOldest(ek), want, where);
        assert.equal(lazy.evictOldest(ek), want, where);
      } else if (x < 0.8) {
        if (lazy.entries(ek) > 6) deferred++;
        ref.clear(ek);
        now.clear(ek);
        lazy.clear(ek);
      } else {
        if (lazy.unswept!() > 0) sweptSteps++;
        lazy.sweep!(1 + Math.floor(r() * 8));
      }
      for (const t of eks) {
        assert.equal(lazy.count(t), ref.count(t), `${where}: count ${t}`);
        assert.equal(lazy.entries(t), ref.entries(t), `${where}: entries ${t}`);
        for (let i = 0; i < 30; i += 7) {
          const e = ("eh" + (step % 4) + "." + i + ".0") as EngineHash;
          assert.equal(lazy.lookup(t, e), ref.lookup(t, e), `${where}: lookup ${t} ${e}`);
        }
      }
      for (let base = 0; base < 4; base++) {
        const hs: BlockHash[] = [];
        for (let i = 0; i < 30; i++) hs.push(("h" + base + "." + i) as BlockHash);
        const want = ref.prefixHits(hs, live, weights);
        assert.deepEqual(lazy.prefixHits(hs, live, weights), want, `${where}: prefix ${base}`);
        assert.deepEqual(lazy.prefixHits(hs, live), ref.prefixHits(hs, live), `${where}: GPU prefix ${base}`);
        // A stale holder the filter hid: the raw list names a target whose current generation holds nothing there.
        if (
          lazy.unswept!() > 0 &&
          (lazySt.get("M:" + hs[0]) || "").split(",").some((t) => !(lazy.count(t as EpochKey) > 0))
        )
          hidden++;
      }
    }
    // Swept to the end (bounded: each call walks at least one slot of what is left).
    for (let i = 0; i < 10000 && lazy.unswept!() > 0; i++) lazy.sweep!(6);
    lazy.sweep!(6);
    assert.equal(lazy.unswept!(), 0);
    assert.equal(lazySt.get("MGY"), undefined, `seed ${seed}: graveyard empty`);
    assert.equal(dump(lazySt), dump(nowSt), `seed ${seed}: the keys of an immediate clear`);
  }
  // The cases the comparison is for did occur.
  assert.ok(
    deferred > 100 && sweptSteps > 100 && hidden > 50,
    `deferred ${deferred}, swept ${sweptSteps}, hidden ${hidden}`,
  );
});

test("a clear of a large mirror costs the call a bounded number of store operations; sweeps take the rest a step at a time", () => {
  const inner = memStore();
  let ops = 0;
  const st: Store = {
    ...inner,
    set: (k, v) => (ops++, inner.set(k, v)),
    del: (k) => (ops++, inner.del(k)),
    incr: (k, d) => (ops++, inner.incr(k, d)),
    delNum: (k) => (ops++, inner.delNum(k)),
  };
  const m = keyedMirror(st, 100);
  const ek = "w#1" as EpochKey;
  const hs: BlockHash[] = [];
  const ehs: EngineHash[] = [];
  for (let i = 0; i < 5000; i++) {
    hs.push(("b" + i) as BlockHash);
    ehs.push(("e" + i) as EngineHash);
  }
  m.storeRun!(ek, ehs, hs);
  m.storeRun!("v#2" as EpochKey, ehs.slice(0, 10), hs.slice(0, 10));
  ops = 0;
  m.clear(ek);
  assert.ok(ops <= 4, `the clear itself: ${ops} writes`);
  assert.equal(m.count(ek), 0);
  assert.equal(m.lookup(ek, ehs[0]), undefined);
  assert.deepEqual(m.prefixHits(hs.slice(0, 20), { "w#1": true, "v#2": true }), { "v#2": 10 });
  assert.equal(m.unswept!(), 5000);
  // The worker stores again at once: its new blocks count, the old ones do not.
  m.storeRun!(ek, ehs.slice(0, 3), hs.slice(0, 3));
  assert.deepEqual(m.prefixHits(hs.slice(0, 20), { "w#1": true, "v#2": true }), { "w#1": 3, "v#2": 10 });
  let sweeps = 0;
  let most = 0;
  for (; sweeps < 200 && m.unswept!() > 0; sweeps++) {
    ops = 0;
    m.sweep!(100);
    most = Math.max(most, ops);
  }
  assert.equal(m.unswept!(), 0);
  assert.equal(sweeps, 50, "5000 blocks, 100 a sweep");
  // About ten operations a block, never a whole mirror's worth in one call.
  assert.ok(most <= 100 * 10, `the largest sweep: ${most} writes`);
  assert.equal(inner.keys("ME:w#1:").length + inner.keys("MR:w#1:").length, 0, "generation 0's keys are gone");
  assert.equal(inner.keys("ME:w#1~1:").length, 3);
  assert.deepEqual(m.prefixHits(hs.slice(0, 20), { "w#1": true, "v#2": true }), { "w#1": 3, "v#2": 10 });
  assert.equal(inner.get("M:" + hs[1]), "w#1,v#2", "a block the new generation holds keeps its holder");
  assert.equal(inner.get("M:" + hs[5]), "v#2");
  assert.equal(inner.get("M:" + hs[50]), undefined);
});

test("a clear that finds no room for the graveyard or the new generation (full zones) is done in the call", () => {
  for (const full of ["MGY", "MG:w#1"]) {
    const inner = memStore();
    const st: Store = {
      ...inner,
      set: (k, v) => {
        if (k === full) throw new Error("SharedMemoryError: no memory");
        inner.set(k, v);
      },
      incr: (k, d) => {
        if (k === full) throw new Error("SharedMemoryError: no memory");
        return inner.incr(k, d);
      },
    };
    const m = keyedMirror(st, 10);
    const hs: BlockHash[] = [];
    const ehs: EngineHash[] = [];
    for (let i = 0; i < 100; i++) {
      hs.push(("b" + i) as BlockHash);
      ehs.push(("e" + i) as EngineHash);
    }
    m.storeRun!("w#1" as EpochKey, ehs, hs);
    m.clear("w#1" as EpochKey);
    assert.equal(m.count("w#1" as EpochKey), 0, full);
    assert.equal(m.unswept!(), 0, full);
    assert.equal(inner.get("MGY"), undefined, `${full}: no graveyard entry`);
    assert.deepEqual(
      inner.keys("").filter((k) => /^(M|ME|MR|MQ|MQP):/.test(k)),
      [],
      `${full}: every key of the mirror gone`,
    );
  }
});
