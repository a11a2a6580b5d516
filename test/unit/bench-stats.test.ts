// The benches' shared helpers: bench/stats.ts (the three percentile rules the
// published tables were made with, told apart) and bench/transfer-ab.ts (the
// KV-transfer A/B benches' simulator flags and side order).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { mean, meanOrZero, median, pct, pctLower, pctNearestRank, sum } from "../../bench/stats";
import { abbaRounds, transferSim } from "../../bench/transfer-ab";

const range = (n: number) => Array.from({ length: n }, (_, i) => i + 1);
/** 1..n in a fixed shuffled order, so a rule that forgot to sort would pick the wrong sample. */
const shuffled = (n: number) => range(n).sort((a, b) => ((a * 7919) % 101) - ((b * 7919) % 101));

test("pct: the sample at index floor(p% of n), capped at the last", () => {
  assert.equal(pct(shuffled(10), 50), 6);
  assert.equal(pct(shuffled(10), 90), 10);
  assert.equal(pct(shuffled(100), 99), 100);
  assert.equal(pct(shuffled(100), 50), 51);
  assert.equal(pct(shuffled(7), 100), 7);
  assert.equal(pct(shuffled(7), 0), 1);
  assert.equal(pct([42], 99), 42);
});

test("pctNearestRank: the sample at 1-based rank ceil(p% of n)", () => {
  assert.equal(pctNearestRank(shuffled(10), 50), 5);
  assert.equal(pctNearestRank(shuffled(10), 90), 9);
  assert.equal(pctNearestRank(shuffled(100), 99), 99);
  assert.equal(pctNearestRank(shuffled(7), 100), 7);
  assert.equal(pctNearestRank(shuffled(7), 0), 1);
  assert.equal(pctNearestRank([42], 50), 42);
});

test("pctLower: the sample at index floor(p% of (n - 1))", () => {
  assert.equal(pctLower(shuffled(10), 90), 9);
  assert.equal(pctLower(shuffled(11), 90), 10);
  assert.equal(pctLower(shuffled(100), 99), 99);
  assert.equal(pctLower(shuffled(10), 50), 5);
  assert.equal(pctLower([42], 90), 42);
});

test("the three rules differ where the tables need them apart, and agree on one sample", () => {
  const xs = shuffled(10);
  assert.deepEqual([pct(xs, 50), pctNearestRank(xs, 50), pctLower(xs, 50)], [6, 5, 5]);
  const ys = shuffled(20);
  assert.deepEqual([pct(ys, 90), pctNearestRank(ys, 90), pctLower(ys, 90)], [19, 18, 18]);
});

test("median is the upper median, pct(xs, 50)", () => {
  assert.equal(median(shuffled(10)), 6);
  assert.equal(median(shuffled(9)), 5);
  for (const n of [1, 2, 3, 8, 33]) assert.equal(median(shuffled(n)), pct(shuffled(n), 50));
});

test("means and sums; no samples: NaN, except meanOrZero's 0", () => {
  assert.equal(sum([1, 2, 3.5]), 6.5);
  assert.equal(mean([1, 2, 3, 6]), 3);
  assert.equal(meanOrZero([1, 2, 3, 6]), 3);
  assert.equal(meanOrZero([]), 0);
  for (const f of [mean, median, (x: number[]) => pct(x, 50), (x: number[]) => pctNearestRank(x, 99)])
    assert.ok(Number.isNaN(f([])));
  assert.ok(Number.isNaN(pctLower([], 90)));
});

test("no helper reorders the caller's samples", () => {
  const xs = [3, 1, 2];
  pct(xs, 50);
  pctNearestRank(xs, 50);
  pctLower(xs, 50);
  median(xs);
  assert.deepEqual(xs, [3, 1, 2]);
});

test("transferSim: the 8B-class KV model's flags, extras before the time scale", () => {
  assert.deepEqual(transferSim(0.25), [
    "--prefill-us-per-token",
    "60",
    "--decode-ms-per-token",
    "12",
    "--kv-bytes-per-token",
    "131072",
    "--kv-link-gbps",
    "100",
    "--time-scale",
    "0.25",
  ]);
  assert.deepEqual(transferSim(1, ["--capacity-blocks", "20000"]).slice(8), [
    "--capacity-blocks",
    "20000",
    "--time-scale",
    "1",
  ]);
});

test("abbaRounds: odd rounds run the sides in reverse, each mode's sides kept in round order", async () => {
  const calls: string[] = [];
  let n = 0;
  const all = await abbaRounds(["a", "b", "c"], 3, async (m) => {
    calls.push(m);
    return `${m}${n++}`;
  });
  assert.deepEqual(calls, ["a", "b", "c", "c", "b", "a", "a", "b", "c"]);
  assert.deepEqual(all, { a: ["a0", "a5", "a6"], b: ["b1", "b4", "b7"], c: ["c2", "c3", "c8"] });
});
