// Engine metrics (runtime/engine-metrics.ts) against the real simulator's
// /metrics: vLLM's cache_config_info and gauges, SGLang's names (--engine
// sglang), a data-parallel engine's per-rank series, a failed scrape; then a
// real router process learning every worker's capacity and showing it on its
// own /metrics, with --kv-capacity-blocks overriding one.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { EngineSim, parseSimArgs } from "../../sim/engine";
import { startDpSim, DpSim } from "../../sim/dp";
import { EngineMetrics, parsePrometheusText, readEngineFigures } from "../../runtime/engine-metrics";
import { createRouter, defaultConfig } from "../../core/router";
import { memoryState } from "../../core/state/memory";
import { freePort, startRouter, startSim, stopAll, waitFor } from "../harness";

const sims: EngineSim[] = [];
const dps: DpSim[] = [];
after(async () => {
  await Promise.all(sims.map((s) => s.stop()));
  await Promise.all(dps.map((d) => d.stop()));
  await stopAll();
});

async function sim(extra: string[]): Promise<EngineSim> {
  const s = new EngineSim(
    parseSimArgs(["--id", "em", "--port", String(await freePort()), "--kv-events-port", "none", ...extra]),
  );
  await s.start();
  sims.push(s);
  return s;
}

const page = async (address: string) => parsePrometheusText(await (await fetch(`http://${address}/metrics`)).text());

function scraper(blockSize = 16, capacityOverride: { [id: string]: number } = {}) {
  const router = createRouter(memoryState(), { ...defaultConfig(), blockSize });
  const em = new EngineMetrics(() => router, {
    intervalMs: 0,
    timeoutMs: 2000,
    blockSize,
    capacityOverride,
    log: () => undefined,
  });
  return { router, em, reading: (id: string) => router.state.engine!.get(router.worker(id)!.epochKey) };
}

test("a vLLM-mode simulator's page: capacity from cache_config_info, usage and queue from its gauges", async () => {
  const s = await sim(["--capacity-blocks", "777", "--block-size", "16"]);
  const f = readEngineFigures(await page(`127.0.0.1:${s.o.port}`));
  assert.equal(f.engine, "vllm");
  assert.equal(f.capacityTokens, 777 * 16);
  assert.equal(f.kvUsage, 0);
  assert.equal(f.waitingRequests, 0);
  assert.equal(f.runningRequests, 0);

  // In router blocks: a router at --block-size 32 counts half as many.
  const { router, em, reading } = scraper(32);
  router.addWorker({ id: "v", address: `127.0.0.1:${s.o.port}`, role: "mixed" });
  await em.scrapeAll();
  assert.equal(reading("v")!.capacityBlocks, Math.floor((777 * 16) / 32));
  assert.ok(reading("v")!.at > 0);
});

test("usage and queue follow the engine: a running request shows in kvUsage and runningRequests", async () => {
  // Engine time at a twentieth of wall time: the request stays in the batch while we scrape.
  const s = await sim(["--capacity-blocks", "400", "--time-scale", "0.05"]);
  const { router, em, reading } = scraper();
  router.addWorker({ id: "v", address: `127.0.0.1:${s.o.port}`, role: "mixed" });
  const ac = new AbortController();
  const prompt = Array.from({ length: 1600 }, (_, i) => 1000 + i);
  const req = fetch(`http://127.0.0.1:${s.o.port}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt, max_tokens: 200, stream: true }),
    signal: ac.signal,
  }).catch(() => undefined);
  await waitFor(
    "the request is in the engine's batch",
    async () => {
      await em.scrapeAll();
      const r = reading("v")!;
      return r.runningRequests === 1 && (r.kvUsage ?? 0) > 0;
    },
    10000,
  );
  const r = reading("v")!;
  // 1,600 prompt tokens are 100 of the 400 blocks, at least.
  assert.ok(r.kvUsage! >= 0.25 && r.kvUsage! <= 1, `kvUsage ${r.kvUsage}`);
  assert.equal(r.capacityBlocks, 400);
  ac.abort();
  await req;
});

test("an SGLang-mode simulator's page: sglang:max_total_num_tokens, token_usage, num_queue_reqs", async () => {
  const s = await sim(["--engine", "sglang", "--capacity-blocks", "555"]);
  const samples = await page(`127.0.0.1:${s.o.port}`);
  assert.ok(!samples.some((x) => x.name.startsWith("vllm:")));
  const f = readEngineFigures(samples);
  assert.equal(f.engine, "sglang");
  assert.equal(f.capacityTokens, 555 * 16);
  assert.equal(f.kvUsage, 0);
  assert.equal(f.waitingRequests, 0);
  const { router, em, reading } = scraper();
  router.addWorker({ id: "g", address: `127.0.0.1:${s.o.port}`, role: "mixed" });
  await em.scrapeAll();
  assert.equal(reading("g")!.capacityBlocks, 555);
});

test("a data-parallel engine: each rank target reads its own engine=<rank> series from one page", async () => {
  const port = await freePort();
  const o = parseSimArgs([
    "--id",
    "dp",
    "--port",
    String(port),
    "--kv-events-port",
    "none",
    "--data-parallel-size",
    "2",
    "--capacity-blocks",
    "300",
  ]);
  const d = await startDpSim(o);
  dps.push(d);
  const samples = await page(`127.0.0.1:${d.port}`);
  assert.deepEqual(
    samples
      .filter((x) => x.name === "vllm:cache_config_info")
      .map((x) => x.labels.engine)
      .sort(),
    ["0", "1"],
  );
  // Keep rank 1 busy: only its series shows a running request.
  const ac = new AbortController();
  void fetch(`http://127.0.0.1:${d.port}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-data-parallel-rank": "1" },
    body: JSON.stringify({ model: "m", prompt: Array.from({ length: 800 }, (_, i) => 5 + i), max_tokens: 500 }),
    signal: ac.signal,
  }).catch(() => undefined);
  const { router, em, reading } = scraper();
  router.addWorker({ id: "dp/dp0", address: `127.0.0.1:${d.port}`, role: "mixed", dpRank: 0 });
  router.addWorker({ id: "dp/dp1", address: `127.0.0.1:${d.port}`, role: "mixed", dpRank: 1 });
  await waitFor(
    "rank 1 running",
    async () => {
      await em.scrapeAll();
      return reading("dp/dp1")!.runningRequests === 1;
    },
    10000,
  );
  assert.equal(reading("dp/dp0")!.runningRequests, 0);
  assert.equal(reading("dp/dp0")!.capacityBlocks, 300);
  assert.equal(reading("dp/dp1")!.capacityBlocks, 300);
  ac.abort();
});

test("a failed scrape clears usage and queue, keeps the capacity; an override wins over the page", async () => {
  const s = await sim(["--capacity-blocks", "900"]);
  const { router, em, reading } = scraper(16, { w2: 123 });
  router.addWorker({ id: "w1", address: `127.0.0.1:${s.o.port}`, role: "mixed" });
  router.addWorker({ id: "w2", address: `127.0.0.1:${s.o.port}`, role: "mixed" });
  await em.scrapeAll();
  assert.equal(reading("w1")!.capacityBlocks, 900);
  assert.equal(reading("w1")!.kvUsage, 0);
  assert.equal(reading("w2")!.capacityBlocks, 123);
  await s.stop();
  await em.scrapeAll();
  assert.equal(reading("w1")!.capacityBlocks, 900);
  assert.equal(reading("w1")!.kvUsage, null);
  assert.equal(reading("w1")!.waitingRequests, null);
});

test("the router process learns each worker's capacity and exports it on /metrics", async () => {
  const a = await startSim("a", ["--capacity-blocks", "640"]);
  const b = await startSim("b", ["--capacity-blocks", "2000", "--engine", "sglang"]);
  const c = await startSim("c", ["--capacity-blocks", "5000"]);
  const r = await startRouter([
    "--workers",
    [a, b, c].map((s) => `${s.address}@${s.events}`).join(","),
    "--engine-metrics-interval-ms",
    "50",
    "--kv-capacity-blocks",
    `${c.address}=64`,
  ]);
  const line = (m: string, name: string, worker: string) =>
    m.split("\n").find((l) => l.startsWith(`${name}{worker="${worker}"}`));
  await waitFor(
    "capacities on the router's /metrics",
    async () => {
      const m = await r.metrics();
      return (
        !!line(m, "infera_router_worker_kv_capacity_blocks", a.address) &&
        !!line(m, "infera_router_worker_kv_capacity_blocks", b.address)
      );
    },
    15000,
  );
  const m = await r.metrics();
  assert.equal(
    line(m, "infera_router_worker_kv_capacity_blocks", a.address),
    `infera_router_worker_kv_capacity_blocks{worker="${a.address}"} 640`,
  );
  assert.equal(
    line(m, "infera_router_worker_kv_capacity_blocks", b.address),
    `infera_router_worker_kv_capacity_blocks{worker="${b.address}"} 2000`,
  );
  assert.equal(
    line(m, "infera_router_worker_kv_capacity_blocks", c.address),
    `infera_router_worker_kv_capacity_blocks{worker="${c.address}"} 64`,
  );
  assert.equal(
    line(m, "infera_router_worker_kv_usage_ratio", a.address),
    `infera_router_worker_kv_usage_ratio{worker="${a.address}"} 0`,
  );
  assert.equal(
    line(m, "infera_router_worker_engine_waiting_requests", b.address),
    `infera_router_worker_engine_waiting_requests{worker="${b.address}"} 0`,
  );
});
