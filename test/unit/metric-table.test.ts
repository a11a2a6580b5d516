// One metric table (core/metric-table.ts): the Node router's registry, the njs
// module's exposition and docs/configuration.md's metric list all come from it.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { Registry } from "prom-client";
import { metricTable, MetricSpec } from "../../core/metric-table";
import { Bridge } from "../../njs/bridge";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { ReplicaSync } from "../../runtime/replicas";
import { startExtProc } from "../../extproc/server";
import { FLAG_DOC, renderMetricTable } from "../../scripts/flags-doc";

const METRICS = metricTable();

const ROOT = path.resolve(__dirname, "../..");
const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };

test("the Node router registers exactly the table's metrics, with its names, types, help, labels and buckets", async () => {
  const app = new App(parseArgs(["--workers", "127.0.0.1:1"], {}), () => undefined, noEvents);
  // The ext_proc server and replica load sync register theirs on the app's registry too.
  const ext = await startExtProc(app, "127.0.0.1", 0);
  new ReplicaSync(
    app.state.load,
    app.state.workers,
    { id: "t", subject: "s", heartbeatMs: 1000, ttlMs: 3000 },
    () => {},
  ).register(app.metrics.registry);
  try {
    const reg = app.metrics.registry;
    const ours = (await reg.getMetricsAsJSON()).map((m) => m.name).filter((n) => n.startsWith("infera_"));
    const router = METRICS.filter((m) => !m.bridge && !m.njsOnly);
    assert.deepEqual(ours.sort(), router.map((m) => m.name).sort(), "registered infera_* metrics = the table");
    await sameAsTable(reg, router);
  } finally {
    ext.server.forceShutdown();
    await app.close();
  }
});

test("the bridge registers exactly the table's bridge metrics", async () => {
  const bridge = new Bridge(
    parseArgs(
      ["--workers", "127.0.0.1:1", "--nginx-push-url", "http://127.0.0.1:1/push", "--push-token", "t"],
      {},
      "bridge",
    ),
    () => undefined,
    { subscribe: () => ({ close() {} }), close: async () => undefined },
  );
  try {
    const ours = (await bridge.registry.getMetricsAsJSON()).map((m) => m.name).filter((n) => n.startsWith("infera_"));
    const table = METRICS.filter((m) => m.bridge);
    assert.deepEqual(ours.sort(), table.map((m) => m.name).sort());
    await sameAsTable(bridge.registry, table);
  } finally {
    await bridge.close();
  }
});

/** Each metric's HELP/TYPE in the exposition, labels and buckets as the table has them. */
async function sameAsTable(reg: Registry, specs: MetricSpec[]): Promise<void> {
  const text = await reg.metrics();
  for (const m of specs) {
    const got = reg.getSingleMetric(m.name) as unknown as {
      help: string;
      labelNames: string[];
      upperBounds?: number[];
    };
    assert.ok(text.includes(`# HELP ${m.name} ${m.help}\n# TYPE ${m.name} ${m.type}\n`), `${m.name} HELP/TYPE`);
    assert.deepEqual(got.labelNames, m.labels, `${m.name} labels`);
    if (m.type === "histogram") assert.deepEqual(got.upperBounds, m.buckets, `${m.name} buckets`);
    else assert.equal(m.buckets, undefined, `${m.name}: buckets only on histograms`);
  }
}

test("the njs exposition names only table metrics marked njs, and writes no HELP/TYPE text of its own", () => {
  const src = fs.readFileSync(path.join(ROOT, "njs/infera.ts"), "utf8");
  assert.doesNotMatch(src, /# (HELP|TYPE) /, "HELP/TYPE lines come from the table");
  const used = Array.from(new Set(src.match(/"infera_router_[a-z_]+"/g) ?? [])).map((s) => s.slice(1, -1));
  const njs = METRICS.filter((m) => m.njs).map((m) => m.name);
  assert.deepEqual(used.sort(), njs.sort());
});

test("the metric list in docs/configuration.md is generated from the table and up to date", () => {
  const doc = fs.readFileSync(path.join(ROOT, FLAG_DOC), "utf8");
  assert.equal(doc, renderMetricTable(doc), "run npm run docs:flags");
  for (const m of METRICS) assert.ok(doc.includes("| `" + m.name + "` | " + m.type + " |"), m.name);
});
