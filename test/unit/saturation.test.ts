// Engine saturation -> flow control (runtime/saturation.ts) with the real
// prefill admission of core/admission.ts: a worker over either threshold holds
// its cold prompts, the first reading under both releases them, a worker
// without figures has headroom, and a worker that left loses its mark. The
// flags: both thresholds off by default, and on only with the scrape on.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { prefillAdmission } from "../../core/admission";
import { EngineReading } from "../../core/engine-readings";
import { SaturationFeed } from "../../runtime/saturation";
import { parseArgs } from "../../runtime/config";

const reading = (waiting: number | null, kvUsage: number | null): EngineReading => ({
  capacityBlocks: 1000,
  kvUsage,
  waitingRequests: waiting,
  runningRequests: 1,
  at: 1,
});

test("a worker at the queue threshold holds cold prompts; the first reading under it releases them", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 512 });
  const lines: string[] = [];
  const feed = new SaturationFeed(
    () => a,
    { queueDepth: 2, kvUsage: 0 },
    (_l, msg) => lines.push(msg),
  );
  const went: string[] = [];
  feed.update("w", reading(1, 0.99));
  assert.equal(feed.saturated("w"), false, "under the queue threshold; the KV signal is off");
  feed.update("w", reading(2, 0.1));
  assert.equal(feed.saturated("w"), true, "a queue at the threshold counts");
  const cold = a.enter("w", 4000, () => went.push("cold"));
  const warm = a.enter("w", 100, () => went.push("warm"));
  assert.deepEqual(went, ["warm"], "the cold prompt waits with the slot free; the warm one goes");
  feed.update("w", reading(3, 0.1));
  assert.deepEqual(went, ["warm"]);
  feed.update("w", reading(1, 0.1));
  assert.deepEqual(went, ["warm", "cold"]);
  assert.equal(cold.slot, true);
  assert.deepEqual(lines, ["worker saturated: cold prompts wait at the router", "worker has headroom again"]);
  warm.leave();
  cold.leave();
});

test("KV usage at the threshold saturates; no figures (a failed scrape) is headroom; a gone worker is cleared", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 512 });
  const feed = new SaturationFeed(
    () => a,
    { queueDepth: 0, kvUsage: 0.8 },
    () => undefined,
  );
  const went: string[] = [];
  feed.update("w", reading(50, 0.8));
  feed.update("v", reading(0, 0.95));
  assert.equal(feed.saturated("w"), true);
  a.enter("w", 4000, () => went.push("w1"));
  a.enter("v", 4000, () => went.push("v1"));
  assert.deepEqual(went, []);
  feed.update("w", null);
  assert.deepEqual(went, ["w1"], "a worker whose page failed counts as having headroom");
  feed.update("v", reading(0, null));
  assert.deepEqual(went, ["w1", "v1"], "no KV figure: headroom");
  feed.update("v", reading(0, 0.9));
  a.enter("v", 4000, () => undefined);
  feed.retain(["w"]);
  assert.equal(feed.saturated("v"), false, "v left the fleet: its mark goes");
});

test("both thresholds off: readings change nothing", () => {
  const a = prefillAdmission({ slots: 1, warmTokens: 512 });
  const feed = new SaturationFeed(
    () => a,
    { queueDepth: 0, kvUsage: 0 },
    () => undefined,
  );
  assert.equal(feed.on, false);
  feed.update("w", reading(1000, 1));
  assert.equal(feed.saturated("w"), false);
  let went = false;
  a.enter("w", 4000, () => (went = true));
  assert.equal(went, true);
});

test("flags: thresholds off by default, the scrape on by default; a threshold with the scrape off fails at start", () => {
  const o = parseArgs(["--workers", "127.0.0.1:1"], {});
  assert.equal(o.engineMetrics!.intervalMs, 1000);
  assert.deepEqual(o.engineMetrics!.saturation, { queueDepth: 0, kvUsage: 0 });
  const on = parseArgs(
    ["--workers", "127.0.0.1:1", "--saturation-queue-depth", "5", "--saturation-kv-usage", "0.8"],
    {},
  );
  assert.deepEqual(on.engineMetrics!.saturation, { queueDepth: 5, kvUsage: 0.8 });
  assert.throws(
    () =>
      parseArgs(["--workers", "127.0.0.1:1", "--saturation-queue-depth", "5", "--engine-metrics-interval-ms", "0"], {}),
    /--engine-metrics-interval-ms/,
  );
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1", "--lora-metrics-interval-ms", "500"], {}), /lora-metrics/);
});
