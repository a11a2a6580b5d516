// Prefill admission (core/admission.ts): one cold prefill per worker in flight,
// the rest in arrival order; warm requests pass; every exit frees exactly once.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { prefillAdmission } from "../../core/admission";

function recorder() {
  const went: string[] = [];
  return { went, go: (name: string) => () => went.push(name) };
}

test("a cold request waits while one is in flight on its worker, and goes in arrival order when the slot frees", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 512 });
  const r = recorder();
  const a = gate.enter("w0", 3000, r.go("a"));
  const b = gate.enter("w0", 3000, r.go("b"));
  const c = gate.enter("w0", 100, r.go("c-warm"));
  const d = gate.enter("w0", 5000, r.go("d"));
  const e = gate.enter("w1", 3000, r.go("e-other-worker"));
  assert.deepEqual(r.went, ["a", "c-warm", "e-other-worker"]);
  assert.equal(a.admitted && a.slot, true);
  assert.equal(b.admitted, false);
  assert.equal(c.admitted && !c.slot, true, "warm: admitted without a slot");
  assert.equal(gate.waiting("w0"), 2);
  assert.equal(gate.waiting(), 2);
  c.leave(); // a warm request's end frees nothing
  assert.deepEqual(r.went, ["a", "c-warm", "e-other-worker"]);
  a.leave();
  assert.deepEqual(r.went, ["a", "c-warm", "e-other-worker", "b"]);
  a.leave(); // idempotent: no second slot freed
  assert.deepEqual(r.went, ["a", "c-warm", "e-other-worker", "b"]);
  assert.equal(gate.busy("w0"), 1);
  b.leave();
  assert.deepEqual(r.went, ["a", "c-warm", "e-other-worker", "b", "d"]);
  d.leave();
  e.leave();
  assert.equal(gate.busy("w0") + gate.busy("w1") + gate.waiting(), 0);
});

test("a request that leaves while waiting is dropped from the queue and never goes", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 0 });
  const r = recorder();
  const a = gate.enter("w", 10, r.go("a"));
  const b = gate.enter("w", 10, r.go("b"));
  const c = gate.enter("w", 10, r.go("c"));
  b.leave();
  assert.equal(gate.waiting("w"), 1);
  a.leave();
  assert.deepEqual(r.went, ["a", "c"]);
  assert.equal(b.admitted, false);
  c.leave();
  assert.equal(gate.busy("w"), 0);
});

test("force admits a waiting request past the limit; its slot is given back like any other", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 0 });
  const r = recorder();
  const a = gate.enter("w", 10, r.go("a"));
  const b = gate.enter("w", 10, r.go("b"));
  const c = gate.enter("w", 10, r.go("c"));
  b.force();
  b.force();
  assert.deepEqual(r.went, ["a", "b"]);
  assert.equal(gate.busy("w"), 2);
  assert.equal(gate.waiting("w"), 1);
  a.leave(); // still one slot taken (b): c keeps waiting
  assert.deepEqual(r.went, ["a", "b"]);
  b.leave();
  assert.deepEqual(r.went, ["a", "b", "c"]);
  c.force(); // already admitted: nothing
  assert.deepEqual(r.went, ["a", "b", "c"]);
});

test("slots 0 turns admission off; more slots admit that many cold requests", () => {
  const off = prefillAdmission({ slots: 0, warmTokens: 0 });
  const r = recorder();
  for (let i = 0; i < 5; i++) off.enter("w", 10_000, r.go(String(i)));
  assert.equal(r.went.length, 5);
  assert.equal(off.waiting(), 0);
  const two = prefillAdmission({ slots: 2, warmTokens: 0 });
  const q = recorder();
  const t = [0, 1, 2, 3].map((i) => two.enter("w", 10, q.go(String(i))));
  assert.deepEqual(q.went, ["0", "1"]);
  t[1].leave();
  assert.deepEqual(q.went, ["0", "1", "2"]);
});

test("a request arriving while others wait queues behind them even if a slot is free at that instant", () => {
  // A slot freed and re-taken in the same turn must not let a newcomer jump the queue.
  const gate = prefillAdmission({ slots: 1, warmTokens: 0 });
  const r = recorder();
  const a = gate.enter("w", 10, r.go("a"));
  gate.enter("w", 10, r.go("b"));
  a.leave();
  const c = gate.enter("w", 10, r.go("c"));
  assert.deepEqual(r.went, ["a", "b"]);
  assert.equal(c.admitted, false);
});

test("flow cap: a named flow holds at most flowMaxSlots slots over the fleet; the free slot stays for another flow", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 512, flowMaxSlots: 2 });
  const r = recorder();
  const noisy = { priority: 0, flow: "noisy" };
  const n1 = gate.enter("w0", 3000, r.go("n1"), noisy);
  gate.enter("w1", 3000, r.go("n2"), noisy);
  // w2 is free, but noisy holds its two slots: it waits there.
  const n3 = gate.enter("w2", 3000, r.go("n3"), noisy);
  assert.equal(n3.admitted, false);
  assert.equal(gate.wouldWait("w2", 3000, "noisy"), true);
  assert.equal(gate.wouldWait("w2", 3000, "quiet"), false, "another flow would go at once");
  // A quiet tenant's request takes the free slot beside the capped waiter.
  const q = gate.enter("w2", 3000, r.go("q"), { priority: 0, flow: "quiet" });
  assert.equal(q.admitted && q.slot, true);
  // Unnamed and default flows are never capped.
  const d1 = gate.enter("w3", 3000, r.go("d1"), { priority: 0, flow: "default-flow" });
  assert.equal(d1.admitted, true);
  // noisy's slot on w0 frees: its waiter on w2 cannot go there (w2 busy); w0's queue is empty.
  n1.leave();
  assert.deepEqual(r.went, ["n1", "n2", "q", "d1"]);
  // w2 frees: the capped waiter is under the cap again and goes.
  q.leave();
  assert.deepEqual(r.went, ["n1", "n2", "q", "d1", "n3"]);
});

test("flow cap: a capped waiter beside a free slot goes there as soon as its flow gives a slot back elsewhere", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 512, flowMaxSlots: 1 });
  const r = recorder();
  const noisy = { priority: 0, flow: "noisy" };
  const n1 = gate.enter("w0", 3000, r.go("n1"), noisy);
  const n2 = gate.enter("w1", 3000, r.go("n2"), noisy);
  assert.equal(n2.admitted, false);
  n1.leave();
  assert.deepEqual(r.went, ["n1", "n2"], "w1 was free all along; the cap held it back until n1 ended");
  n2.leave();
  assert.equal(gate.busy("w0") + gate.busy("w1") + gate.waiting(), 0);
});

test("no flow cap by default: a named flow takes every free slot", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 512 });
  const r = recorder();
  for (let i = 0; i < 4; i++) gate.enter("w" + i, 3000, r.go("n" + i), { priority: 0, flow: "noisy" });
  assert.deepEqual(r.went, ["n0", "n1", "n2", "n3"]);
});

test("flow cap with late binding: a movable newcomer takes a slot a capped waiter leaves free", () => {
  const gate = prefillAdmission({ slots: 1, warmTokens: 512, flowMaxSlots: 1 });
  const r = recorder();
  const noisy = { priority: 0, flow: "noisy" };
  gate.enter("w0", 3000, r.go("n1"), noisy);
  const n2 = gate.enter("w1", 3000, r.go("n2"), noisy);
  const moved: string[] = [];
  const q = gate.enter("w0", 3000, r.go("q"), { priority: 0, flow: "quiet" }, undefined, (k) => {
    moved.push(k);
    return true;
  });
  assert.equal(q.admitted && q.slot, true);
  assert.deepEqual(moved, ["w1"]);
  assert.equal(n2.admitted, false);
  assert.deepEqual(r.went, ["n1", "q"]);
});
