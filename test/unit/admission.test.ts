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

test("flow reserve: while another named flow is active, a flow of priority 0 and below leaves one fleet slot free; alone it takes them all", () => {
  const fleet = ["w0", "w1", "w2", "w3"];
  const gate = prefillAdmission({ slots: 1, warmTokens: 512, flowReserve: 1, workers: () => fleet });
  const r = recorder();
  const noisy = { priority: 0, flow: "noisy" };
  const mover = (name: string) => (k: string) => {
    r.went.push(name + "@" + k);
    return true;
  };
  // Alone (no other named flow yet): every slot.
  const n = fleet.map((w, i) => gate.enter(w, 3000, r.go("n" + i), noisy, undefined, mover("n" + i)));
  assert.deepEqual(r.went, ["n0", "n1", "n2", "n3"]);
  // A quiet tenant arrives with every slot taken: it waits, first in the queue order.
  const q1 = gate.enter("w0", 3000, r.go("q1"), { priority: 0, flow: "quiet" }, undefined, mover("q1"));
  const n4 = gate.enter("w1", 3000, r.go("n4"), noisy, undefined, mover("n4"));
  n[2].leave();
  assert.deepEqual(r.went.slice(4), ["q1@w2", "q1"]);
  // noisy holds 2 when n3 ends: its waiter may take a third.
  n[3].leave();
  assert.deepEqual(r.went.slice(6), ["n4@w3", "n4"]);
  // q1 ends: noisy holds 3 of 4 and the quiet flow is active, so w2 stays free for it.
  q1.leave();
  const n5 = gate.enter("w2", 3000, r.go("n5"), noisy, undefined, mover("n5"));
  assert.equal(n5.admitted, false, "noisy's fourth request waits beside the free slot");
  assert.equal(gate.wouldWait("w2", 3000, "noisy"), true);
  assert.equal(gate.wouldWait("w2", 3000, "quiet"), false, "another tenant goes at once");
  const q2 = gate.enter("w0", 3000, r.go("q2"), { priority: 0, flow: "quiet" }, undefined, mover("q2"));
  assert.equal(q2.admitted, true);
  assert.deepEqual(r.went.slice(8), ["q2@w2", "q2"]);
  q2.leave();
  // A protected band is neither held back nor counted.
  const c = gate.enter("w2", 3000, r.go("c"), { priority: 100, flow: "noisy" });
  assert.equal(c.admitted, true);
  c.leave();
  // Once the quiet flow has been silent for 64 cold requests, noisy takes every slot again.
  assert.equal(n5.admitted, false);
  const more = [];
  for (let i = 0; i < 64 && !n5.admitted; i++)
    more.push(
      gate.enter(
        "w0",
        3000,
        () => {},
        noisy,
        undefined,
        () => true,
      ),
    );
  assert.equal(n5.admitted, true, "the reserve lifts when no other flow is active");
  assert.ok(more.length > 50, `lifted after ${more.length} more requests`);
  for (const t of [...n, n4, n5, ...more]) t.leave();
  assert.equal(gate.waiting(), 0);
});

test("flow reserve off (0) or without the fleet: a named flow takes every free slot whoever else is active", () => {
  for (const cfg of [{ flowReserve: 0, workers: () => ["w0", "w1"] }, { flowReserve: 1 }]) {
    const gate = prefillAdmission({ slots: 1, warmTokens: 512, ...cfg });
    const r = recorder();
    const q = gate.enter("w0", 3000, r.go("q"), { priority: 0, flow: "quiet" });
    q.leave();
    gate.enter("w0", 3000, r.go("n0"), { priority: 0, flow: "noisy" });
    gate.enter("w1", 3000, r.go("n1"), { priority: 0, flow: "noisy" });
    assert.deepEqual(r.went, ["q", "n0", "n1"]);
  }
});
