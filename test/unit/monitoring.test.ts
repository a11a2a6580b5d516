// deploy/monitoring: every PromQL expression of the alert rules and the Grafana
// dashboard parses with Prometheus's own parser (promtool check rules; the
// dashboard's expressions go in as a generated recording-rule file), and every
// metric each one names exists in the /metrics exposition of a real router
// (simulated workers, a few requests through its ext_proc port). The Helm
// chart's copies are links to the same files.
import { findBin, goBinDir, needs } from "../tools";
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import { parse, stringify } from "yaml";
import { startRouter, startSim, stopAll, workerArg, longText } from "../harness";
import { processStream, reqBody, reqHeaders, respBody, respHeaders } from "../extproc-client";

after(stopAll);

const ROOT = path.resolve(__dirname, "../..");
const MON = path.join(ROOT, "deploy/monitoring");

// promtool: Prometheus's own parser, built by the set-up (`go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0`:
// Prometheus 3.16; its Go module tags are v0.3xx) into $(go env GOPATH)/bin.
const gobin = goBinDir();
const promtool = findBin("promtool", gobin ? [gobin] : []);
const noPromtool = needs(!promtool && "promtool not installed");

type Rule = {
  alert?: string;
  record?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
};
type Group = { name: string; rules: Rule[] };
const ruleDoc = parse(fs.readFileSync(path.join(MON, "prometheusrule.yaml"), "utf8")) as {
  kind: string;
  spec: { groups: Group[] };
};
const groups = ruleDoc.spec.groups;
const rules = groups.flatMap((g) => g.rules);

type Panel = {
  type: string;
  title: string;
  panels?: Panel[];
  targets?: { expr: string; refId: string }[];
  datasource?: { uid: string };
};
const dashboard = JSON.parse(fs.readFileSync(path.join(MON, "grafana-dashboard.json"), "utf8")) as {
  uid: string;
  title: string;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: string | { query: string } }[] };
};
const allPanels = (ps: Panel[]): Panel[] => ps.flatMap((p) => [p, ...allPanels(p.panels ?? [])]);

/** Grafana's own variables, as a query sent to Prometheus would have them. */
const GRAFANA_VARS: Record<string, string> = {
  __rate_interval: "5m",
  __interval: "1m",
  __range: "1h",
  namespace: ".*",
  pod: ".*",
};
const expand = (q: string) => q.replace(/\$\{?(\w+)\}?/g, (m, v: string) => GRAFANA_VARS[v] ?? m);

/** Every PromQL expression shipped, named by where it comes from. Template queries contribute their label_values selector. */
const exprs: { where: string; expr: string }[] = [
  ...rules.map((r) => ({ where: `alert ${r.alert ?? r.record}`, expr: r.expr })),
  ...allPanels(dashboard.panels).flatMap((p) =>
    (p.targets ?? []).map((t) => ({ where: `panel "${p.title}" ${t.refId}`, expr: expand(t.expr) })),
  ),
  ...dashboard.templating.list
    .filter((v) => v.type === "query")
    .map((v) => {
      const q = typeof v.query === "string" ? v.query : v.query.query;
      const m = /^label_values\((.*),\s*\w+\)$/.exec(q);
      assert.ok(m, `variable ${v.name}: label_values(<selector>, <label>) expected, got ${q}`);
      return { where: `variable ${v.name}`, expr: expand(m[1]) };
    }),
];

/**
 * The metric names a (valid) PromQL expression selects: identifiers that are
 * not function or aggregation calls, keywords, label names in groupings or
 * matchers, strings, numbers or durations.
 */
function metricNames(expr: string): string[] {
  let s = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""') // string literals
    .replace(/\{[^}]*\}/g, " ") // label matchers
    .replace(/\[[^\]]*\]/g, " ") // ranges and subqueries
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ") // grouping label lists
    .replace(/\b(group_left|group_right)\b/g, " ")
    .replace(/\boffset\s+-?[0-9a-z]+/gi, " ")
    .replace(/@\s*(start\(\)|end\(\)|[0-9.]+)/g, " ");
  s = s.replace(/(^|[^a-zA-Z0-9_:])(0x[0-9a-f]+|[0-9]*\.?[0-9]+(e[+-]?[0-9]+)?)/gi, "$1 "); // numbers
  const KEYWORDS = new Set(["and", "or", "unless", "bool", "inf", "nan"]);
  const out = new Set<string>();
  for (const m of s.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const rest = s.slice(m.index! + m[0].length);
    if (/^\s*\(/.test(rest)) continue; // a call
    if (KEYWORDS.has(m[0].toLowerCase())) continue;
    out.add(m[0]);
  }
  return [...out].sort();
}

test("the name extractor finds selected metrics and nothing else", () => {
  const cases: [string, string[]][] = [
    ['up{job="infera-gate"} == 0', ["up"]],
    ['histogram_quantile(0.99, sum by (namespace, le) (rate(a_bucket{x=~"a|b"}[5m]))) > 2.5e-3', ["a_bucket"]],
    ["sum(rate(a_total[5m] offset 1h)) by (worker) / on (worker) group_left(role) b", ["a_total", "b"]],
    ["(sum by (pod) (x) == 0) or (max by (pod) (y) == 0) unless z and bool_metric", ["bool_metric", "x", "y", "z"]],
    ['label_replace(m, "dst", "$1", "src", "(.*)") + absent(n) * 0x1f', ["m", "n"]],
    ["max_over_time(rate(c[1m])[10m:1m])", ["c"]],
    ['{__name__="by_name"}', []],
  ];
  for (const [e, want] of cases) assert.deepEqual(metricNames(e), want, e);
});

test("the alert rules and the dashboard are complete and well-formed", () => {
  assert.equal(ruleDoc.kind, "PrometheusRule");
  const names = rules.map((r) => r.alert);
  assert.equal(new Set(names).size, names.length, "alert names are unique");
  for (const r of rules) {
    assert.ok(r.alert, "only alerts here");
    assert.match(r.for ?? "", /^\d+[smh]$/, `${r.alert}: a for: duration`);
    assert.ok(["critical", "warning", "info"].includes(r.labels?.severity ?? ""), `${r.alert}: severity label`);
    for (const k of ["summary", "description", "runbook"]) assert.ok(r.annotations?.[k], `${r.alert}: annotation ${k}`);
  }
  // What the brief asks the alerts to cover: router down, no/few workers, 5xx and no-worker rates, KV events, admission, pick latency.
  for (const m of [
    "up",
    "infera_router_worker_up",
    "infera_router_requests_total",
    "infera_router_kv_events_silent",
    "infera_router_kv_event_errors_total",
    "infera_router_prefill_admission_wait_seconds_bucket",
    "infera_router_pick_latency_seconds_bucket",
  ])
    assert.ok(
      rules.some((r) => metricNames(r.expr).includes(m)),
      `an alert on ${m}`,
    );
  assert.equal(dashboard.uid, "infera-gate-router");
  const panels = allPanels(dashboard.panels).filter((p) => p.type !== "row");
  for (const p of panels) {
    assert.ok(p.targets?.length, `panel "${p.title}" has queries`);
    assert.equal(p.datasource?.uid, "${datasource}", `panel "${p.title}" uses the data-source variable`);
  }
  const used = new Set(panels.flatMap((p) => p.targets!.flatMap((t) => metricNames(expand(t.expr)))));
  for (const m of [
    "infera_router_requests_total",
    "infera_router_pick_latency_seconds_bucket",
    "infera_router_cache_hit_blocks_total",
    "infera_router_request_blocks_total",
    "infera_router_active_blocks",
    "infera_router_worker_up",
    "infera_router_prefill_admission_wait_seconds_bucket",
    "infera_router_kv_event_errors_total",
    "infera_router_ttft_prediction_error_ratio_sum",
    "infera_router_worker_slowness",
  ])
    assert.ok(used.has(m), `a panel on ${m}`);
  // The Helm chart ships the same files (links), not copies that drift.
  for (const f of ["prometheusrule.yaml", "grafana-dashboard.json"])
    assert.equal(
      fs.readFileSync(path.join(ROOT, "deploy/helm/infera-gate/files", f), "utf8"),
      fs.readFileSync(path.join(MON, f), "utf8"),
      `helm files/${f}`,
    );
});

test("every PromQL expression parses (promtool check rules)", { skip: noPromtool }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-promql-"));
  try {
    const check = (name: string, doc: unknown) => {
      const f = path.join(dir, name);
      fs.writeFileSync(f, stringify(doc));
      return spawnSync(promtool!, ["check", "rules", f], { encoding: "utf8" });
    };
    // The alerts as Prometheus loads them from the PrometheusRule (annotation templates are checked too).
    const a = check("alerts.yaml", { groups });
    assert.equal(a.status, 0, a.stdout + a.stderr);
    assert.match(a.stdout, new RegExp(`SUCCESS: ${rules.length} rules found`));
    // The dashboard's queries, each as a recording rule.
    const queries = exprs.filter((e) => !e.where.startsWith("alert"));
    const d = check("dashboard.yaml", {
      groups: [
        { name: "dashboard", rules: queries.map((e, i) => ({ record: `infera_dashboard:q${i}`, expr: e.expr })) },
      ],
    });
    assert.equal(
      d.status,
      0,
      d.stdout + d.stderr + queries.map((e, i) => `\ninfera_dashboard:q${i} = ${e.where}`).join(""),
    );
    // The check can fail: a broken expression is refused with the parser's message.
    const bad = check("bad.yaml", {
      groups: [{ name: "bad", rules: [{ record: "x:y", expr: "sum(rate(infera_router_requests_total[5m])" }] }],
    });
    assert.notEqual(bad.status, 0);
    assert.match(bad.stdout + bad.stderr, /unclosed left parenthesis|parse error/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("every metric an expression names exists in a real router's /metrics", async () => {
  const sims = await Promise.all(["m0", "m1"].map((id) => startSim(id, ["--time-scale", "20"])));
  const router = await startRouter(["--workers", workerArg(sims), "--health-interval-ms", "500", "--block-size", "16"]);
  const client = new grpc.Client(`127.0.0.1:${router.grpcPort}`, grpc.credentials.createInsecure());
  try {
    // A few routed requests (and one refused) so the labelled series exist.
    for (let i = 0; i < 4; i++) {
      const s = processStream(client);
      s.send(reqHeaders("/v1/chat/completions"));
      await s.next();
      s.send(
        reqBody(
          JSON.stringify({
            model: "m",
            stream: true,
            messages: [{ role: "user", content: longText(`q${i % 2}`, 300) }],
          }),
        ),
      );
      const r = await s.next();
      assert.equal(r.response.case, "requestBody");
      s.send(respHeaders());
      await s.next();
      s.send(respBody(true));
      await s.next();
      s.call.end();
    }
    const text = await router.metrics();
    // Names as the exposition declares them; histograms and summaries expose their series under suffixes.
    const declared = new Set<string>();
    for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
      const [, name, type] = m;
      declared.add(name);
      if (type === "histogram") for (const x of ["_bucket", "_sum", "_count"]) declared.add(name + x);
      if (type === "summary") for (const x of ["_sum", "_count"]) declared.add(name + x);
    }
    const sampled = new Set([...text.matchAll(/^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/gm)].map((m) => m[1]));
    // Series Prometheus itself adds to every scrape.
    const SYNTHETIC = new Set(["up", "scrape_duration_seconds", "scrape_samples_scraped"]);
    const missing: string[] = [];
    for (const e of exprs) {
      const names = metricNames(e.expr);
      assert.ok(names.length > 0, `${e.where} selects a metric`);
      for (const n of names) if (!SYNTHETIC.has(n) && !declared.has(n)) missing.push(`${e.where}: ${n}`);
    }
    assert.deepEqual(missing, [], "metrics the router does not export");
    assert.ok(
      sampled.has("infera_router_worker_up") &&
        sampled.has("infera_router_picks_total") &&
        sampled.has("infera_router_requests_total"),
      "labelled series exist after traffic",
    );
  } finally {
    client.close();
    await stopAll();
  }
});
