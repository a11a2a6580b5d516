// runtime/fast-histogram.ts against prom-client's own Histogram: the same
// observations through both give the same exposition text and the same JSON
// values, reset() zeroes the bound children, and a label set is listed only
// once it has been observed.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as client from "prom-client";
import { FastHistogram } from "../../runtime/fast-histogram";
import { spec } from "../../runtime/metrics";

const NAME = "infera_router_plugin_duration_seconds";

function both() {
  const regA = new client.Registry();
  const regB = new client.Registry();
  const ours = new FastHistogram(spec(NAME), regA);
  const theirs = new client.Histogram({ ...spec(NAME), registers: [regB] });
  return { regA, regB, ours, theirs };
}

test("the same observations give prom-client's exposition and JSON, bucket edges included", async () => {
  const { regA, regB, ours, theirs } = both();
  const bounds = spec(NAME).buckets!;
  // Every bucket edge, values between edges, above the last one, and zero.
  const xs = [0, ...bounds, ...bounds.map((b) => b * 1.5), 0.3, 7, 1e-7];
  const sets = [
    { plugin: "kv-aware", kind: "picker" },
    { plugin: "usable", kind: "filter" },
    { plugin: "load-reservation", kind: "lifecycle" },
  ];
  sets.forEach((labels, k) => {
    const a = ours.labels(labels);
    const b = theirs.labels(labels);
    for (let i = 0; i < xs.length; i++)
      if ((i + k) % (k + 1) === 0) {
        a.observe(xs[i]);
        b.observe(xs[i]);
      }
  });
  assert.equal(await regA.metrics(), await regB.metrics());
  const ja = await regA.getMetricsAsJSON();
  const jb = await regB.getMetricsAsJSON();
  const strip = (j: typeof ja) =>
    j.map((m) => ({ ...m, values: m.values.map((v) => ({ ...v, exemplar: undefined })) }));
  assert.deepEqual(strip(ja), strip(jb));
  assert.ok(ja[0].values.length > 0);
});

test("a child bound once keeps counting after reset(), from zero; unobserved label sets are not listed", async () => {
  const { regA, regB, ours, theirs } = both();
  const a = ours.labels({ plugin: "p", kind: "scorer" });
  ours.labels({ plugin: "never", kind: "scorer" });
  const b = theirs.labels({ plugin: "p", kind: "scorer" });
  a.observe(0.00002);
  b.observe(0.00002);
  regA.resetMetrics();
  regB.resetMetrics();
  a.observe(0.003);
  b.observe(0.003);
  assert.equal(ours.labels({ plugin: "p", kind: "scorer" }), a, "the same label set is the same child");
  const text = await regA.metrics();
  assert.equal(text, await regB.metrics());
  assert.doesNotMatch(text, /never/);
  assert.match(text, /infera_router_plugin_duration_seconds_count\{plugin="p",kind="scorer"\} 1\n/);
});

test("unlabelled: listed at zero before any observation, observe(value) and observe(labels, value) as prom-client", async () => {
  const regA = new client.Registry();
  const regB = new client.Registry();
  const ours = new FastHistogram(spec("infera_router_pick_latency_seconds"), regA);
  const theirs = new client.Histogram({ ...spec("infera_router_pick_latency_seconds"), registers: [regB] });
  assert.equal(await regA.metrics(), await regB.metrics(), "before any observation");
  for (const v of [0.0001, 0.002, 0.3]) {
    ours.observe(v);
    theirs.observe(v);
  }
  assert.equal(await regA.metrics(), await regB.metrics());
  regA.resetMetrics();
  regB.resetMetrics();
  assert.equal(await regA.metrics(), await regB.metrics(), "after a reset");
  const name = "infera_router_ttft_prediction_error_ratio";
  const la = new FastHistogram(spec(name), regA);
  const lb = new client.Histogram({ ...spec(name), registers: [regB] });
  for (const [w, v] of [
    ["w0", 0.1],
    ["w1", 2],
    ["w0", 0.7],
  ] as [string, number][]) {
    la.observe({ worker: w }, v);
    lb.observe({ worker: w }, v);
  }
  assert.equal(await regA.metrics(), await regB.metrics());
  assert.match(await regA.metrics(), new RegExp(`${name}_count\\{worker="w0"\\} 2\\n`));
});
