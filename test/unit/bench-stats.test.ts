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

// [n samples 1..n, p, pct, pctNearestRank, pctLower]: pct takes index floor(p% of n) capped at the
// last, pctNearestRank 1-based rank ceil(p% of n), pctLower index floor(p% of (n - 1)).
const RULES: [number, number, number, number, number][] = [
  [10, 50, 6, 5, 5],
  [10, 90, 10, 9, 9],
  [11, 90, 10, 10, 10],
  [20, 90, 19, 18, 18],
  [100, 50, 51, 50, 50],
  [100, 99, 100, 99, 99],
  [7, 100, 7, 7, 7],
  [7, 0, 1, 1, 1],
  [1, 99, 1, 1, 1],
];

test("each percentile rule picks its own sample, from unsorted input", () => {
  for (const [n, p, a, nr, lo] of RULES) {
    const xs = shuffled(n);
    assert.deepEqual([pct(xs, p), pctNearestRank(xs, p), pctLower(xs, p)], [a, nr, lo], `n=${n} p=${p}`);
  }
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
  const flags = (args: string[]) => args.map((a, i) => (i % 2 ? "" : `${a}=${args[i + 1]}`)).filter(Boolean);
  // 32 layers x 8 KV heads x 128 dims x K,V x 2 bytes = 131072 bytes of KV per token.
  assert.equal(
    flags(transferSim(0.25)).join(" "),
    "--prefill-us-per-token=60 --decode-ms-per-token=12 --kv-bytes-per-token=131072 --kv-link-gbps=100 --time-scale=0.25",
  );
  assert.deepEqual(flags(transferSim(1, ["--capacity-blocks", "20000"])).slice(4), [
    "--capacity-blocks=20000",
    "--time-scale=1",
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
