// The speed model (core/latency.ts) and its place in the pick: learned from
// first tokens alone, typical until it knows, still on a uniform fleet.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { attentionWork, latencyModel } from "../../core/latency";
import { createRouter, defaultConfig } from "../../core/router";
import { memoryState } from "../../core/state/memory";
import { BlockHash, EpochKey } from "../../core/types";

const ek = (s: string) => s as unknown as EpochKey;
/** A worker's true first-token time: its speed factor times an engine line, with +-noise. */
function engine(k: number, noise: number, seed: number) {
  let s = seed;
  const rnd = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 8) / (1 << 24);
  return (tokens: number, running: number) => k * (6 + 0.035 * tokens + 1.5 * running) * (1 + noise * (2 * rnd() - 1));
}

test("typical until learned: no prediction and slowness 1 before minSamples", () => {
  const m = latencyModel();
  assert.equal(m.predict(ek("a"), 1000, 0), null);
  m.observe(ek("a"), 1000, 0, 40);
  m.observe(ek("b"), 1000, 0, 400);
  assert.deepEqual(m.slowness([ek("a"), ek("b")]), { a: 1, b: 1 });
});

test("a 3x faster worker is learned from its first tokens; predictions land within 15%", () => {
  const m = latencyModel();
  const ws = {
    fast: engine(1, 0.15, 1),
    s1: engine(3, 0.15, 2),
    s2: engine(3, 0.15, 3),
    s3: engine(3, 0.15, 4),
  } as Record<string, ReturnType<typeof engine>>;
  let errs = 0;
  let n = 0;
  for (let i = 0; i < 60; i++)
    for (const [id, f] of Object.entries(ws)) {
      const tokens = 200 + ((i * 997 + id.length * 131) % 6000);
      const running = (i * 7 + id.length) % 12;
      const ms = f(tokens, running);
      const p = m.predict(ek(id), tokens, running);
      if (p !== null && i >= 20) {
        errs += Math.abs(p - ms) / ms;
        n++;
      }
      m.observe(ek(id), tokens, running, ms);
    }
  const s = m.slowness(Object.keys(ws).map(ek));
  assert.ok(Math.abs(s.fast - 1 / 3) < 0.05, `fast ${s.fast}`);
  assert.deepEqual([s.s1, s.s2, s.s3], [1, 1, 1]);
  assert.ok(errs / n < 0.15, `MAPE ${errs / n}`);
  assert.ok(Math.abs(m.msPerToken(ek("s1"))! / m.msPerToken(ek("fast"))! - 3) < 0.45, "per-token times 3:1");
  m.forget(ek("fast"));
  assert.equal(m.slowness(Object.keys(ws).map(ek)).fast, 1, "a worker that left starts over");
});

test("a 3x faster worker is priced as fast from a warm-up's worth of widely varying first tokens", () => {
  // bench:policy-sim --warmup --speeds 1,0.3333,0.3333,0.3333: after 16 warm-up
  // requests the fast worker had 6 first tokens, from 0.15x to 1.3x a slow
  // worker's time (its warm-up prompts queued behind each other), and the slow
  // ones 3 or 4 each. It must already count as fast when the next prompts are placed.
  const m = latencyModel();
  const line = (tokens: number) => 6 + 0.035 * tokens;
  const sizes = [500, 2000, 4000, 8000];
  for (const [w, n] of [
    ["s1", 3],
    ["s2", 3],
    ["s3", 4],
  ] as [string, number][])
    for (let i = 0; i < n; i++) {
      const tokens = sizes[(i + w.length) % 4];
      m.observe(ek(w), tokens, 0, 3 * line(tokens));
    }
  const mult = [0.15, 1.3, 0.2, 1.0, 0.3, 0.9];
  for (let i = 0; i < mult.length; i++) m.observe(ek("fast"), sizes[i % 4], 0, mult[i] * 3 * line(sizes[i % 4]));
  const s = m.slowness(["fast", "s1", "s2", "s3"].map(ek));
  assert.ok(s.fast < 0.75, `fast ${s.fast}`);
  assert.deepEqual([s.s1, s.s2, s.s3], [1, 1, 1]);
});

test("a uniform fleet stays at 1 despite noise and uneven load", () => {
  const m = latencyModel();
  const ws = [engine(1, 0.25, 5), engine(1, 0.25, 6), engine(1, 0.25, 7), engine(1, 0.25, 8)];
  for (let i = 0; i < 200; i++)
    ws.forEach((f, w) => {
      const running = w * 5 + (i % 4); // worker 3 always carries the most decodes
      const tokens = 100 + ((i * 613 + w * 97) % 4000);
      m.observe(ek(`w${w}`), tokens, running, f(tokens, running));
    });
  assert.deepEqual(m.slowness(["w0", "w1", "w2", "w3"].map(ek)), { w0: 1, w1: 1, w2: 1, w3: 1 });
});

test("the pick prices work in time: a cold prompt goes to the fast worker even with a queue there", () => {
  for (const speedLearning of ["on", "off"] as const) {
    let clock = 0;
    const router = createRouter(memoryState(), { ...defaultConfig(), speedLearning }, { now: () => clock });
    router.addWorker({ id: "fast", address: "127.0.0.1:1", role: "mixed" });
    router.addWorker({ id: "slow", address: "127.0.0.1:2", role: "mixed" });
    const prompt = (p: string, n: number) => ({
      blocks: Array.from({ length: n }, (_, i) => `${p}${i}` as BlockHash),
      inputTokens: n * 16,
      exact: true,
      mediaHashes: [],
      n: 1,
    });
    // Teach it: each worker serves alone, the slow one 3x slower per token.
    for (let i = 0; i < 6; i++)
      for (const [id, k] of [
        ["fast", 1],
        ["slow", 3],
      ] as const) {
        const allow = (w: { id: string }) => w.id === id;
        const pick = router.pick(prompt(`t${id}${i}`, 40 + i * 20), null, allow);
        clock += k * (5 + 0.035 * (40 + i * 20) * 16);
        pick.reservation.firstToken();
        pick.reservation.finish();
      }
    // The fast worker is busy with a 100-block prefill; the slow one is idle.
    const busy = router.pick(prompt("busy", 100), null, (w) => w.id === "fast");
    const cold = router.pick(prompt("cold", 100));
    assert.equal(cold.target.id, speedLearning === "on" ? "fast" : "slow", `speed-learning ${speedLearning}`);
    busy.reservation.finish();
    cold.reservation.finish();
  }
});

/**
 * A vLLM-like first token: linear layers per token, attention over the context
 * (quadratic in a long prompt), a step cost per running request; times k.
 */
function attnEngine(k: number) {
  return (own: number, cached: number, running: number) =>
    k * (6 + 0.035 * own + (0.001 * own * (cached + own / 2)) / 1000 + 1.5 * running);
}

test("uniform fleet, uneven prompt lengths: every worker typical, and each predicts any length within 10%", () => {
  const m = latencyModel();
  const f = attnEngine(1);
  // Worker a holds the long documents (30k-60k tokens, computed cold), b the short cached turns, c and d a mix.
  for (let i = 0; i < 120; i++) {
    const long = 30000 + ((i * 7919) % 30000);
    const short = 200 + ((i * 613) % 1500);
    const mid = 2000 + ((i * 131) % 8000);
    const obs: [string, number, number, number][] = [
      ["a", long, 0, i % 3],
      ["b", short, 8000, 4 + (i % 5)],
      ["c", mid, (i % 2) * 4000, i % 6],
      ["d", i % 2 ? long / 2 : short, 2000, 2],
    ];
    for (const [id, own, cached, running] of obs)
      m.observe(ek(id), own, running, f(own, cached, running), attentionWork(own, cached));
  }
  assert.deepEqual(m.slowness(["a", "b", "c", "d"].map(ek)), { a: 1, b: 1, c: 1, d: 1 });
  // Any worker's prediction for any length, from the fleet fit: a long prompt on b, a short one on a.
  for (const [id, own, cached] of [
    ["b", 50000, 0],
    ["a", 800, 8000],
    ["c", 20000, 4000],
  ] as const) {
    const p = m.predict(ek(id), own, 1, attentionWork(own, cached))!;
    const truth = f(own, cached, 1);
    assert.ok(Math.abs(p - truth) / truth < 0.1, `${own} tokens on ${id}: predicted ${p}, took ${truth}`);
  }
});

test("one outlier moves a factor a bounded step; slowness stays within [1/8, 8]", () => {
  const m = latencyModel();
  const f = attnEngine(1);
  for (let i = 0; i < 40; i++)
    for (const id of ["a", "b", "c"]) {
      const own = 1000 + ((i * 997 + id.charCodeAt(0)) % 3000);
      m.observe(ek(id), own, 1, f(own, 0, 1), attentionWork(own, 0));
    }
  // One request on a stalls 100x (a GC pause, a hiccup): a stays typical.
  m.observe(ek("a"), 2000, 1, 100 * f(2000, 0, 1), attentionWork(2000, 0));
  assert.equal(m.slowness(["a", "b", "c"].map(ek)).a, 1);
  // A worker that is 20x slower on every request reads as slow, but bounded.
  for (let i = 0; i < 48; i++) m.observe(ek("z"), 2000, 1, 20 * f(2000, 0, 1), attentionWork(2000, 0));
  const s = m.slowness(["a", "b", "c", "z"].map(ek));
  assert.ok(s.z > 3 && s.z <= 8, `z ${s.z}`);
});

/** A router on a virtual clock whose speed model records what each first token was timed against. */
function timedRouter() {
  const clock = { t: 0 };
  const state = memoryState();
  const router = createRouter(state, { ...defaultConfig(), speedLearning: "on" }, { now: () => clock.t });
  router.addWorker({ id: "w", address: "127.0.0.1:1", role: "mixed" });
  const seen: { tokens: number; queued: number; running: number; ms: number }[] = [];
  const lm = router.latency!;
  const observe = lm.observe.bind(lm);
  lm.observe = (e, tokens, running, ms, attention, queued) => {
    seen.push({ tokens, queued: queued || 0, running, ms });
    observe(e, tokens, running, ms, attention, queued);
  };
  const prompt = (p: string, n: number) => ({
    blocks: Array.from({ length: n }, (_, i) => `${p}${i}` as BlockHash),
    inputTokens: n * 16,
    exact: true,
    mediaHashes: [],
    n: 1,
  });
  return { clock, state, router, seen, prompt };
}

test("queued prefill ahead is what was sent to the worker, not requests still waiting at the router", () => {
  const { router, seen, prompt } = timedRouter();
  // a is sent (100 blocks prefilling in the engine); b is picked but waits at
  // the router (prefill admission); c is sent at once behind a only.
  const a = router.pick(prompt("a", 100));
  a.reservation.dispatched();
  const b = router.pick(prompt("b", 200));
  const c = router.pick(prompt("c", 10));
  c.reservation.dispatched();
  a.reservation.firstToken();
  c.reservation.firstToken();
  assert.equal(seen.length, 2);
  // running: the load guards held there at the pick (a's and b's, each a request's blocks and its queued prefill).
  assert.deepEqual(seen[1], { tokens: 110 * 16, queued: 100 * 16, running: 4, ms: 0 }, "c waited for a alone");
  // Once a and c have their first tokens nothing is ahead: b, sent now, queues behind nothing.
  b.reservation.dispatched();
  b.reservation.firstToken();
  assert.equal(seen[2].queued, 0);
  assert.equal(seen[2].tokens, 200 * 16);
  for (const p of [a, b, c]) p.reservation.finish();
  // A request that ended before its first token is no longer ahead of anyone.
  const d = router.pick(prompt("d", 50));
  d.reservation.dispatched();
  d.reservation.finish();
  const e = router.pick(prompt("e", 5));
  e.reservation.dispatched();
  e.reservation.firstToken();
  assert.equal(seen[3].queued, 0);
  e.reservation.finish();
});

test("after a wait at the router a request is timed from when it left, against the prefix computed meanwhile", () => {
  const { clock, state, router, seen, prompt } = timedRouter();
  const w = router.worker("w")!;
  const doc = prompt("doc", 100);
  // The document's first request prefills it; a second request on the same
  // document (plus 2 blocks of its own) waits at the router meanwhile.
  const first = router.pick(doc);
  first.reservation.dispatched();
  const turn = prompt("doc", 102);
  const second = router.pick(turn);
  clock.t = 300;
  // The document's blocks are in the worker's cache now (its KV events).
  for (const h of doc.blocks) state.mirror.store(w.epochKey, "e-" + h, h);
  first.reservation.firstToken();
  second.reservation.dispatched();
  clock.t = 320;
  second.reservation.firstToken();
  // Its own prefill is the 2 blocks past the cached document, nothing is ahead
  // of it, the first request (its queued prefill done) holds one guard, and the clock started when it left.
  assert.deepEqual(seen[1], { tokens: 2 * 16, queued: 0, running: 1, ms: 20 });
  first.reservation.finish();
  second.reservation.finish();
});
