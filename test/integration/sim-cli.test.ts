// The simulator started as `infera-gate sim` (cli/main.ts, the shared CLI
// layer) with flags from the command line, env and a --config file: it
// serves, and publishes vLLM KV events on the port and topic it was given.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import * as zmq from "zeromq";
import { decode } from "@msgpack/msgpack";
import { freePort, run, stopAll, waitFor, httpOk, entryArgs } from "../harness";

after(stopAll);

test("infera-gate sim serves and publishes KV events with flags from argv, INFERA_* env and --config", async () => {
  const port = await freePort();
  const eventsPort = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-sim-it-"));
  const cfg = path.join(dir, "sim.yaml");
  fs.writeFileSync(cfg, "id: cfg-sim\nblock-size: 8\ntopic: kv\nserved-model-name: m1\n");
  const proc = run(
    "sim-cli",
    process.execPath,
    [...entryArgs("cli/main.ts"), "sim", "--config", cfg, "--port", String(port), "--tokenizer-path", "none"],
    {
      INFERA_KV_EVENTS_PORT: String(eventsPort),
      INFERA_TIME_SCALE: "20",
    },
  );
  await waitFor("sim via infera-gate", async () => {
    if (proc.child.exitCode !== null) throw new Error(`sim exited: ${proc.log()}`);
    return httpOk(`http://127.0.0.1:${port}/health`);
  });
  const stats = (await (await fetch(`http://127.0.0.1:${port}/sim/stats`)).json()) as { id: string; role: string };
  assert.equal(stats.id, "cfg-sim", "--config set the id");
  assert.equal(stats.role, "mixed");
  const models = (await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()) as { data: { id: string }[] };
  assert.deepEqual(
    models.data.map((m) => m.id),
    ["m1"],
  );

  const sub = new zmq.Subscriber();
  sub.connect(`tcp://127.0.0.1:${eventsPort}`);
  sub.subscribe("kv");
  try {
    // A slow joiner misses what was sent before the subscription took: send until a batch arrives (bounded).
    const got = (async () => {
      for await (const [topic, , payload] of sub) {
        const batch = decode(payload, { useBigInt64: true }) as [number, unknown[][], unknown];
        const stored = batch[1].find((e) => e[0] === "BlockStored");
        if (stored) return { topic: topic.toString(), stored };
      }
      throw new Error("subscriber closed");
    })();
    let done: { topic: string; stored: unknown[] } | null = null;
    void got.then((g) => (done = g));
    for (let i = 0; i < 50 && !done; i++) {
      const prompt = Array.from({ length: 40 }, (_, k) => 100 + i * 1000 + k);
      const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m1", prompt, max_tokens: 2 }),
      });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("x-sim-worker"), "cfg-sim");
      await r.arrayBuffer();
      await new Promise((res) => setTimeout(res, 100));
    }
    assert.ok(done, "a BlockStored batch arrived on the env-given events port");
    const { topic, stored } = done as { topic: string; stored: unknown[] };
    assert.equal(topic, "kv", "topic from the config file");
    // [tag, block_hashes, parent, token_ids, block_size, lora_id, medium]: 40 tokens in 8-token blocks.
    assert.equal(stored[4], 8, "block size from the config file");
    assert.equal((stored[1] as unknown[]).length, 5);
  } finally {
    sub.close();
    await proc.kill();
  }
});
