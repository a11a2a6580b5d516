import { test } from "node:test";
import * as assert from "node:assert/strict";
import { xxh3 } from "@node-rs/xxhash";
import { createXXHash3 } from "hash-wasm";
import { pairHex, xxh3Hex, xxh3PairWords } from "../../core/xxh3";
import { jsHasher } from "../../core/hash";
import { nativeHasher } from "../../runtime/hasher";

// Deterministic PRNG so a failure names a reproducible input.
function rng(seed: number) {
  return () => {
    seed = (Math.imul(seed ^ (seed >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
    return seed;
  };
}

test("pure-JS XXH3-64 equals @node-rs/xxhash on random inputs of every length 0..512", () => {
  const r = rng(42);
  for (let len = 0; len <= 512; len++) {
    for (let rep = 0; rep < 3; rep++) {
      const b = new Uint8Array(len);
      for (let i = 0; i < len; i++) b[i] = r() & 255;
      const ref = xxh3.xxh64(Buffer.from(b)).toString(16).padStart(16, "0");
      assert.equal(xxh3Hex(b), ref, `len=${len} rep=${rep}`);
    }
  }
});

test("pure-JS XXH3-64 equals hash-wasm (second reference) incl. multi-block long inputs", async () => {
  const h = await createXXHash3(0, 0);
  const r = rng(7);
  for (const len of [0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 2048, 4097, 10000]) {
    const b = new Uint8Array(len);
    for (let i = 0; i < len; i++) b[i] = r() & 255;
    h.init();
    h.update(b);
    assert.equal(xxh3Hex(b), h.digest("hex"), `len=${len}`);
  }
});

test("native and pure-JS hashers agree (Node fast path == njs path)", () => {
  const r = rng(99);
  for (let len = 0; len <= 300; len += 7) {
    const b = new Uint8Array(len);
    for (let i = 0; i < len; i++) b[i] = r() & 255;
    assert.equal(nativeHasher(b), jsHasher(b));
    // subarray views must hash their own bytes only
    const big = new Uint8Array(len + 10);
    big.set(b, 5);
    assert.equal(nativeHasher(big.subarray(5, 5 + len)), jsHasher(b));
  }
});

test("known vector: XXH3-64 of empty input", () => {
  assert.equal(xxh3Hex(new Uint8Array(0)), "2d06800538d394c2");
});

test("the 32-bit-word XXH3 (block hashes on njs) equals the byte one at every length that is a multiple of 4, 0..256", () => {
  const r = rng(11);
  for (let len = 0; len <= 256; len += 4) {
    const words = new Uint32Array(len / 4 + 2);
    for (let i = 0; i < words.length; i++) words[i] = r();
    const bytes = new Uint8Array(words.buffer);
    const p = xxh3PairWords(words, bytes, len);
    assert.equal(pairHex(p[0], p[1]), xxh3Hex(bytes.subarray(0, len)), `len=${len}`);
  }
});
