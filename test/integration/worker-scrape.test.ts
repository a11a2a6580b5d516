// The one /metrics scrape (runtime/engine-metrics.ts) in a real router App
// against two real HTTP servers that count the GETs they answer: each
// interval asks each worker for its page once, and that one page feeds both
// the engine readings (KV capacity, queue) and the LoRA table. Every page a
// server answers is numbered, so a reading taken from another GET than the
// LoRA state shows as a different number.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as http from "http";
import { AddressInfo } from "net";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A vLLM-like /metrics page whose figures all say n: capacity 100 + n blocks, n waiting, adapter a<n> running. */
function page(n: number): string {
  return [
    "# TYPE vllm:cache_config_info gauge",
    `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="${100 + n}"} 1.0`,
    `vllm:num_requests_waiting{engine="0",model_name="m"} ${n}`,
    `vllm:num_requests_running{engine="0",model_name="m"} 1`,
    `vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25`,
    "# TYPE vllm:lora_requests_info gauge",
    `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a${n}",waiting_lora_adapters=""} ${1000 + n}`,
    "",
  ].join("\n");
}

async function engine(): Promise<{ address: string; gets: number[]; close: () => void }> {
  const gets: number[] = [];
  const server = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/metrics") {
      gets.push(Date.now());
      res.writeHead(200, { "content-type": "text/plain" });
      return void res.end(page(gets.length));
    }
    res.writeHead(404);
    res.end();
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return {
    address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    gets,
    close: () => server.close(),
  };
}

test("one GET per worker per interval feeds both the LoRA state and the capacity and queue readings", async () => {
  const e = [await engine(), await engine()];
  const INTERVAL = 200;
  const opts = parseArgs(
    [
      "--workers",
      e.map((x) => x.address).join(","),
      "--health-interval-ms",
      "0",
      "--render-probe-api",
      "off",
      "--engine-metrics-interval-ms",
      String(INTERVAL),
    ],
    {},
  );
  const app = new App(opts, () => undefined, noEvents);
  for (const w of opts.workers) app.addWorker(w);
  try {
    // Whatever the router starts at run time: health checks (off here) and the engine scrape.
    app.startHealthChecks();
    app.startEngineMetrics();
    const t0 = Date.now();
    await sleep(5 * INTERVAL + INTERVAL / 2);
    const ran = Date.now() - t0;
    app.engineMetrics.stop();
    await sleep(300); // a page still in flight lands
    for (const x of e) {
      const n = x.gets.length;
      // Rounds at 0, 1, ... 5 intervals: six, give or take a round at the edges.
      assert.ok(n >= 3 && n <= Math.floor(ran / INTERVAL) + 2, `${x.address}: ${n} GETs in ${ran} ms`);
      for (let i = 1; i < n; i++)
        assert.ok(
          // Two readers on their own timers both ask at start, milliseconds apart; a loaded machine only delays ticks.
          x.gets[i] - x.gets[i - 1] >= INTERVAL / 4,
          `${x.address}: GETs ${i} and ${i + 1} came ${x.gets[i] - x.gets[i - 1]} ms apart (one per interval)`,
        );
      const w = app.router.worker(x.address)!;
      const r = app.state.engine!.get(w.epochKey)!;
      // Both from the last page this server answered.
      assert.equal(r.capacityBlocks, 100 + n, "capacity from the last page");
      assert.equal(r.waitingRequests, n, "queue from the last page");
      assert.deepEqual(app.lora.get(x.address), { maxLora: 2, running: [`a${n}`], waiting: [] }, "LoRA from it too");
    }
  } finally {
    await app.close();
    for (const x of e) x.close();
  }
});
