// The plugin timer core runs the pipeline with (core/scheduling/framework.ts):
// every filter, the data stage, each weighted scorer, the picker and each
// lifecycle hook observed once per run with the injected clock's time; a
// re-registered plugin is the one timed; no timer, no observation.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { picker, PluginKind, register, setPluginTimer } from "../../core/scheduling/framework";
import { blocks, cache, feats, mk } from "./helpers";

after(() => setPluginTimer(null));

function recorder() {
  const seen: { kind: PluginKind; plugin: string; seconds: number }[] = [];
  let t = 0;
  // A clock that advances 2 ms per read: every plugin run spans exactly one step.
  setPluginTimer({ now: () => (t += 2), observe: (kind, plugin, seconds) => seen.push({ kind, plugin, seconds }) });
  const count = (kind: PluginKind, plugin: string) => seen.filter((s) => s.kind === kind && s.plugin === plugin).length;
  return { seen, count };
}

test("each plugin run is observed once, with the clock's time in seconds", () => {
  const { seen, count } = recorder();
  const { st, r } = mk([{}, {}]);
  cache(st, r, "w1", blocks("a", 4));
  const N = 3;
  for (let i = 0; i < N; i++) {
    const p = r.pick(feats(blocks("a", 4)));
    assert.equal(p.target.id, "w1");
    p.reservation.firstToken();
    p.reservation.finish();
  }
  for (const f of ["usable", "role-pool", "model"]) assert.equal(count("filter", f), N, f);
  assert.equal(count("data", "candidate-data"), N);
  assert.equal(count("scorer", "prefix-overlap"), N);
  assert.equal(count("scorer", "active-blocks"), N);
  assert.equal(count("scorer", "image-affinity"), 0, "a scorer with weight 0 does not run");
  assert.equal(count("picker", "kv-aware"), N);
  // preRequest, firstToken and complete.
  assert.equal(count("lifecycle", "load-reservation"), 3 * N);
  for (const s of seen) assert.equal(s.seconds, 0.002, `${s.kind} ${s.plugin}`);
  setPluginTimer(null);
  const before = seen.length;
  r.pick(feats(blocks("a", 4))).reservation.finish();
  assert.equal(seen.length, before, "no timer: nothing observed");
});

test("a picker registered again under its name is the one that runs, timed", () => {
  const original = picker("random");
  const { count } = recorder();
  const { r } = mk([{}, {}, {}], { policy: "random" });
  try {
    // The registered one (random at 0.99) picks the last worker, timed.
    assert.equal(r.pick(feats(blocks("b", 2))).target.id, "w2");
    register.picker({ name: "random", pick: () => 0 });
    for (let i = 0; i < 2; i++) assert.equal(r.pick(feats(blocks("b", 2))).target.id, "w0");
    assert.equal(count("picker", "random"), 3);
    assert.equal(count("scorer", "prefix-overlap"), 0, "random runs no scorers");
  } finally {
    register.picker(original);
    setPluginTimer(null);
  }
  assert.equal(picker("random"), original);
});

test("a lifecycle plugin registered while timed is run and timed from the next pick on", () => {
  const { count } = recorder();
  const { r } = mk([{}, {}]);
  try {
    r.pick(feats(blocks("c", 2))).reservation.finish();
    let ran = 0;
    register.lifecycle({ name: "t-count", preRequest: () => void ran++ });
    r.pick(feats(blocks("c", 2))).reservation.finish();
    assert.equal(ran, 1);
    assert.equal(count("lifecycle", "t-count"), 1);
  } finally {
    setPluginTimer(null);
  }
});
