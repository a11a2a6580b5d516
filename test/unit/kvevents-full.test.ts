// Issue 12: every field real engines publish, in both encodings, on both
// state backends: tiers per medium, KV-cache groups, salts and adapters,
// multimodal blocks, the mirror bound.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { encode } from "@msgpack/msgpack";
import {
  applyBatch,
  chainRoot,
  KvEvent,
  makeRoom,
  parseTierWeights,
  storedIn,
  requestRoot,
  tierCounts,
  tierKey,
} from "../../core/kvevents";
import { blockHashes } from "../../core/hash";
import { memoryMirror } from "../../core/state/memory";
import { typedMirror } from "../../core/state/typed-mirror";
import { keyedMirror } from "../../core/state/keyed";
import { memStore } from "../../core/store";
import { MirrorIndex } from "../../core/state/types";
import { EpochKey } from "../../core/types";
import { decodeBatch } from "../../runtime/events";
import { encodeEvent, SimKvEvent } from "../../sim/kvpublisher";
import { computeFeatures, parseRequest } from "../../core/request";

const W = "w#1" as EpochKey;
const live = { "w#1": true };
const toks = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);
const ids = (p: string, n: number) => Array.from({ length: n }, (_, i) => p + i);
type Stored = Extract<KvEvent, { type: "BlockStored" }>;
const stored = (hashes: string[], tokens: number[], more: Partial<Stored> = {}): KvEvent => ({
  type: "BlockStored",
  hashes,
  parent: null,
  tokens,
  blockSize: 16,
  ...more,
});

const backends: [string, () => MirrorIndex][] = [
  ["memory", memoryMirror],
  ["typed", () => typedMirror()],
  ["keyed", () => keyedMirror(memStore())],
];

test("both encodings decode to the same events: every field, signed/unsigned int and bytes hashes", () => {
  const full: SimKvEvent = {
    type: "BlockStored",
    block_hashes: [-5n, 18446744073709551611n],
    parent_block_hash: null,
    token_ids: toks(32),
    block_size: 16,
    lora_id: 3,
    medium: "CPU_PINNED",
    lora_name: "sql-adapter",
    extra_keys: [["sql-adapter", "tenant-a"], [["img-1", 4]]],
    group_idx: 1,
    kv_cache_spec_kind: "sliding_window",
    kv_cache_spec_sliding_window: 128,
  };
  const rm: SimKvEvent = {
    type: "BlockRemoved",
    block_hashes: [new Uint8Array([1, 255])],
    medium: "DISK",
    group_idx: 2,
  };
  const asMap = decodeBatch(
    encode(
      {
        ts: 1,
        events: [
          encodeEvent(full, "map"),
          encodeEvent(rm, "map"),
          {
            type: "BlockStored",
            ...{ future_field: 1 },
            block_hashes: [1],
            parent_block_hash: 0,
            token_ids: toks(16),
            block_size: 16,
          },
        ],
        data_parallel_rank: 1,
      },
      { useBigInt64: true },
    ),
  );
  const asArr = decodeBatch(
    encode([1, [encodeEvent(full, "array"), encodeEvent(rm, "array"), ["BlockStored", [1], 0, toks(16), 16]], 1], {
      useBigInt64: true,
    }),
  );
  assert.deepEqual(asMap.events, asArr.events);
  assert.equal(asMap.dpRank, 1);
  const s = asMap.events[0] as Stored;
  // -5 signed and 2^64-5 unsigned are the same 64-bit hash
  assert.deepEqual(s.hashes, ["18446744073709551611", "18446744073709551611"]);
  assert.deepEqual(
    [s.medium, s.loraName, s.loraId, s.groupIdx, s.specKind, s.slidingWindow],
    ["CPU_PINNED", "sql-adapter", 3, 1, "sliding_window", 128],
  );
  assert.deepEqual(s.extraKeys, [["sql-adapter", "tenant-a"], [["img-1", 4]]]);
  assert.deepEqual(asMap.events[1], { type: "BlockRemoved", hashes: ["01ff"], medium: "DISK", groupIdx: 2 });
  assert.equal((asMap.events[2] as Stored).parent, "0");
  // short SGLang arrays (no medium and later fields) still decode
  const sg = decodeBatch(
    encode([
      0,
      [
        ["BlockStored", [7], null, toks(16), 16, null],
        ["BlockRemoved", [7]],
      ],
    ]),
  );
  assert.deepEqual(
    [(sg.events[0] as Stored).medium, (sg.events[1] as { medium?: string | null }).medium],
    [null, null],
  );
});

test("tier weights flag: gpu=1,cpu=0.75,disk=0.25 with CPU_PINNED as CPU, bad values named", () => {
  assert.deepEqual(parseTierWeights("gpu=1,cpu=0.75,disk=0.25"), { GPU: 1, CPU: 0.75, DISK: 0.25 });
  assert.deepEqual(parseTierWeights("cpu_pinned=0.5"), { CPU: 0.5 });
  assert.throws(() => parseTierWeights("cpu=2"), /--kv-tier-weights: 'cpu=2'/);
});

for (const [name, make] of backends) {
  test(`${name}: a removal touches only its tier (vLLM CPU offload 12 GPU + 8 CPU; SGLang CPU_PINNED)`, () => {
    const m = make();
    const t = toks(12 * 16, 1000);
    const h = ids("e", 12);
    applyBatch(m, W, 0, [stored(h, t)], 16);
    applyBatch(m, W, 1, [stored(h.slice(0, 8), t.slice(0, 128), { medium: "CPU" })], 16);
    assert.deepEqual(tierCounts(m, W), { GPU: 12, CPU: 8, DISK: 0, EXTERNAL: 0 });
    applyBatch(m, W, 2, [{ type: "BlockRemoved", hashes: h.slice(0, 8), medium: "CPU" }], 16);
    assert.deepEqual(tierCounts(m, W), { GPU: 12, CPU: 0, DISK: 0, EXTERNAL: 0 }, "the GPU still holds all 12");
    // SGLang host tier: CPU_PINNED store, then a GPU eviction leaves the 8 on CPU
    applyBatch(
      m,
      W,
      3,
      [
        stored(h.slice(0, 8), t.slice(0, 128), { medium: "CPU_PINNED" }),
        { type: "BlockRemoved", hashes: h, medium: "GPU" },
      ],
      16,
    );
    assert.deepEqual(tierCounts(m, W), { GPU: 0, CPU: 8, DISK: 0, EXTERNAL: 0 });
    // an AllBlocksCleared for one medium clears that tier only
    applyBatch(m, W, 4, [stored(h.slice(0, 2), t.slice(0, 32)), { type: "AllBlocksCleared", medium: "CPU" }], 16);
    assert.deepEqual(tierCounts(m, W), { GPU: 2, CPU: 0, DISK: 0, EXTERNAL: 0 });
  });

  test(`${name}: a lower-tier hit earns its configured share of a GPU hit, along one prefix`, () => {
    const m = make();
    const t = toks(6 * 16, 5);
    const h = ids("x", 6);
    // blocks 0-1 on GPU, 2-3 only on CPU, 4 only on DISK, 5 nowhere
    applyBatch(m, W, 0, [stored(h.slice(0, 2), t.slice(0, 32))], 16);
    applyBatch(
      m,
      W,
      1,
      [
        {
          type: "BlockStored",
          hashes: h.slice(2, 4),
          parent: "x1",
          tokens: t.slice(32, 64),
          blockSize: 16,
          medium: "CPU",
        },
      ],
      16,
    );
    applyBatch(
      m,
      W,
      2,
      [{ type: "BlockStored", hashes: [h[4]], parent: "x3", tokens: t.slice(64, 80), blockSize: 16, medium: "DISK" }],
      16,
    );
    const ours = blockHashes(t, 16);
    const w = { GPU: 1, CPU: 0.75, DISK: 0.25 };
    assert.equal(m.prefixHits(ours, live, w)["w#1"], 2 + 2 * 0.75 + 0.25);
    assert.equal(m.prefixHits(ours, live)["w#1"], 2, "no weights: GPU only");
    assert.equal(
      m.prefixHits(ours, live, { GPU: 1, CPU: 0.5, DISK: 0 })["w#1"],
      3,
      "a zero-weight tier ends the prefix",
    );
  });

  test(`${name}: KV-cache groups: the full-attention group is mirrored; sliding-window stores and removals never touch it`, () => {
    const m = make();
    const t = toks(8 * 16, 50);
    const h = ids("g", 8);
    const r0 = applyBatch(m, W, 0, [stored(h, t, { groupIdx: 0, specKind: "full_attention" })], 16);
    // the sliding-window group: same engine hashes, another block size; must not exclude the worker
    const r1 = applyBatch(
      m,
      W,
      1,
      [
        stored(h.slice(0, 4), toks(4 * 32, 50), {
          blockSize: 32,
          groupIdx: 1,
          specKind: "sliding_window",
          slidingWindow: 1024,
        }),
      ],
      16,
    );
    assert.equal(r1.fatal, null);
    assert.equal(r1.otherGroup, 4);
    applyBatch(m, W, 2, [{ type: "BlockRemoved", hashes: h.slice(4), groupIdx: 1 }], 16);
    assert.equal(m.count(W), 8, "8 full-attention blocks after the sliding-window removal");
    assert.equal(r0.stored, 8);
    // full attention learned as group 1 on another engine: group 0 removals are then ignored
    const W2 = "w#2" as EpochKey;
    applyBatch(
      m,
      W2,
      0,
      [
        stored(h, t, { groupIdx: 1, specKind: "FullAttentionSpec" }),
        stored(["o"], toks(16), { groupIdx: 0, specKind: "mamba" }),
      ],
      16,
    );
    applyBatch(
      m,
      W2,
      1,
      [
        { type: "BlockRemoved", hashes: h, groupIdx: 0 },
        { type: "BlockRemoved", hashes: [h[0]], groupIdx: 1 },
      ],
      16,
    );
    assert.equal(m.count(W2), 7);
    // the block-size check still applies to the mirrored group
    assert.match(
      applyBatch(m, W, 3, [stored(["z"], toks(32), { blockSize: 32, groupIdx: 0 })], 16).fatal!,
      /block size 32/,
    );
  });

  test(`${name}: cache_salt and LoRA names fold into the chain exactly as requests compute it; multimodal blocks never hit text`, () => {
    const m = make();
    const t = toks(3 * 16, 700);
    // same tokens under two salts and no salt: three distinct chains
    applyBatch(
      m,
      W,
      0,
      [
        stored(ids("a", 3), t, { extraKeys: [["tenant-a"], null, null] }),
        stored(ids("b", 3), t, { extraKeys: [["tenant-b"], null, null] }),
        stored(ids("n", 3), t),
      ],
      16,
    );
    assert.equal(m.count(W), 9);
    const body = (extra: object) => JSON.stringify({ model: "base", prompt: "x", ...extra });
    const feats = (model: string, salt: string | null) => {
      const req = parseRequest(
        "completions",
        body(salt ? { cache_salt: salt, model } : { model }),
        10,
        { maxBodyBytes: 1e6 },
        null,
      );
      req.promptTokens = t;
      return computeFeatures(req, null, 16, undefined, requestRoot(m, req.model, req.cacheSalt)).blocks;
    };
    assert.equal(m.prefixHits(feats("base", "tenant-a"), live)["w#1"], 3);
    assert.equal(m.prefixHits(feats("base", "tenant-c"), live)["w#1"], undefined, "another salt: no false hit");
    assert.equal(m.prefixHits(feats("base", null), live)["w#1"], 3, "unsalted matches the unsalted chain only");
    // LoRA by name: extra_keys carry the name on every block (vLLM), a request naming the adapter matches
    const lt = toks(2 * 16, 900);
    applyBatch(m, W, 1, [stored(["l0", "l1"], lt, { loraName: "sql", loraId: 7, extraKeys: [["sql"], ["sql"]] })], 16);
    const lreq = parseRequest("completions", body({ model: "sql" }), 10, { maxBodyBytes: 1e6 }, null);
    lreq.promptTokens = lt;
    assert.equal(
      m.prefixHits(computeFeatures(lreq, null, 16, undefined, requestRoot(m, "sql", null)).blocks, live)["w#1"],
      2,
    );
    assert.equal(m.prefixHits(blockHashes(lt, 16), live)["w#1"], undefined, "base model never hits adapter blocks");
    assert.equal(requestRoot(m, "base", null), null);
    assert.equal(chainRoot("sql", null), requestRoot(m, "sql", null));
    // multimodal: an (mm id, offset) extra key poisons the block and everything after it
    const mt = toks(2 * 16, 300);
    applyBatch(m, W, 2, [stored(["m0", "m1"], mt, { extraKeys: [null, [["img-9", 3]]] })], 16);
    assert.equal(
      m.prefixHits(blockHashes(mt, 16), live)["w#1"],
      1,
      "the text block before the image hits, the image block does not",
    );
  });

  test(`${name}: --max-mirror-blocks evicts the oldest engine blocks, counted`, () => {
    const m = make();
    let evicted = 0;
    const opts = { maxBlocks: 4, onEvict: (_t: EpochKey, n: number) => (evicted += n) };
    applyBatch(m, W, 0, [stored(ids("q", 3), toks(48, 0))], 16, opts);
    applyBatch(m, W, 1, [stored(ids("r", 3), toks(48, 100))], 16, opts);
    assert.equal(m.entries(W), 4);
    assert.equal(m.count(W), 4);
    assert.equal(evicted, 2);
    assert.equal(m.lookup(W, "q0"), undefined, "oldest first");
    assert.equal(m.lookup(W, "q1"), undefined);
    assert.notEqual(m.lookup(W, "q2"), undefined);
    // a removed block leaves a hole the eviction skips
    applyBatch(m, W, 2, [{ type: "BlockRemoved", hashes: ["q2"] }, stored(ids("s", 2), toks(32, 300))], 16, opts);
    assert.equal(m.entries(W), 4);
    assert.deepEqual(
      ["r0", "r1", "r2", "s0", "s1"].map((x) => m.lookup(W, x) !== undefined),
      [false, true, true, true, true],
    );
    assert.equal(m.entries(tierKey(W, "CPU")), 0);
  });

  test(`${name}: makeRoom keeps a zone-bounded mirror within its blocks, taking from the largest, oldest first`, () => {
    const m = make();
    const V = "v#2" as EpochKey;
    const targets = [W, tierKey(W, "CPU"), V];
    const batchW = [stored(ids("a", 6), toks(96, 0)), stored(ids("b", 2), toks(32, 1000), { medium: "CPU" })];
    applyBatch(m, W, 0, batchW, 16);
    assert.equal(storedIn(batchW), 8);
    // Room for 3 of V's blocks in a fit of 8: the largest target (W's GPU tier) gives them, oldest first.
    assert.equal(makeRoom(m, targets, 3, 8), 3);
    assert.deepEqual(
      ids("a", 6).map((x) => m.lookup(W, x) !== undefined),
      [false, false, false, true, true, true],
    );
    assert.equal(m.entries(tierKey(W, "CPU")), 2);
    applyBatch(m, V, 0, [stored(ids("v", 3), toks(48, 2000))], 16);
    // Towards equal shares: of [3, 2, 3], W's GPU tier gives first (ties go to the first listed), then V, then W.
    assert.equal(makeRoom(m, targets, 0, 7), 1);
    assert.equal(makeRoom(m, targets, 2, 7), 2);
    assert.deepEqual(
      targets.map((t) => m.entries(t)),
      [1, 2, 2],
    );
    assert.equal(m.lookup(V, "v0"), undefined, "V's oldest went");
    assert.notEqual(m.lookup(V, "v2"), undefined);
    // Within the fit, nothing moves; a fit below what eviction can reach stops when all is gone.
    assert.equal(makeRoom(m, targets, 0, 100), 0);
    assert.equal(makeRoom(m, targets, 50, 10), 5);
    assert.deepEqual(
      targets.map((t) => m.entries(t)),
      [0, 0, 0],
    );
  });
}
