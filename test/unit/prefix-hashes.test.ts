// Reused prefix block hashes equal hashing from scratch: extensions, a prompt
// diverging mid-block, another salt, a shorter prompt, eviction under the bound.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { prefixHashes } from "../../runtime/prefix-hashes";
import { blockHashes } from "../../core/hash";
import { nativeHasher } from "../../runtime/hasher";

test("prefix hash reuse: same hashes as hashing from scratch, only new blocks hashed, bounded", () => {
  const ph = prefixHashes(nativeHasher, 5000);
  const seq = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (Math.imul(i + 1, 2654435761) ^ seed) >>> 12);
  const base = seq(1000, 7);
  const check = (ids: number[], salt?: string) => assert.deepEqual(ph.hash(ids, 16, salt), blockHashes(ids, 16, nativeHasher, salt));
  check(base);
  const before = ph.stats().hashedBlocks;
  const grown = base.concat(seq(200, 9));
  check(grown);
  assert.equal(ph.stats().hashedBlocks - before, Math.floor(1200 / 16) - Math.floor(1000 / 16), "a grown prompt hashes only its new blocks");
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
