// The default policy's inputs are true to the moment of the pick (issue 11):
// requests in flight are cache before any KV event reports them, blocks a
// request shares with running ones are not load, and prefill queued on a
// worker delays it. Costs below are worked at weight 1 unless a test says otherwise.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { mk, blocks, cache, feats } from "./helpers";

test("in-flight requests count as cache before any KV event: same-prefix requests follow the first once it streams", () => {
  const { r } = mk([{ id: "a" }, { id: "b" }, { id: "c" }]);
  const prompt = blocks("doc", 150);
  const first = r.pick(feats([...prompt, ...blocks("q0", 2)]));
  first.reservation.firstToken();
  for (let i = 1; i <= 3; i++) {
    const p = r.pick(feats([...prompt, ...blocks("q" + i, 2)]));
    assert.equal(p.target.id, first.target.id, `question ${i}`);
    assert.equal(p.candidates.find((c) => c.id === first.target.id)!.hits, 150);
    p.reservation.firstToken();
  }
});

test("a prefix shared with running requests is not load: the busy worker holding it beats an idle cold one", () => {
  const { st, r } = mk([{ id: "a" }, { id: "b" }], { overlapWeight: 1 });
  const prompt = blocks("sys", 100);
  cache(st, r, "a", prompt);
  const running = [0, 1, 2].map((i) => {
    const p = r.pick(feats([...prompt, ...blocks("u" + i, 3)]));
    p.reservation.firstToken();
    return p;
  });
  assert.ok(running.every((p) => p.target.id === "a"));
  assert.equal(r.activeBlocks("a"), 109);
  const next = r.pick(feats([...prompt, ...blocks("u9", 3)]));
  const byId = Object.fromEntries(next.candidates.map((c) => [c.id, c.cost]));
  assert.equal(byId.a, 3 + 9, "3 uncached + 9 unshared in-flight blocks");
  assert.equal(byId.b, 103);
  assert.equal(next.target.id, "a");
  for (const p of [...running, next]) p.reservation.finish();
  assert.equal(r.openGuards(), 0);
});

test("prefill queued on a worker counts until the first token", () => {
  const { st, r } = mk([{ id: "b" }, { id: "a" }], { overlapWeight: 1 });
  const prompt = blocks("ctx", 40);
  cache(st, r, "a", prompt);
  // a long unrelated prompt is still prefilling on b (held there: a is busy while it is picked)
  const hold = r.pick(feats(prompt));
  assert.equal(hold.target.id, "a");
  const long = r.pick(feats(blocks("long", 300)));
  assert.equal(long.target.id, "b", "the cold long prompt goes to the idle worker");
  hold.reservation.finish();
  const big = r.pick(feats([...prompt, ...blocks("x", 1)]));
  assert.equal(big.target.id, "a");
  // while `big` (1 uncached block) is queued on a, b is queued with 300
  const q = r.pick(feats(blocks("cold", 20)));
  const cost = Object.fromEntries(q.candidates.map((c) => [c.id, c.cost]));
  assert.equal(cost.b, 20 + 300 / 2 + 300, "20 own + 300 queued at half price + 300 in flight");
  assert.equal(cost.a, 20 + 1 / 2 + 41);
  long.reservation.firstToken();
  const after = r.pick(feats(blocks("cold2", 20)));
  assert.equal(
    Object.fromEntries(after.candidates.map((c) => [c.id, c.cost])).b,
    20 + 300,
    "queue released at the first token",
  );
  for (const p of [long, big, q, after]) p.reservation.finish();
  assert.equal(r.openGuards(), 0);
});

test("weight 0 stays pure load balance: no cache, no in-flight prefix pulls", () => {
  const { st, r } = mk([{ id: "a" }, { id: "b" }], { overlapWeight: 0 });
  const prompt = blocks("p", 50);
  cache(st, r, "a", prompt);
  const one = r.pick(feats(prompt));
  one.reservation.firstToken();
  const two = r.pick(feats(prompt));
  assert.deepEqual(Object.fromEntries(two.candidates.map((c) => [c.id, c.cost])), {
    [one.target.id]: 50,
    [one.target.id === "a" ? "b" : "a"]: 0,
  });
  assert.notEqual(two.target.id, one.target.id);
});

test("prompts under one block and non-LLM calls balance by requests in flight, not worker order", () => {
  const { r } = mk([{ id: "a" }, { id: "b" }, { id: "c" }]);
  const held = Array.from({ length: 60 }, () => r.pick(feats([])));
  const per = Object.fromEntries(["a", "b", "c"].map((id) => [id, held.filter((p) => p.target.id === id).length]));
  assert.deepEqual(per, { a: 20, b: 20, c: 20 });
  for (const p of held) p.reservation.finish();
  assert.equal(r.openGuards(), 0);
});

test("default weight: a question follows its cached document unless the holder's prefill backlog costs more than recomputing it", () => {
  const doc = blocks("doc", 250);
  const run = (backlog: number, cfg: { overlapWeight?: number } = {}) => {
    const { st, r } = mk([{ id: "a" }, { id: "b" }], cfg);
    cache(st, r, "a", doc);
    cache(st, r, "b", blocks("other", 400)); // b holds more cache (no tie-break weight: the rotation starts at a)
    const busy = r.pick(feats(blocks("big", backlog)));
    assert.equal(busy.target.id, "a", `a cold ${backlog}-block prompt starts prefilling on a`);
    return r.pick(feats([...doc, ...blocks("q", 2)])).target.id;
  };
  // Weight 8: a costs 8 x 2 uncached + the backlog in flight + 4 x the queued backlog; b costs 8 x 252.
  assert.equal(run(100), "a", "a short backlog: the question follows its document");
  assert.equal(run(250), "a", "a backlog as long as the document: a copy starts no sooner and costs b the document");
  assert.equal(run(420), "b", "a backlog well past the document: recomputing it elsewhere starts sooner");
  assert.equal(run(250, { overlapWeight: 1 }), "b", "weight 1 sends it away sooner still");
  assert.equal(run(30, { overlapWeight: 1 }), "a");
});
