// One metric table (core/metric-table.ts): the Node router's registry, the njs
// module's exposition and docs/configuration.md's metric list all come from it.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { METRICS } from "../../core/metric-table";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { ReplicaSync } from "../../runtime/replicas";
import { startExtProc } from "../../extproc/server";
import { FLAG_DOC, renderMetricTable } from "../../scripts/flags-doc";

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
    assert.deepEqual(ours.sort(), METRICS.map((m) => m.name).sort(), "registered infera_* metrics = the table");
    const text = await reg.metrics();
    for (const m of METRICS) {
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
  } finally {
    ext.server.forceShutdown();
    await app.close();
  }
});

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
