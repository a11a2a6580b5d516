// Reused prefix block hashes equal hashing from scratch: extensions, a prompt
// diverging mid-block, another salt, a shorter prompt, eviction under the bound.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { prefixHashes } from "../../runtime/prefix-hashes";
import { blockHashes } from "../../core/hash";
import { nativeHasher } from "../../runtime/hasher";

test("prefix hash reuse: same hashes as hashing from scratch, only new blocks hashed, bounded", () => {
  const ph = prefixHashes(nativeHasher, 5000);
  const seq = (n: number, seed: number) =>
    Array.from({ length: n }, (_, i) => (Math.imul(i + 1, 2654435761) ^ seed) >>> 12);
  const base = seq(1000, 7);
  const check = (ids: number[], salt?: string) =>
    assert.deepEqual(ph.hash(ids, 16, salt), blockHashes(ids, 16, nativeHasher, salt));
  check(base);
  const before = ph.stats().hashedBlocks;
  const grown = base.concat(seq(200, 9));
  check(grown);
  assert.equal(
    ph.stats().hashedBlocks - before,
    Math.floor(1200 / 16) - Math.floor(1000 / 16),
    "a grown prompt hashes only its new blocks",
  );
  // diverges inside block 30: blocks 0..29 reused, the rest rehashed
  const fork = grown.slice();
  fork[30 * 16 + 5] ^= 1;
  check(fork);
  check(base.slice(0, 500)); // shorter than what is cached
  check(grown, "0123456789abcdef"); // another salt never reuses unsalted hashes
  check(seq(15, 3)); // under one block
  for (let k = 0; k < 20; k++) check(seq(800, 100 + k)); // evictions under the 5000-token bound
  assert.ok(ph.stats().tokens <= 5000, `${ph.stats().tokens} tokens kept`);
  check(grown.concat([1, 2, 3]));
});

// The soak wedge: at its token bound the cache evicted by walking a fresh Set
// iterator from the start, over every slot deleted since V8 last rehashed it,
// so each insert cost more than the one before (at 1,000 req/s of distinct
// prompts the router stalled after ~120k requests).
test("prefix hash reuse: inserts at the bound cost what inserts below it cost", () => {
  const ph = prefixHashes(nativeHasher, 4 * 1024 * 1024);
  const prompt = (i: number) => Array.from({ length: 28 }, (_, j) => (Math.imul(i + 1, 2654435761) + j) >>> 8);
  const run = (from: number, n: number) => {
    const t = performance.now();
    for (let i = from; i < from + n; i++) ph.hash(prompt(i), 16, undefined);
    return performance.now() - t;
  };
  const filling = run(0, 40000);
  run(40000, 180000); // past the bound (~150k entries of 28 tokens)
  const full = run(220000, 40000);
  assert.ok(ph.stats().tokens <= 4 * 1024 * 1024);
  assert.ok(
    full < 4 * filling,
    `40k inserts at the bound took ${full.toFixed(0)} ms, below it ${filling.toFixed(0)} ms`,
  );
});
