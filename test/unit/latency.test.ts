// The speed model (core/latency.ts) and its place in the pick: learned from
// first tokens alone, typical until it knows, still on a uniform fleet.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { latencyModel } from "../../core/latency";
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
