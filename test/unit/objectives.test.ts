// Request objectives (core/objectives.ts) and the order admission lets waiting
// requests go in (core/admission.ts): band first, then the flow with the
// least attained service (tokens), then arrival.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { objectiveOf, parseObjectives } from "../../core/objectives";
import { prefillAdmission } from "../../core/admission";
import { parseCommand } from "../../runtime/args";

test("--objectives maps names to integer priorities; bad entries fail at start naming the flag", () => {
  assert.deepEqual(parseObjectives("critical=100, standard=0,batch=-10"), { critical: 100, standard: 0, batch: -10 });
  assert.deepEqual(parseObjectives(""), {});
  for (const bad of ["critical", "=3", "x=1.5", "x=high"])
    assert.throws(() => parseCommand("router", ["--objectives", bad], {}), /--objectives/, bad);
});

test("objective headers count only when trusted; unknown objectives are 0", () => {
  const table = { critical: 100, batch: -1 };
  const h = (m: Record<string, string>) => (n: string) => m[n];
  const sent = h({ "x-gateway-inference-objective": "critical", "x-gateway-inference-fairness-id": "tenant-a" });
  assert.deepEqual(
    objectiveOf(sent, table, false),
    { name: "", priority: 0, flow: "default-flow" },
    "ignored: no client raises its own priority",
  );
  assert.deepEqual(objectiveOf(sent, table, true), { name: "critical", priority: 100, flow: "tenant-a" });
  assert.equal(objectiveOf(h({ "x-gateway-inference-objective": "vip" }), table, true).priority, 0);
  assert.equal(objectiveOf(h({ "x-gateway-inference-objective": "batch" }), table, true).priority, -1);
  assert.equal(objectiveOf(h({ "x-gateway-inference-fairness-id": "t".repeat(1000) }), table, true).flow.length, 128);
});

/** Cold requests for one worker with one slot: the order in which the waiting ones go. */
function order(reqs: [string, number, string][]): string[] {
  const a = prefillAdmission({ slots: 1, warmTokens: 0 });
  const went: string[] = [];
  const holder = a.enter("w", 100, () => went.push("holder"));
  const tickets = reqs.map(([id, priority, flow]) => a.enter("w", 100, () => went.push(id), { priority, flow }));
  assert.equal(a.waiting("w"), reqs.length);
  holder.leave();
  for (let i = 0; i < reqs.length; i++) for (const t of tickets) if (t.slot) t.leave();
  return went.slice(1);
}

test("waiting requests go by band, then least attained flow, then arrival", () => {
  assert.deepEqual(
    order([
      ["s1", 0, "a"],
      ["c1", 100, "a"],
      ["b1", -1, "a"],
      ["c2", 100, "a"],
    ]),
    ["c1", "c2", "s1", "b1"],
  );
  // A noisy flow with many waiting cannot take the band's turns from the quiet ones.
  assert.deepEqual(
    order([
      ["n1", 0, "noisy"],
      ["n2", 0, "noisy"],
      ["n3", 0, "noisy"],
      ["q1", 0, "quiet"],
      ["n4", 0, "noisy"],
      ["r1", 0, "rare"],
    ]),
    ["n1", "q1", "r1", "n2", "n3", "n4"],
  );
});

test("wouldWait and the waiting count per band", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 512 });
  assert.equal(a.wouldWait("w", 5000), false);
  const h = a.enter("w", 5000, () => undefined);
  assert.equal(a.wouldWait("w", 5000), true);
  assert.equal(a.wouldWait("w", 100), false, "warm never waits");
  assert.equal(a.wouldWait("v", 5000), false, "another worker");
  a.enter("w", 5000, () => undefined, { priority: 100, flow: "x" });
  a.enter("w", 5000, () => undefined, { priority: -1, flow: "x" });
  a.enter("w", 5000, () => undefined);
  assert.deepEqual(a.waitingByPriority(), { "100": 1, "-1": 1, "0": 1 });
  h.leave();
  assert.deepEqual(a.waitingByPriority(), { "-1": 1, "0": 1 });
});
