// Issue 26 items 5/6 (KV event intake): duplicate worker ids, SGLang's
// BlockStoredWithMetadata, exact topics, exactly logged sequence numbers.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as path from "path";
import { oneLine } from "./helpers";
import { parseArgs } from "../../runtime/config";
import { entryArgs } from "../harness";

const ROOT = path.resolve(__dirname, "../..");

function runCli(script: string, args: string[]) {
  const clean: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("INFERA_") && v !== undefined) clean[k] = v;
  return spawnSync(process.execPath, [...entryArgs(script), ...args], {
    cwd: ROOT,
    env: clean,
    encoding: "utf8",
    timeout: 30000,
  });
}

test("a worker id listed twice in --workers is refused at start: one line, exit 2 (router and bridge)", () => {
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1@tcp://127.0.0.1:5557,127.0.0.1:1@tcp://127.0.0.1:5999"], {}),
    /--workers: worker id '127.0.0.1:1' appears twice/,
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1,decode=127.0.0.1:1"], {}),
    /appears twice/,
    "a second role does not make a second worker",
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1/dp=2,127.0.0.1:1/dp=3"], {}),
    /worker id '127.0.0.1:1\/dp0' appears twice/,
    "DP rank targets too",
  );
  assert.doesNotThrow(() => parseArgs(["--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/dp=2"], {}));
  oneLine(
    runCli("cli/router.ts", ["--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:1", "--router-tokenizer-path", "none"]),
    /^infera-gate: --workers: worker id '127\.0\.0\.1:1' appears twice/,
  );
  oneLine(
    runCli("njs/bridge.ts", ["--workers", "127.0.0.1:1,127.0.0.1:1", "--push-token", "t"]),
    /^infera-bridge: --workers: worker id '127\.0\.0\.1:1' appears twice/,
  );
});

test("SGLang's BlockStoredWithMetadata: the metadata map in vLLM's lora_name slot salts the chain, never names an adapter", async () => {
  const { decodeBatch } = await import("../../runtime/events");
  const { applyBatch, adapterMetaKey, GLOBAL_META, requestRoot } = await import("../../core/kvevents");
  const { memoryMirror } = await import("../../core/state/memory");
  const { blockHashes } = await import("../../core/hash");
  // The bytes SGLang's msgspec encoder writes for KVEventBatch(ts=1.5, events=[
  //   BlockStoredWithMetadata(block_hashes=[7, 8], parent_block_hash=None, token_ids=[0..7], block_size=4,
  //     lora_id=None, medium="GPU", metadata=BlockStoredMetadata(cache_salt="tenant-a"))], attn_dp_rank=0):
  // array_like structs are arrays (tag first), the kw_only `metadata` comes after medium,
  // and BlockStoredMetadata (a plain Struct) is a map.
  const hex =
    "93" +
    "cb3ff8000000000000" +
    "91" + // [1.5, [event], 0]
    "98" +
    "ab" +
    Buffer.from("BlockStored").toString("hex") +
    "92" +
    "07" +
    "08" +
    "c0" +
    "98" +
    "0001020304050607" +
    "04" +
    "c0" +
    "a3" +
    Buffer.from("GPU").toString("hex") +
    "81" +
    "aa" +
    Buffer.from("cache_salt").toString("hex") +
    "a8" +
    Buffer.from("tenant-a").toString("hex") +
    "00";
  const b = decodeBatch(Buffer.from(hex, "hex"));
  const ev = b.events[0] as Extract<import("../../core/kvevents").KvEvent, { type: "BlockStored" }>;
  assert.equal(ev.loraName, null, 'no adapter named "[object Object]"');
  assert.equal(b.dpRank, 0);
  const m = memoryMirror();
  const ek = "s#1" as never;
  const r = applyBatch(m, ek, 0, b.events, 4);
  assert.equal(r.stored, 2);
  assert.equal(m.meta(GLOBAL_META, adapterMetaKey("[object Object]")), undefined);
  // The request side: the same tokens with cache_salt "tenant-a" hit both blocks; unsalted or another salt, none.
  const toks = [0, 1, 2, 3, 4, 5, 6, 7];
  const hits = (salt: string | null) =>
    m.prefixHits(blockHashes(toks, 4, undefined, requestRoot(m, "base-model", salt) ?? undefined), { [ek]: true })[
      ek
    ] ?? 0;
  assert.equal(hits("tenant-a"), 2, "the salted tenant hits");
  assert.equal(hits(null), 0, "an unsalted request does not");
  assert.equal(hits("tenant-b"), 0, "another tenant does not");
  // A map in that slot (no lora_name) and a map-form event's `metadata` are read alike; anything else there is refused, not stringified.
  const { encode } = await import("@msgpack/msgpack");
  const mapForm = decodeBatch(
    encode({
      ts: 0,
      events: [
        {
          type: "BlockStored",
          block_hashes: [9],
          parent_block_hash: null,
          token_ids: [0, 1, 2, 3],
          block_size: 4,
          lora_id: null,
          medium: "GPU",
          metadata: { cache_salt: "s" },
        },
      ],
    }),
  );
  assert.deepEqual((mapForm.events[0] as { extraKeys: unknown }).extraKeys, [["s"]]);
  assert.throws(
    () => decodeBatch(encode([0, [["BlockStored", [9], null, [0, 1, 2, 3], 4, null, "GPU", [1, 2]]]])),
    /lora_name is a list, not a string/,
  );
});

test("a Snapshot batch (SGLang snapshot-v1 resync) keeps the mirrored blocks the engine still holds, per tier, and drops the rest; the bridge's shadow follows", async () => {
  const { applyBatch, tierCounts } = await import("../../core/kvevents");
  const { memoryMirror } = await import("../../core/state/memory");
  const { Shadow } = await import("../../njs/bridge");
  const m = memoryMirror();
  const sh = new Shadow();
  const ek = "s#1" as never;
  const t = (b: number) => [b, b + 1, b + 2, b + 3];
  const batches: [number, import("../../core/kvevents").KvEvent[]][] = [
    [
      0,
      [
        {
          type: "BlockStored",
          hashes: ["1", "2"],
          parent: null,
          tokens: [...t(0), ...t(4)],
          blockSize: 4,
          medium: "GPU",
        },
      ],
    ],
    [1, [{ type: "BlockStored", hashes: ["3"], parent: null, tokens: t(8), blockSize: 4, medium: "CPU_PINNED" }]],
  ];
  for (const [s, evs] of batches) {
    applyBatch(m, ek, s, evs, 4);
    sh.apply(s, evs);
  }
  const before = m.lookup(ek, "1" as never);
  // seq 2..6 were missed; the resync batch at the barrier (seq 7): a live store held meanwhile, then the cut.
  const resync: import("../../core/kvevents").KvEvent[] = [
    { type: "BlockStored", hashes: ["4"], parent: null, tokens: t(12), blockSize: 4, medium: "GPU" },
    { type: "Snapshot", hashes: ["1", "3", "4", "99"] },
  ];
  const r = applyBatch(m, ek, 7, resync, 4);
  sh.apply(7, resync);
  assert.equal(r.gap, false, "a resync is not a wipe");
  assert.deepEqual(r.resync, { kept: 3, unknown: 1 });
  assert.equal(m.lookup(ek, "1" as never), before);
  assert.equal(m.lookup(ek, "2" as never), undefined, "gone from the engine: dropped");
  assert.deepEqual(tierCounts(m, ek), { GPU: 2, CPU: 1, DISK: 0, EXTERNAL: 0 });
  assert.equal(m.sequence(ek), 7);
  assert.deepEqual(sh.tierCounts(), { GPU: 2, CPU: 1, DISK: 0, EXTERNAL: 0 });
  // The next live batch follows on without a gap.
  assert.equal(applyBatch(m, ek, 8, [], 4).gap, false);
});

test("snapshot endpoints: --workers @pub+replay+snapshot (an empty replay allowed) and etcd kv_snapshot, per DP rank at port + rank", async () => {
  const { specsFromEtcd } = await import("../../runtime/etcd");
  const w = parseArgs(
    [
      "--workers",
      "127.0.0.1:8000/dp=2/sglang@tcp://127.0.0.1:5557+tcp://127.0.0.1:5600+tcp://127.0.0.1:5700,127.0.0.1:8001@tcp://127.0.0.1:6557++tcp://127.0.0.1:6700",
    ],
    {},
  ).workers;
  assert.deepEqual(
    w.map((x) => [x.id, x.events, x.replay, x.snapshot]),
    [
      ["127.0.0.1:8000/dp0", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5600", "tcp://127.0.0.1:5700"],
      ["127.0.0.1:8000/dp1", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5601", "tcp://127.0.0.1:5701"],
      ["127.0.0.1:8001", "tcp://127.0.0.1:6557", undefined, "tcp://127.0.0.1:6700"],
    ],
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1@tcp://127.0.0.1:5557++nope"], {}),
    /snapshot endpoint 'nope' is not tcp:\/\/host:port/,
  );
  const s = specsFromEtcd(
    "w0",
    JSON.stringify({
      address: "10.0.0.5:8000",
      dp_size: 2,
      engine: "sglang",
      kv_events: "tcp://10.0.0.5:5557",
      kv_snapshot: "tcp://10.0.0.5:5700",
    }),
  );
  assert.deepEqual(
    s.map((x) => x.snapshot),
    ["tcp://10.0.0.5:5700", "tcp://10.0.0.5:5701"],
  );
  assert.throws(
    () => specsFromEtcd("w1", JSON.stringify({ address: "h:1", kv_snapshot: 5 })),
    /'kv_snapshot' must be tcp:\/\/host:port/,
  );
});

test("rateLimitedLog: a few lines per window, then one summary per window with the suppressed count per key", async () => {
  const { rateLimitedLog } = await import("../../runtime/ratelog");
  const out: string[] = [];
  const f = rateLimitedLog((_l, m) => out.push(m), {
    level: "warn",
    perWindow: 3,
    windowMs: 300,
    what: "kv-events refused frame",
  });
  for (let i = 0; i < 1000; i++) f(i % 4 === 0 ? "w1" : "w0", `bad ${i}`);
  assert.deepEqual(out.slice(0, 3), [
    "bad 0",
    "bad 1",
    "bad 2 (further lines like this are counted, not logged, for 0s)",
  ]);
  assert.equal(out.length, 3);
  // The window closes after 300 ms; a loaded machine may fire the timer late.
  for (let i = 0; i < 100 && out.length < 4; i++) await new Promise((r) => setTimeout(r, 50));
  assert.equal(out.length, 4, out.join("\n"));
  assert.match(
    out[3],
    /^kv-events refused frame: 997 more line\(s\) suppressed in the last \ds \(w0: 748, w1: 249\); counters in \/metrics$/,
  );
  for (let i = 0; i < 5; i++) f("w2", `again ${i}`);
  assert.equal(out.length, 7, "a new window logs again");
  f.close();
  assert.match(out[7], /2 more line\(s\) suppressed .*\(w2: 2\)/);
  assert.equal(out.length, 8);
});
