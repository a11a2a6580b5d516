import { test } from "node:test";
import * as assert from "node:assert/strict";
import { blockHashes } from "../../core/hash";
import { xxh3Hex } from "../../core/xxh3";

function le32(tokens: number[]): Uint8Array {
  const b = Buffer.alloc(tokens.length * 4);
  tokens.forEach((t, i) => b.writeUInt32LE(t, i * 4));
  return new Uint8Array(b);
}

test("block hashes are chained XXH3 of LE64(parent) || u32 LE tokens", () => {
  const toks = Array.from({ length: 40 }, (_, i) => i * 1000 + 7);
  const hs = blockHashes(toks, 16);
  assert.equal(hs.length, 2, "only full blocks are hashed");
  assert.equal(hs[0], xxh3Hex(le32(toks.slice(0, 16))));
  const parent = Buffer.alloc(8);
  parent.writeBigUInt64LE(BigInt("0x" + hs[0]));
  assert.equal(hs[1], xxh3Hex(new Uint8Array(Buffer.concat([parent, Buffer.from(le32(toks.slice(16, 32)))]))));
});

test("a block's hash depends on every earlier block", () => {
  const a = Array.from({ length: 48 }, (_, i) => i);
  const b = a.slice();
  b[3] = 999; // differs only in block 0
  const ha = blockHashes(a, 16);
  const hb = blockHashes(b, 16);
  for (let i = 0; i < 3; i++) assert.notEqual(ha[i], hb[i], `block ${i}`);
  const c = a.slice();
  c[40] = 999; // differs only in block 2
  const hc = blockHashes(c, 16);
  assert.equal(hc[0], ha[0]);
  assert.equal(hc[1], ha[1]);
  assert.notEqual(hc[2], ha[2]);
});

test("a salt reroots the chain; block size is respected; large token ids survive", () => {
  const t = Array.from({ length: 32 }, (_, i) => 151000 + i);
  assert.notDeepEqual(blockHashes(t, 16, undefined, "0123456789abcdef"), blockHashes(t, 16));
  assert.equal(blockHashes(t, 8).length, 4);
  assert.equal(blockHashes([4294967295, ...t.slice(1)], 16)[0], xxh3Hex(le32([4294967295, ...t.slice(1, 16)])));
});

test("the pure-JS chain (njs) equals the chain through any other hasher: with and without salt, every block size, large ids", async () => {
  const { nativeHasher } = await import("../../runtime/hasher");
  const viaHex = (b: Uint8Array) => xxh3Hex(b);
  let seed = 5;
  const toks = Array.from({ length: 700 }, () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0));
  for (const bs of [1, 2, 3, 15, 16, 17, 32, 64, 100]) {
    for (const salt of [undefined, "0123456789abcdef", "fedcba9876543210"]) {
      const want = blockHashes(toks, bs, viaHex, salt);
      assert.equal(want.length, Math.floor(toks.length / bs));
      assert.deepEqual(blockHashes(toks, bs, undefined, salt), want, `block size ${bs}, salt ${salt}`);
      assert.deepEqual(blockHashes(toks, bs, nativeHasher, salt), want, `native, block size ${bs}, salt ${salt}`);
    }
  }
});
