// Flow control in core/admission.ts and the latency objectives of
// core/objectives.ts: fairness by attained tokens within a band, queue bounds
// in requests and bytes (per band and overall), eviction of the lowest band's
// newest request for a higher band, expiry, the saturation signal, and the
// x-slo-ttft-ms / x-slo-tpot-ms headers.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { engineSaturated, parseQueueBound, prefillAdmission, queueLimits, Ticket } from "../../core/admission";
import { parseCommand } from "../../runtime/args";
import { parseArgs, queueTtl } from "../../runtime/config";
import { CONTROL_HEADERS, objectiveOf, sloMs } from "../../core/objectives";

const h = (m: Record<string, string>) => (n: string) => m[n];

test("SLO headers: parsed in ms when trusted, ignored otherwise, a bad value is no SLO", () => {
  const sent = h({ "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "12.5", "x-gateway-inference-fairness-id": "t" });
  const o = objectiveOf(sent, {}, true);
  assert.equal(o.sloTtftMs, 250);
  assert.equal(o.sloTpotMs, 12.5);
  const u = objectiveOf(sent, {}, false);
  assert.equal(u.sloTtftMs, undefined);
  assert.equal(u.sloTpotMs, undefined);
  for (const bad of ["", "-5", "0", "abc", "1e3", "Infinity", "NaN", " 12ms"]) assert.equal(sloMs(bad), 0, bad);
  assert.equal(sloMs(" 300 "), 300);
  assert.equal("sloTtftMs" in objectiveOf(h({ "x-slo-ttft-ms": "x" }), {}, true), false);
  assert.deepEqual(CONTROL_HEADERS.slice().sort(), [
    "x-gateway-inference-fairness-id",
    "x-gateway-inference-objective",
    "x-slo-tpot-ms",
    "x-slo-ttft-ms",
  ]);
});

/** One worker, one slot, a holder; then the given cold requests queue; returns the order they go in. */
function order(reqs: [string, number, string, number][]): string[] {
  const a = prefillAdmission({ slots: 1, warmTokens: 0 });
  const went: string[] = [];
  const holder = a.enter("w", 100, () => went.push("holder"));
  const tickets = reqs.map(([id, priority, flow, tokens]) =>
    a.enter("w", tokens, () => went.push(id), { priority, flow }),
  );
  holder.leave();
  for (let i = 0; i < reqs.length; i++) for (const t of tickets) if (t.slot) t.leave();
  return went.slice(1);
}

test("fairness within a band counts tokens, not turns: a flow of long prompts does not get a turn per short one", () => {
  // Turn-taking (least recently served) would alternate big and small; by
  // attained tokens, one 4000-token prompt is worth four 1000-token ones.
  assert.deepEqual(
    order([
      ["b1", 0, "big", 4000],
      ["b2", 0, "big", 4000],
      ["b3", 0, "big", 4000],
      ["s1", 0, "small", 1000],
      ["s2", 0, "small", 1000],
      ["s3", 0, "small", 1000],
      ["s4", 0, "small", 1000],
      ["s5", 0, "small", 1000],
    ]),
    ["b1", "s1", "s2", "s3", "s4", "b2", "s5", "b3"],
  );
});

test("an idle flow cannot bank credit: it starts at the band's virtual time", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 0 });
  const went: string[] = [];
  const run = (id: string, flow: string) => a.enter("w", 1000, () => went.push(id), { priority: 0, flow });
  // The noisy flow is served alone for a while (ten requests, one at a time).
  for (let i = 0; i < 10; i++) run("n" + i, "noisy").leave();
  const hold = run("n10", "noisy");
  const n11 = run("n11", "noisy");
  const n12 = run("n12", "noisy");
  const q1 = run("q1", "quiet");
  const q2 = run("q2", "quiet");
  hold.leave();
  // The quiet flow goes first (less attained), but then alternates instead of
  // taking ten turns in a row for the time it was idle.
  const ts = [n11, n12, q1, q2];
  for (let i = 0; i < 4; i++) for (const t of ts) if (t.slot) t.leave();
  assert.deepEqual(went.slice(11), ["q1", "n11", "q2", "n12"]);
});

test("per-band bounds in requests and bytes refuse the newcomer; other bands are not touched", () => {
  const a = prefillAdmission({
    slots: 1,
    warmTokens: 0,
    bandLimits: { "-1": { requests: 2, bytes: 0 }, "0": { requests: 0, bytes: 1000 } },
  });
  a.enter("w", 10, () => undefined);
  const b = [1, 2, 3].map(() => a.enter("w", 10, () => undefined, { priority: -1, flow: "f", bytes: 10 }));
  assert.deepEqual(
    b.map((t) => t.refused),
    ["", "", "queue_full"],
  );
  const s1 = a.enter("w", 10, () => undefined, { priority: 0, flow: "f", bytes: 600 });
  const s2 = a.enter("w", 10, () => undefined, { priority: 0, flow: "f", bytes: 600 });
  assert.equal(s1.refused, "");
  assert.equal(s2.refused, "queue_full");
  assert.deepEqual(a.waitingByPriority(), { "-1": 2, "0": 1 });
  assert.equal(a.waitingBytes(), 620);
  s2.leave(); // a refused ticket's leave changes nothing
  assert.equal(a.waiting(), 3);
});

test("overall bound: a higher band evicts the lowest band's newest request; never the other way; critical is never refused or evicted", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 0, maxQueued: 3 });
  const evicted: string[] = [];
  const went: string[] = [];
  const enter = (id: string, priority: number): Ticket =>
    a.enter(
      "w" + (id.length % 2), // two workers' queues: the bound is over all of them
      10,
      () => went.push(id),
      { priority, flow: "f" },
      () => evicted.push(id),
    );
  enter("h0", 0);
  enter("h", 0); // holders on both workers
  const s1 = enter("s1", -1);
  const s2 = enter("s22", -1);
  const m1 = enter("m1", 0);
  assert.equal(a.waiting(), 3);
  const c1 = enter("c1", 100); // full: the newest of the lowest band goes
  assert.deepEqual(evicted, ["s22"]);
  assert.equal(s2.refused, "evicted");
  assert.equal(c1.refused, "");
  const c2 = enter("c22", 100);
  assert.deepEqual(evicted, ["s22", "s1"]);
  assert.equal(s1.refused, "evicted");
  assert.equal(c2.refused, "");
  const c3 = enter("c3", 100); // next lowest band: standard m1
  assert.deepEqual(evicted, ["s22", "s1", "m1"]);
  assert.equal(m1.refused, "evicted");
  // Only critical left: a protected band is not refused by the overall bound,
  // it queues past it; nobody is evicted, and a higher protected band does
  // not evict a lower protected one either.
  const c4 = enter("c44", 100);
  assert.equal(c4.refused, "");
  const top = enter("t5", 200);
  assert.equal(top.refused, "");
  const low = enter("s5", -1); // a lower band never evicts a higher one, and is refused at the bound
  assert.equal(low.refused, "queue_full");
  const std = enter("m6", 0);
  assert.equal(std.refused, "queue_full");
  assert.deepEqual(evicted, ["s22", "s1", "m1"]);
  assert.deepEqual(a.waitingByPriority(), { "100": 4, "200": 1 });
  assert.equal(went.length, 2, "the evicted never went");
  for (const t of [s1, s2, m1]) t.leave();
  assert.equal(a.waiting(), 5);
  void c3;
});

test("a band's own bound still refuses a protected band (the operator set it for that band)", () => {
  const a = prefillAdmission({
    slots: 1,
    warmTokens: 0,
    maxQueued: 1,
    bandLimits: { "100": { requests: 1, bytes: 0 } },
  });
  a.enter("w", 10, () => undefined);
  assert.equal(a.enter("w", 10, () => undefined, { priority: 100, flow: "f" }).refused, "");
  assert.equal(a.enter("w", 10, () => undefined, { priority: 100, flow: "f" }).refused, "queue_full");
  assert.equal(a.enter("w", 10, () => undefined, { priority: 50, flow: "f" }).refused, "", "over the overall bound");
});

test("byte bound: eviction happens only when the lower bands free enough bytes", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 0, maxQueuedBytes: 1000 });
  const evicted: string[] = [];
  a.enter("w", 10, () => undefined);
  a.enter(
    "w",
    10,
    () => undefined,
    { priority: -1, flow: "f", bytes: 300 },
    () => evicted.push("s"),
  );
  a.enter(
    "w",
    10,
    () => undefined,
    { priority: 0, flow: "f", bytes: 600 },
    () => evicted.push("m"),
  );
  const big = a.enter("w", 10, () => undefined, { priority: 0, flow: "f", bytes: 800 });
  assert.equal(big.refused, "queue_full", "evicting the 300 bytes below would not be enough: nothing evicted");
  assert.deepEqual(evicted, []);
  const c = a.enter("w", 10, () => undefined, { priority: 0, flow: "f", bytes: 200 });
  assert.equal(c.refused, "");
  assert.deepEqual(evicted, ["s"]);
  assert.equal(a.waitingBytes(), 800);
  // Critical: not enough to evict below it, so it queues past the byte bound and evicts nobody.
  const crit = a.enter("w", 10, () => undefined, { priority: 100, flow: "f", bytes: 1500 });
  assert.equal(crit.refused, "");
  assert.deepEqual(evicted, ["s"]);
  assert.equal(a.waitingBytes(), 2300);
});

test("expire takes a waiting request out once; an admitted one cannot expire", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 0 });
  const went: string[] = [];
  const h1 = a.enter("w", 10, () => went.push("h"));
  const b = a.enter("w", 10, () => went.push("b"));
  const c = a.enter("w", 10, () => went.push("c"));
  assert.equal(h1.expire(), false);
  assert.equal(b.expire(), true);
  assert.equal(b.expire(), false);
  assert.equal(b.refused, "expired");
  h1.leave();
  assert.deepEqual(went, ["h", "c"]);
  b.leave();
  c.leave();
  assert.equal(a.busy("w") + a.waiting(), 0);
});

test("a worker marked saturated takes no cold prefill until cleared, even with a free slot", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 512 });
  const went: string[] = [];
  a.setSaturated("w", true);
  assert.equal(a.wouldWait("w", 5000), true);
  assert.equal(a.wouldWait("w", 100), false, "warm requests still go");
  const t = a.enter("w", 5000, () => went.push("a"));
  assert.equal(t.admitted, false);
  a.setSaturated("v", false); // another worker, never set: nothing happens
  a.setSaturated("w", false);
  assert.deepEqual(went, ["a"]);
  assert.equal(t.slot, true);
});

test("engine signals: saturated at the Inference Extension's utilization thresholds; unknown = headroom", () => {
  assert.equal(engineSaturated({}, 5, 0.8), false);
  assert.equal(engineSaturated({ waiting: 4, kvUsage: 0.79 }, 5, 0.8), false);
  assert.equal(engineSaturated({ waiting: 5 }, 5, 0.8), true);
  assert.equal(engineSaturated({ kvUsage: 0.8 }, 5, 0.8), true);
  assert.equal(engineSaturated({ waiting: 100, kvUsage: 1 }, 0, 0), false, "a threshold of 0 turns that signal off");
});

test("--queue-max-requests / --queue-max-bytes: N over all bands, P=M per band; bad values fail at start naming the flag", () => {
  assert.deepEqual(parseQueueBound("256,-1=32, 100=0"), { total: 256, bands: { "-1": 32, "100": 0 } });
  assert.deepEqual(parseQueueBound("0"), { total: 0, bands: {} });
  assert.deepEqual(queueLimits(parseQueueBound("8,-1=2"), parseQueueBound("1000,0=300")), {
    maxQueued: 8,
    maxQueuedBytes: 1000,
    bandLimits: { "-1": { requests: 2, bytes: 0 }, "0": { requests: 0, bytes: 300 } },
  });
  for (const bad of ["-3", "x", "1.5", "a=3", "=3", "-1=2.5"]) {
    assert.throws(() => parseQueueBound(bad), /expected N/, bad);
    assert.throws(() => parseCommand("router", ["--queue-max-requests", bad], {}), /--queue-max-requests/, bad);
  }
  const o = parseCommand("router", ["--queue-ttl-ms", "2500", "--queue-max-bytes", "1048576"], {});
  assert.equal(o.values["queue-ttl-ms"], 2500);
  assert.equal(o.values["queue-max-bytes"], "1048576");
});

test("late binding: a movable waiter goes to the first worker that frees a slot, in band and fairness order", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 0 });
  const went: string[] = [];
  const moved: string[] = [];
  const hw0 = a.enter("w0", 10, () => went.push("h0"));
  const hw1 = a.enter("w1", 10, () => went.push("h1"));
  // Both wait for w0; q is movable, p is pinned (its prompt is cached on w0), r cannot move when asked.
  const p = a.enter("w0", 10, () => went.push("p"), { priority: 0, flow: "f" });
  const q = a.enter(
    "w0",
    10,
    () => went.push("q"),
    { priority: 0, flow: "g" },
    undefined,
    (k) => {
      moved.push("q->" + k);
      return true;
    },
  );
  const r = a.enter(
    "w0",
    10,
    () => went.push("r"),
    { priority: 100, flow: "h" },
    undefined,
    () => false,
  );
  hw1.leave(); // w1 frees first: r is best but cannot move, so q (movable) goes there; p stays for w0
  assert.deepEqual(moved, ["q->w1"]);
  assert.deepEqual(went, ["h0", "h1", "q"]);
  assert.equal(q.slot, true);
  assert.equal(a.busy("w1"), 1);
  q.leave(); // its slot is on w1 now: w1 frees, nothing movable left
  assert.equal(a.busy("w1"), 0);
  assert.equal(a.waiting("w0"), 2);
  hw0.leave(); // w0: r (critical) first, then p
  assert.deepEqual(went, ["h0", "h1", "q", "r"]);
  r.leave();
  assert.deepEqual(went, ["h0", "h1", "q", "r", "p"]);
  p.leave();
  assert.equal(a.busy("w0") + a.busy("w1") + a.waiting(), 0);
});

test("defaults: flow control on (256 queued, late binding); the TTL is the wait bound only with critical traffic to protect", () => {
  const ttl = (args: string[]) => parseArgs(["--workers", "127.0.0.1:1", ...args], {}).flow;
  const plain = ttl([]);
  assert.equal(plain.ttlMs, 0, "one band: sent at the wait bound as before");
  assert.equal(plain.maxQueued, 256);
  assert.equal(plain.lateBinding, true);
  const obj = ["--objectives", "critical=100,standard=0,batch=-1"];
  assert.equal(ttl([...obj, "--objective-headers", "trust"]).ttlMs, 3000);
  assert.equal(ttl([...obj, "--objective-headers", "trust", "--prefill-admission-max-wait-ms", "1200"]).ttlMs, 1200);
  assert.equal(ttl(obj).ttlMs, 0, "headers ignored: every request is priority 0, nothing to protect");
  assert.equal(ttl(["--objectives", "standard=0,batch=-1", "--objective-headers", "trust"]).ttlMs, 0);
  assert.equal(ttl([...obj, "--objective-headers", "trust", "--queue-ttl-ms", "0"]).ttlMs, 0);
  assert.equal(ttl(["--queue-ttl-ms", "900"]).ttlMs, 900);
  assert.equal(queueTtl(null, 3000, { critical: 1 }, true), 3000);
});
