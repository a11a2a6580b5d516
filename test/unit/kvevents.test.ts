import { test } from "node:test";
import * as assert from "node:assert/strict";
import { encode } from "@msgpack/msgpack";
import { applyBatch, KvEvent } from "../../core/kvevents";
import { blockHashes } from "../../core/hash";
import { memoryMirror } from "../../core/state/memory";
import { EpochKey } from "../../core/types";
import { decodeBatch, decodeSeq } from "../../runtime/events";

const W1 = "w#1" as EpochKey;
const W2 = "w#2" as EpochKey;
const toks = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);

test("decodes vLLM's wire format: array_like tagged events, u64 hashes, 8-byte BE seq", () => {
  const big = 18446744073709551557n; // > 2^63: must not lose precision
  const payload = encode(
    [
      1733000000.5,
      [
        ["BlockStored", [big, 7n], null, toks(32), 16, null, "GPU"],
        ["BlockRemoved", [big], "GPU"],
        ["AllBlocksCleared"],
      ],
      0,
    ],
    { useBigInt64: true },
  );
  const b = decodeBatch(payload);
  assert.equal(b.events.length, 3);
  const s = b.events[0] as Extract<KvEvent, { type: "BlockStored" }>;
  assert.deepEqual(s.hashes, [big.toString(), "7"]);
  assert.equal(s.parent, null);
  assert.equal(s.blockSize, 16);
  assert.equal(b.dpRank, 0);
  const seq = Buffer.alloc(8);
  seq.writeBigUInt64BE(258n);
  assert.equal(decodeSeq(seq), 258);
  assert.throws(() => decodeSeq(Buffer.from([1, 2])), /8/);
  assert.throws(() => decodeBatch(Buffer.from([0xc1])), /./);
  // an unknown event type is skipped and counted, the rest of the batch applies
  const u = decodeBatch(encode([0, [["Bogus", 1], ["AllBlocksCleared"], { type: "Future", x: 1 }]]));
  assert.deepEqual([u.unknown, u.events.length, u.events[0].type], [2, 1, "AllBlocksCleared"]);
  // older vLLM without data_parallel_rank, and map-shaped events
  assert.equal(decodeBatch(encode([0, [{ type: "AllBlocksCleared" }]])).events[0].type, "AllBlocksCleared");
});

test("stored blocks are rehashed from token_ids with our chain, so prompts match", () => {
  const st = memoryMirror();
  const t = toks(64, 100);
  // engine hashes are opaque and unrelated to ours
  const r1 = applyBatch(
    st,
    W1,
    0,
    [{ type: "BlockStored", hashes: ["e1", "e2"], parent: null, tokens: t.slice(0, 32), blockSize: 16 }],
    16,
  );
  const r2 = applyBatch(
    st,
    W1,
    1,
    [{ type: "BlockStored", hashes: ["e3", "e4"], parent: "e2", tokens: t.slice(32), blockSize: 16 }],
    16,
  );
  assert.equal(r1.stored + r2.stored, 4);
  assert.equal(st.count(W1), 4);
  const ours = blockHashes(t, 16);
  assert.equal(st.prefixHits(ours, { "w#1": true })["w#1"], 4);
  // removal by engine hash finds our block
  applyBatch(st, W1, 2, [{ type: "BlockRemoved", hashes: ["e3"] }], 16);
  assert.equal(st.prefixHits(ours, { "w#1": true })["w#1"], 2);
  assert.equal(st.count(W1), 3);
  applyBatch(st, W1, 3, [{ type: "AllBlocksCleared" }], 16);
  assert.equal(st.count(W1), 0);
  assert.equal(st.prefixHits(ours, { "w#1": true })["w#1"], undefined);
});

test("a sequence gap clears the mirror (resync), a restart (seq back to 0) too", () => {
  const st = memoryMirror();
  const ev = (h: string, base: number): KvEvent[] => [
    { type: "BlockStored", hashes: [h], parent: null, tokens: toks(16, base), blockSize: 16 },
  ];
  applyBatch(st, W1, 0, ev("a", 0), 16);
  applyBatch(st, W1, 1, ev("b", 100), 16);
  assert.equal(st.count(W1), 2);
  const g = applyBatch(st, W1, 5, ev("c", 200), 16);
  assert.ok(g.gap);
  assert.equal(st.count(W1), 1, "only blocks after the gap remain");
  const z = applyBatch(st, W1, 0, ev("d", 300), 16);
  assert.ok(z.gap);
  assert.equal(st.count(W1), 1);
});

test("block size mismatch is fatal; unknown parents and short token lists are skipped", () => {
  const st = memoryMirror();
  const m = applyBatch(
    st,
    W1,
    0,
    [{ type: "BlockStored", hashes: ["a"], parent: null, tokens: toks(32), blockSize: 32 }],
    16,
  );
  assert.match(m.fatal!, /block size 32 in KV events != router --block-size 16/);
  const u = applyBatch(
    st,
    W2,
    0,
    [{ type: "BlockStored", hashes: ["b"], parent: "never-seen", tokens: toks(16), blockSize: 16 }],
    16,
  );
  assert.equal(u.skipped, 1);
  const s = applyBatch(
    st,
    W2,
    1,
    [{ type: "BlockStored", hashes: ["c", "d"], parent: null, tokens: toks(20), blockSize: 16 }],
    16,
  );
  assert.equal(s.skipped, 2);
  assert.equal(st.count(W2), 0);
});

test("two engine hashes for the same content are reference counted", () => {
  const st = memoryMirror();
  const t = toks(16, 5);
  applyBatch(
    st,
    W1,
    0,
    [
      { type: "BlockStored", hashes: ["x"], parent: null, tokens: t, blockSize: 16 },
      { type: "BlockStored", hashes: ["y"], parent: null, tokens: t, blockSize: 16 },
    ],
    16,
  );
  assert.equal(st.count(W1), 1);
  applyBatch(st, W1, 1, [{ type: "BlockRemoved", hashes: ["x"] }], 16);
  assert.equal(st.count(W1), 1, "still held through y");
  applyBatch(st, W1, 2, [{ type: "BlockRemoved", hashes: ["y"] }], 16);
  assert.equal(st.count(W1), 0);
});

test("early vLLM's num_toks_per_block list stands in for block_size", () => {
  const b = decodeBatch(encode([0, [["BlockStored", [1, 2], null, toks(32), [16, 16], null]]]));
  assert.equal((b.events[0] as Extract<KvEvent, { type: "BlockStored" }>).blockSize, 16);
  assert.throws(
    () => decodeBatch(encode([0, [["BlockStored", [1, 2], null, toks(32), [16, 8], null]]])),
    /not uniform/,
  );
});

test("LoRA blocks never match base-model prompts", () => {
  const st = memoryMirror();
  const t = toks(32, 9);
  applyBatch(
    st,
    W1,
    0,
    [{ type: "BlockStored", hashes: ["l1", "l2"], parent: null, tokens: t, blockSize: 16, loraId: 4 }],
    16,
  );
  assert.equal(st.count(W1), 2);
  assert.equal(st.prefixHits(blockHashes(t, 16), { "w#1": true })["w#1"], undefined);
});

test("bytes-typed block hashes (newer vLLM ExternalBlockHash) decode to stable keys", () => {
  const h = new Uint8Array([1, 2, 3, 250]);
  const b = decodeBatch(
    encode([
      0,
      [
        ["BlockStored", [h], h, toks(16), 16, null, null],
        ["BlockRemoved", [h], null],
      ],
    ]),
  );
  const s = b.events[0] as Extract<KvEvent, { type: "BlockStored" }>;
  assert.deepEqual([s.hashes[0], s.parent], ["010203fa", "010203fa"]);
  assert.deepEqual((b.events[1] as Extract<KvEvent, { type: "BlockRemoved" }>).hashes, ["010203fa"]);
});
