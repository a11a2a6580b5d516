// runtime/fast-counter.ts against prom-client's own Counter: the same incs
// (by 1, by n, by 0, with and without labels) give the same exposition text
// and JSON values; reset() drops the series as prom-client's does; a negative
// or non-finite inc is refused as prom-client refuses it.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as client from "prom-client";
import { FastCounter } from "../../runtime/fast-counter";
import { spec } from "../../runtime/metrics";

test("labelled: the same incs give prom-client's exposition and JSON, before and after a reset", async () => {
  const regA = new client.Registry();
  const regB = new client.Registry();
  const ours = new FastCounter(spec("infera_router_picks_total"), regA);
  const theirs = new client.Counter({ ...spec("infera_router_picks_total"), registers: [regB] });
  const other = new FastCounter(spec("infera_router_cache_hit_blocks_total"), regA);
  const otherB = new client.Counter({ ...spec("infera_router_cache_hit_blocks_total"), registers: [regB] });
  assert.equal(await regA.metrics(), await regB.metrics(), "nothing counted yet");
  const incs: [Record<string, string>, number | undefined][] = [
    [{ worker: "w0", role: "prefill", policy: "kv-aware" }, undefined],
    [{ worker: "w1", role: "prefill", policy: "kv-aware" }, 0],
    [{ worker: "w0", role: "prefill", policy: "kv-aware" }, 3],
    [{ role: "decode", worker: "w0", policy: "kv-aware" }, 1],
  ];
  for (const [l, v] of incs) {
    ours.inc(l, v);
    theirs.inc(l, v);
  }
  other.inc({ worker: "w0", role: "prefill" }, 0);
  otherB.inc({ worker: "w0", role: "prefill" }, 0);
  assert.equal(await regA.metrics(), await regB.metrics());
  assert.deepEqual(await regA.getMetricsAsJSON(), await regB.getMetricsAsJSON());
  assert.match(
    await regA.metrics(),
    /infera_router_picks_total\{worker="w0",role="prefill",policy="kv-aware"\} 4\n/,
    "the same label values are one series",
  );
  regA.resetMetrics();
  regB.resetMetrics();
  assert.equal(await regA.metrics(), await regB.metrics(), "after a reset");
  assert.throws(() => ours.inc({ worker: "w0", role: "prefill", policy: "x" }, -1));
  assert.throws(() => ours.inc({ worker: "w0", role: "prefill", policy: "x" }, Infinity));
});

test("unlabelled: 0 from the start, inc() and inc(n), 0 again after a reset", async () => {
  const regA = new client.Registry();
  const regB = new client.Registry();
  const cfg = { name: "infera_test_total", help: "a test counter", labelNames: [] as string[] };
  const ours = new FastCounter(cfg, regA);
  const theirs = new client.Counter({ ...cfg, registers: [regB] });
  assert.equal(await regA.metrics(), await regB.metrics());
  ours.inc();
  theirs.inc();
  ours.inc(2.5);
  theirs.inc(2.5);
  assert.equal(await regA.metrics(), await regB.metrics());
  assert.match(await regA.metrics(), /^infera_test_total 3.5$/m);
  regA.resetMetrics();
  regB.resetMetrics();
  assert.equal(await regA.metrics(), await regB.metrics());
});
