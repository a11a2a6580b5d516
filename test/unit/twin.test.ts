// The replica of each worker's step scheduler (core/twin.ts) in the router,
// against the engine model the simulator runs (sim/model.ts) in virtual time:
// the router sends, the engine steps, first tokens and ends come back to the
// router as they would over the wire. What the prediction error metric
// reports (onTiming: the prediction made when the request left, and the
// observed dispatch-to-first-token time) is what these tests check.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { createRouter, defaultConfig, Router } from "../../core/router";
import { memoryState } from "../../core/state/memory";
import { BlockHash } from "../../core/types";
import { atSpeed, EngineModel, llama8bH100, StepPlan } from "../../sim/model";
import { referenceStepMs, stepTwin } from "../../core/twin";

/** The calibrated engine at a share of its speed, as bench:policy-sim's --speeds. */
function engineAt(speed: number) {
  return atSpeed(llama8bH100(), speed);
}

interface Timing {
  id: string;
  worker: string;
  predicted: number | null;
  ms: number;
}

/** Engines at `speeds` behind one router with speed learning on, stepped in virtual time. */
function fleet(speeds: number[]) {
  let clock = 0;
  let current = "";
  const timings: Timing[] = [];
  const router: Router = createRouter(
    memoryState(),
    { ...defaultConfig(), speedLearning: "on" },
    {
      now: () => clock,
      onTiming: (worker, predicted, ms) => timings.push({ id: current, worker, predicted, ms }),
    },
  );
  const ids = speeds.map((_, i) => `w${i}`);
  for (let i = 0; i < ids.length; i++)
    router.addWorker({ id: ids[i], address: `127.0.0.1:${9000 + i}`, role: "mixed" });
  const engines = speeds.map((s) => new EngineModel(engineAt(s)));
  const plans: (StepPlan | null)[] = speeds.map(() => null);
  const ends: number[] = speeds.map(() => Infinity);
  const live = new Map<string, ReturnType<Router["pick"]>["reservation"]>();
  let n = 0;
  const kick = (w: number) => {
    if (plans[w]) return;
    const p = engines[w].schedule();
    plans[w] = p;
    ends[w] = p ? clock + p.ms : Infinity;
  };
  /** Sends a prompt of `tokens` that shares nothing to worker w (decoding `maxTokens`). */
  const send = (w: number, tokens: number, maxTokens = 4) => {
    const id = `r${n++}`;
    const blocks = Array.from({ length: Math.floor(tokens / 16) }, (_, i) => `${id}-${i}` as BlockHash);
    const pick = router.pick(
      { blocks, inputTokens: tokens, exact: true, mediaHashes: [], n: 1 },
      null,
      (x) => x.id === ids[w],
    );
    assert.equal(pick.target.id, ids[w]);
    pick.reservation.dispatched();
    engines[w].add({ id, tokens: new Array(tokens).fill(7), hashes: [], maxTokens });
    live.set(id, pick.reservation);
    kick(w);
    return id;
  };
  /** Runs every engine's steps that end by `t`, then moves the clock to `t`. */
  const runUntil = (t: number) => {
    for (let guard = 0; guard < 1e6; guard++) {
      let i = 0;
      for (let k = 1; k < ends.length; k++) if (ends[k] < ends[i]) i = k;
      if (ends[i] > t) break;
      clock = ends[i];
      const out = engines[i].complete(plans[i]!);
      plans[i] = null;
      for (const o of out) {
        const r = live.get(o.id)!;
        if (o.index === 0) {
          current = o.id;
          r.firstToken();
        }
        if (o.done) {
          r.finish();
          live.delete(o.id);
        }
      }
      kick(i);
    }
    clock = Math.max(clock, t);
  };
  /** Requests of several sizes, one at a time on each worker: what it learns its step time from. */
  const warm = () => {
    for (const tokens of [1000, 3000, 6000, 500, 2000, 4000])
      for (let w = 0; w < speeds.length; w++) {
        send(w, tokens);
        runUntil(clock + 2000);
      }
  };
  const timing = (id: string) => timings.find((x) => x.id === id)!;
  const ape = (t: Timing) => Math.abs((t.predicted ?? NaN) - t.ms) / t.ms;
  return { router, send, runUntil, warm, timing, ape, timings, now: () => clock, ids };
}

test("a request behind a queue: the prediction is the queue drained by budgeted steps, then its own prefill", () => {
  const f = fleet([1]);
  f.warm();
  // Five prompts of 6,000 tokens at once (3.7 steps of the 8,192-token
  // budget), and 30 ms later a 2,000-token one: it waits for all of them.
  for (let k = 0; k < 5; k++) f.send(0, 6000, 16);
  f.runUntil(f.now() + 30);
  const probe = f.send(0, 2000);
  f.runUntil(f.now() + 10000);
  const t = f.timing(probe);
  assert.ok(t.ms > 500, `it waited for the queue: ${t.ms} ms`);
  assert.ok(t.predicted !== null && f.ape(t) < 0.1, `predicted ${t.predicted} ms, took ${t.ms} ms`);
});

test("a worker three times slower: its step time is learned from first tokens, and its predictions hold", () => {
  const f = fleet([1, 1 / 3]);
  f.warm();
  // The same queue on both, then a probe behind it.
  const probes: string[] = [];
  for (let w = 0; w < 2; w++) {
    for (let k = 0; k < 3; k++) f.send(w, 5000, 8);
    f.runUntil(f.now() + 5);
    probes.push(f.send(w, 3000));
  }
  f.runUntil(f.now() + 20000);
  const [a, b] = probes.map(f.timing);
  assert.ok(b.ms > 2.5 * a.ms, `the slow worker took ${b.ms} ms, the fast ${a.ms} ms`);
  for (const t of [a, b])
    assert.ok(t.predicted !== null && f.ape(t) < 0.1, `predicted ${t.predicted} ms, took ${t.ms} ms`);
  const twin = f.router.latency!.twin!;
  const fast = twin.factor(f.router.worker("w0")!.epochKey)!;
  const slow = twin.factor(f.router.worker("w1")!.epochKey)!;
  assert.ok(Math.abs(slow / fast - 3) < 0.3, `factors ${fast} and ${slow}`);
});

test("cold start: no prediction until the worker has three first tokens, then one", () => {
  const f = fleet([1]);
  const ek = f.router.worker("w0")!.epochKey;
  const twin = f.router.latency!.twin!;
  for (let k = 0; k < 3; k++) {
    assert.equal(twin.predict(ek, 1000, 0, f.now()), null);
    f.send(0, 1000 + 500 * k);
    f.runUntil(f.now() + 1000);
  }
  assert.ok(f.timings.length === 3 && f.timings.every((t) => t.predicted === null));
  const p = twin.predict(ek, 1000, 0, f.now());
  assert.ok(p !== null && p > 0);
});

test("the replica alone: a queue of three full budgets drains in three steps, a cancelled request leaves it", () => {
  const twin = stepTwin({ budget: 8192, minSamples: 1 });
  const ek = "w" as never;
  // Taught by one request alone: its first token after its one step.
  assert.equal(twin.factor(ek), null);
  const e = twin.sent(ek, 4096, 0, 0);
  twin.first(e, 200);
  twin.ended(e);
  const k = twin.factor(ek)!;
  assert.ok(k > 0);
  const idle = twin.predict(ek, 8192, 0, 1000)!;
  for (let i = 0; i < 3; i++) twin.sent(ek, 8192, 0, 1000);
  const behind = twin.predict(ek, 8192, 0, 1000)!;
  // Three full steps ahead, then its own: four times its time alone (attention aside, which grows with the chunk alone).
  assert.ok(Math.abs(behind / idle - 4) < 0.05, `alone ${idle} ms, behind three budgets ${behind} ms (factor ${k})`);
  const gone = twin.sent(ek, 8192, 0, 1000);
  twin.ended(gone);
  assert.equal(twin.predict(ek, 8192, 0, 1000), behind);
});

test("first tokens of one step: the later one is no reading, and the step's reading counts both prefills", () => {
  const twin = stepTwin({ budget: 8192, minSamples: 1 });
  const ek = "w" as never;
  const truth = 2;
  // Sent 1 ms apart to an idle worker. The replica puts the second a step
  // later (it was sent after the first's step began), but the wire held the
  // first back and the engine prefilled both in one step, 5 ms after the
  // first was sent; both first tokens come back within a millisecond.
  const a = twin.sent(ek, 4000, 0, 0);
  const b = twin.sent(ek, 4000, 0, 1);
  const step = truth * referenceStepMs(8000, 2 * 4000 * 2000, 0, 0);
  twin.first(a, 5 + step);
  twin.first(b, 5.5 + step);
  const k = twin.factor(ek)!;
  assert.ok(Math.abs(k / truth - 1) < 0.05, `factor ${k}, the engine's ${truth}`);
  twin.ended(a, 6 + step);
  twin.ended(b, 6 + step);
  // A prompt of the same size alone, later: the step time that factor prices.
  const p = twin.predict(ek, 8000, 0, 1000)!;
  const real = truth * referenceStepMs(8000, 8000 * 4000, 0, 0);
  assert.ok(Math.abs(p / real - 1) < 0.05, `predicted ${p} ms, the engine takes ${real} ms`);
});

test("a streamed chunk is a step's end: the decode phase a one-step request waits on", () => {
  const twin = stepTwin({ budget: 8192, minSamples: 1 });
  const ek = "w" as never;
  const a = twin.sent(ek, 4096, 0, 0);
  twin.first(a, 200);
  // a decodes from 200 on: steps of one decode, `s` ms each at the learned factor.
  const s = twin.factor(ek)! * referenceStepMs(0, 0, 1, 4096);
  // Its chunk came back 0.3 steps before now (the replica's own grid from
  // 200 put the step's end elsewhere): a request sent now waits the 0.7 step
  // left in flight, then its own step.
  const now = 200 + 40.5 * s;
  twin.tick(ek, now - 0.3 * s);
  const own = twin.factor(ek)! * referenceStepMs(16, 16 * 8, 1, 4096);
  const p = twin.predict(ek, 16, 0, now)!;
  assert.ok(
    Math.abs(p - (0.7 * s + own)) < 0.05 * s,
    `predicted ${p} ms, the step left ${0.7 * s} ms + its own ${own} ms`,
  );
  // A chunk older than the anchor, or with prefill waiting in the replica, moves nothing.
  twin.tick(ek, now - 5 * s);
  assert.equal(twin.predict(ek, 16, 0, now), p);
  twin.sent(ek, 2000, 0, now);
  const q = twin.predict(ek, 16, 0, now + 0.5 * s)!;
  twin.tick(ek, now + 0.5 * s);
  assert.equal(twin.predict(ek, 16, 0, now + 0.5 * s), q);
});

test("a streamed chunk reaches the replica through the request's reservation: predictions start from its step end", () => {
  let clock = 1000;
  const router = createRouter(memoryState(), { ...defaultConfig(), speedLearning: "on" }, { now: () => clock });
  router.addWorker({ id: "w0", address: "127.0.0.1:9000", role: "mixed" });
  const ek = router.worker("w0")!.epochKey;
  const twin = router.latency!.twin!;
  let n = 0;
  const send = (tokens: number) => {
    const id = `r${n++}`;
    const blocks = Array.from({ length: Math.floor(tokens / 16) }, (_, i) => `${id}-${i}` as BlockHash);
    const pick = router.pick({ blocks, inputTokens: tokens, exact: true, mediaHashes: [], n: 1 }, null, () => true);
    pick.reservation.dispatched();
    return pick.reservation;
  };
  // Three requests alone, each first token after its step at the reference's time: the factor is 1.
  for (const tokens of [1000, 3000, 2000]) {
    const r = send(tokens);
    clock += referenceStepMs(tokens, (tokens * tokens) / 2, 0, 0);
    r.firstToken();
    r.finish();
    clock += 1000;
  }
  assert.ok(Math.abs(twin.factor(ek)! - 1) < 1e-6);
  // A long decode: its first token anchors the replica at T, its steps take s.
  const long = send(1000);
  clock += referenceStepMs(1000, 500000, 0, 0);
  long.firstToken();
  const T = clock;
  const s = referenceStepMs(0, 0, 1, 1000);
  const own = referenceStepMs(16, 16 * 8, 1, 1000);
  clock = T + 10.3 * s;
  // From the anchor: the step in flight ends at T + 11 s, then its own step.
  assert.ok(Math.abs(twin.predict(ek, 16, 0, clock)! - (0.7 * s + own)) < 0.01 * s);
  // A chunk of the long decode came back at T + 9.6 s: a step ended there, so the one in flight ends at T + 10.6 s.
  clock = T + 9.6 * s;
  long.chunk();
  clock = T + 10.3 * s;
  const p = twin.predict(ek, 16, 0, clock)!;
  assert.ok(Math.abs(p - (0.3 * s + own)) < 0.01 * s, `predicted ${p} ms, expected ${0.3 * s + own} ms`);
});
