// The key-encoded mirror stores a BlockStored event's blocks as one run
// (storeRun: the run's counters moved once, an add per block where the
// backend has one) for the njs push handler, whose shared-dict writes each
// cost a round trip. The keys it leaves must be exactly those of storing the
// blocks one by one, whatever the run holds: new blocks, blocks already
// there, an engine hash moving to another of our hashes, a hash held by
// several engine blocks, an engine hash twice in one run, with removals,
// evictions and clears in between.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { keyedMirror } from "../../core/state/keyed";
import { memStore, Store } from "../../core/store";
import { BlockHash, EngineHash, EpochKey } from "../../core/types";
import { rng } from "../render-corpus";

/** memStore with add() (as njs's shared dict has it), or without (callers read first). */
function store(withAdd: boolean): { st: Store; dump: () => string } {
  const st = memStore();
  if (withAdd)
    st.add = (k, v) => {
      if (st.get(k) !== undefined) return false;
      st.set(k, v);
      return true;
    };
  return {
    st,
    dump: () => {
      const ks = st.keys("").sort();
      return JSON.stringify(ks.map((k) => [k, st.get(k) ?? null, st.num(k)]));
    },
  };
}

test("storeRun leaves the same keys and returns the same count as store() block by block", () => {
  let runs = 0;
  let moved = 0;
  let twice = 0;
  for (const withAdd of [true, false]) {
    for (let seed = 1; seed <= 60; seed++) {
      const r = rng(seed);
      const one = store(false);
      const many = store(withAdd);
      const a = keyedMirror(one.st);
      const b = keyedMirror(many.st);
      const eks = ["w#1", "w#1|CPU", "v#2"] as EpochKey[];
      // Small pools, so runs meet blocks already stored, engine hashes move and hashes are shared.
      const eh = () => ("e" + Math.floor(r() * 40)) as EngineHash;
      const h = () => ("h" + Math.floor(r() * 30)) as BlockHash;
      for (let step = 0; step < 80; step++) {
        const ek = eks[Math.floor(r() * eks.length)];
        const x = r();
        if (x < 0.6) {
          const n = 1 + Math.floor(r() * 12);
          const ehs: EngineHash[] = [];
          const hs: BlockHash[] = [];
          for (let i = 0; i < n; i++) {
            ehs.push(eh());
            hs.push(h());
            const prev = a.lookup(ek, ehs[i]);
            if (prev !== undefined && prev !== hs[i]) moved++;
          }
          if (new Set(ehs).size < ehs.length) twice++;
          let want = 0;
          for (let i = 0; i < n; i++) if (a.store(ek, ehs[i], hs[i])) want++;
          assert.equal(b.storeRun!(ek, ehs, hs), want, `seed ${seed} step ${step}: new hashes`);
          runs++;
        } else if (x < 0.85) {
          const e = eh();
          assert.equal(b.remove(ek, e), a.remove(ek, e));
        } else if (x < 0.97) {
          assert.equal(b.evictOldest(ek), a.evictOldest(ek));
        } else {
          a.clear(ek);
          b.clear(ek);
        }
        assert.equal(many.dump(), one.dump(), `seed ${seed} step ${step} (add ${withAdd})`);
      }
    }
  }
  // The cases the comparison is for did occur.
  assert.ok(runs > 1000 && moved > 50 && twice > 50, `runs ${runs}, moved ${moved}, twice ${twice}`);
});
