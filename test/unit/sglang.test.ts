// SGLang specifics of issue 12: its KV event structs and rank tagging as its
// publisher writes them (sim/kvpublisher.ts dialect "sglang", the encoder the
// simulator uses), and how a picked DP rank reaches SGLang (body fields).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { decode } from "@msgpack/msgpack";
import { decodeBatch } from "../../runtime/events";
import { encodeEvent, KvPublisher } from "../../sim/kvpublisher";
import { applyBatch, KvEvent, tierCounts } from "../../core/kvevents";
import { memoryMirror } from "../../core/state/memory";
import { EpochKey, Worker } from "../../core/types";
import { dpBodyFields, prefillRankHeader, withBodyFields } from "../../core/dprank";
import { parseWorkers } from "../../runtime/config";
import { specsFromEtcd } from "../../runtime/etcd";
import { freePort } from "../harness";
import { encode } from "@msgpack/msgpack";

const toks = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);

test("SGLang's structs: BlockStored [tag, hashes, parent, tokens, block_size, lora_id, medium(, metadata)], BlockRemoved [tag, hashes, medium]; batch [ts, events, attn_dp_rank]", async () => {
  // What SGLang's msgspec encoder (array_like, tag, no omit_defaults) writes; fields it does not have are never sent.
  const stored = encodeEvent(
    {
      type: "BlockStored",
      block_hashes: [11n, 12n],
      parent_block_hash: null,
      token_ids: toks(32),
      block_size: 16,
      lora_id: null,
      medium: "GPU",
      lora_name: "x",
    },
    "array",
    "sglang",
  );
  assert.deepEqual(stored, ["BlockStored", [11n, 12n], null, toks(32), 16, null, "GPU"]);
  assert.deepEqual(encodeEvent({ type: "BlockRemoved", block_hashes: [12n], medium: "GPU" }, "array", "sglang"), [
    "BlockRemoved",
    [12n],
    "GPU",
  ]);
  assert.deepEqual(
    encodeEvent({ type: "BlockRemoved", block_hashes: [12n] }, "array", "sglang"),
    ["BlockRemoved", [12n], null],
    "medium is written even when None",
  );
  assert.deepEqual(encodeEvent({ type: "AllBlocksCleared" }, "array", "sglang"), ["AllBlocksCleared"]);

  const p = new KvPublisher({
    host: "127.0.0.1",
    port: await freePort(),
    replayPort: null,
    topic: "",
    encoding: "map",
    bufferSteps: 10,
    dpRank: 3,
    dialect: "sglang",
  });
  await p.bind();
  try {
    // The payload the publisher sends (from its replay buffer): an array, rank third, whatever `encoding` says.
    await p.publish(
      [
        {
          type: "BlockStored",
          block_hashes: [11n, 12n],
          parent_block_hash: null,
          token_ids: toks(32),
          block_size: 16,
          lora_id: null,
        },
      ],
      false,
    );
    const payload = (p as unknown as { buffer: { payload: Buffer }[] }).buffer[0].payload;
    const raw = decode(payload, { useBigInt64: true }) as unknown[];
    assert.ok(
      Array.isArray(raw) && raw.length === 3 && raw[2] === 3,
      JSON.stringify(raw, (_, v) => (typeof v === "bigint" ? String(v) : v)),
    );
    const b = decodeBatch(payload);
    assert.equal(b.dpRank, 3, "attn_dp_rank read from the array's third element");
    const s = b.events[0] as Extract<KvEvent, { type: "BlockStored" }>;
    assert.deepEqual(
      [s.hashes, s.parent, s.blockSize, s.medium, s.loraName, s.groupIdx],
      [["11", "12"], null, 16, null, null, null],
    );
    // applied: GPU tier (no medium), the full group (no group fields)
    const m = memoryMirror();
    const ek = "s#1" as EpochKey;
    applyBatch(m, ek, 0, b.events, 16);
    applyBatch(
      m,
      ek,
      1,
      decodeBatch(
        Buffer.from(
          encode([0, [encodeEvent({ type: "BlockRemoved", block_hashes: [12n] }, "array", "sglang")], 3], {
            useBigInt64: true,
          }),
        ),
      ).events,
      16,
    );
    assert.deepEqual(tierCounts(m, ek), { GPU: 1, CPU: 0, DISK: 0, EXTERNAL: 0 });
  } finally {
    await p.close();
  }
  // A map-shaped batch naming the rank SGLang's way is read too.
  assert.equal(decodeBatch(encode({ ts: 0, events: [], attn_dp_rank: 1 })).dpRank, 1);
  assert.equal(decodeBatch(encode([0, []])).dpRank, null, "SGLang without DP attention omits the rank (omit_defaults)");
});

const W = (o: Partial<Worker>): Worker => ({ id: "w", address: "h:1", role: "mixed", epochKey: "w#1" as never, ...o });

test("the picked ranks reach SGLang in the body: routed_dp_rank (+ the deprecated data_parallel_rank), disagg_prefill_dp_rank for PD", () => {
  assert.equal(dpBodyFields("chat", W({ dpRank: 1 }), null), null, "vLLM: the header only");
  assert.deepEqual(dpBodyFields("chat", W({ dpRank: 1, engine: "sglang" }), null), {
    routed_dp_rank: 1,
    data_parallel_rank: 1,
  });
  assert.deepEqual(
    dpBodyFields("completions", W({ engine: "sglang", role: "decode" }), W({ dpRank: 2, role: "prefill" })),
    { disagg_prefill_dp_rank: 2 },
  );
  assert.deepEqual(dpBodyFields("chat", W({ engine: "sglang", dpRank: 0 }), W({ dpRank: 1 })), {
    routed_dp_rank: 0,
    data_parallel_rank: 0,
    disagg_prefill_dp_rank: 1,
  });
  assert.equal(
    dpBodyFields("messages", W({ dpRank: 1, engine: "sglang" }), null),
    null,
    "SGLang's /v1/messages reads the header only",
  );
  assert.equal(dpBodyFields("chat", W({ engine: "sglang" }), null), null, "no rank, nothing to add");
  assert.equal(prefillRankHeader("x-infera-prefill"), "x-infera-prefill-dp-rank");

  // Appended last, every other byte kept (1.0 stays 1.0); a client's own routed_dp_rank loses (Python and JS keep the last key).
  const body = '{"model":"m","temperature":1.0,"routed_dp_rank":0,"messages":[{"role":"user","content":"hi"}]}\n';
  const out = withBodyFields(body, { routed_dp_rank: 1, data_parallel_rank: 1 })!;
  assert.equal(
    out,
    '{"model":"m","temperature":1.0,"routed_dp_rank":0,"messages":[{"role":"user","content":"hi"}],"routed_dp_rank":1,"data_parallel_rank":1}\n',
  );
  assert.equal(JSON.parse(out).routed_dp_rank, 1);
  assert.equal(withBodyFields("{ }", { routed_dp_rank: 2 }), '{ "routed_dp_rank":2}');
  assert.deepEqual(JSON.parse(withBodyFields(' {"a":[1]}  ', { x: 0 })!), { a: [1], x: 0 });
  assert.equal(withBodyFields("[1]", { x: 0 }), null);
  assert.equal(withBodyFields("", { x: 0 }), null);
});

test('--workers /sglang and etcd "engine": the engine kind rides on every rank target', () => {
  const w = parseWorkers(
    "127.0.0.1:8000/dp=2/sglang@tcp://127.0.0.1:5557+tcp://127.0.0.1:5600,decode=127.0.0.1:8001/sglang,127.0.0.1:8002/vllm",
  );
  assert.deepEqual(
    w.map((x) => [x.id, x.engine, x.dpRank, x.events, x.replay]),
    [
      ["127.0.0.1:8000/dp0", "sglang", 0, "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5600"],
      ["127.0.0.1:8000/dp1", "sglang", 1, "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5601"],
      ["127.0.0.1:8001", "sglang", undefined, undefined, undefined],
      ["127.0.0.1:8002", undefined, undefined, undefined, undefined],
    ],
  );
  const s = specsFromEtcd(
    "w0",
    JSON.stringify({ address: "10.0.0.5:8000", dp_size: 2, engine: "sglang", kv_events: "tcp://10.0.0.5:5557" }),
  );
  assert.deepEqual(
    s.map((x) => [x.id, x.engine, x.events]),
    [
      ["w0/dp0", "sglang", "tcp://10.0.0.5:5557"],
      ["w0/dp1", "sglang", "tcp://10.0.0.5:5558"],
    ],
  );
  assert.throws(() => specsFromEtcd("w1", JSON.stringify({ address: "h:1", engine: "trt" })), /unknown engine 'trt'/);
});
