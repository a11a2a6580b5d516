// What a real router process tells its operator: structured log lines
// (--log-format json and text) with what varies in fields, and the latency of
// each scheduling plugin on /metrics, counted once per run.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { freePort, longText, startRouter, startSim, stopAll, waitFor, workerArg } from "../harness";
import { processStream, reqBody, reqHeaders, respBody, respHeaders } from "../extproc-client";

after(stopAll);

/** One chat request through the ext_proc port, answered by the gateway's side in full. */
async function routeOne(client: grpc.Client, text: string): Promise<void> {
  const s = processStream(client);
  s.send(reqHeaders("/v1/chat/completions"));
  await s.next();
  s.send(reqBody(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] })));
  const r = await s.next();
  assert.equal(r.response.case, "requestBody");
  s.send(respHeaders());
  await s.next();
  s.send(respBody(true));
  await s.next();
  s.call.end();
}

/** Series of one metric: labels as written, to value. */
function series(text: string, name: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const m = new RegExp(`^${name}(\\{[^}]*\\})? (\\S+)$`).exec(line);
    if (m) out[m[1] ?? ""] = Number(m[2]);
  }
  return out;
}

test("--log-format json: every line is one JSON object with time, level, msg, and the fields core logs with", async () => {
  // A worker nobody serves: the health checks take it out, which core logs with the worker as a field.
  const ghost = `127.0.0.1:${await freePort()}`;
  const router = await startRouter([
    "--workers",
    ghost,
    "--health-interval-ms",
    "100",
    "--log-format",
    "json",
    "--router-tokenizer-path",
    "none",
  ]);
  await waitFor("health verdict logged", async () => /failed health checks/.test(router.proc.log()), 15000);
  const lines = router.proc
    .log()
    .split("\n")
    .filter((l) => l.trim());
  const recs = lines.map((l) => {
    try {
      return JSON.parse(l) as Record<string, unknown>;
    } catch {
      assert.fail(`not a JSON line: ${l}`);
    }
  });
  for (const r of recs) {
    assert.ok(!Number.isNaN(Date.parse(String(r.time))), JSON.stringify(r));
    assert.ok(["debug", "info", "warn", "error"].includes(String(r.level)), JSON.stringify(r));
    assert.equal(typeof r.msg, "string");
  }
  const down = recs.find((r) => /failed health checks: out of every pool/.test(String(r.msg)));
  assert.ok(down, lines.join("\n"));
  assert.equal(down.worker, ghost, "the worker is a field");
  assert.equal(down.level, "warn");
  assert.ok(
    recs.some((r) => r.msg === "listening" && typeof r.ext_proc === "string" && typeof r.block_size === "number"),
    lines.join("\n"),
  );
});

test("--log-format text: time level msg k=v, values quoted when they hold spaces", async () => {
  const ghost = `127.0.0.1:${await freePort()}`;
  const router = await startRouter([
    "--workers",
    ghost,
    "--health-interval-ms",
    "100",
    "--log-format",
    "text",
    "--router-tokenizer-path",
    "none",
  ]);
  await waitFor("health verdict logged", async () => /failed health checks/.test(router.proc.log()), 15000);
  const lines = router.proc
    .log()
    .split("\n")
    .filter((l) => l.trim());
  for (const l of lines) assert.match(l, /^\S+Z (debug|info|warn|error) \S/, l);
  const esc = ghost.replace(/\./g, "\\.");
  const line = new RegExp(`^\\S+Z warn .*failed health checks: out of every pool.* worker=${esc}$`);
  assert.ok(
    lines.some((l) => line.test(l)),
    lines.join("\n"),
  );
});

test("infera_router_plugin_duration_seconds times every plugin of every pick, one observation per run", async () => {
  const sims = [await startSim("po0"), await startSim("po1")];
  const router = await startRouter(["--workers", workerArg(sims), "--health-interval-ms", "0"]);
  const client = new grpc.Client(`127.0.0.1:${router.grpcPort}`, grpc.credentials.createInsecure());
  const N = 5;
  try {
    for (let i = 0; i < N; i++) await routeOne(client, longText(`p${i % 2}`, 200));
    const text = await router.metrics();
    const picks = Object.values(series(text, "infera_router_picks_total")).reduce((a, b) => a + b, 0);
    assert.equal(picks, N);
    const counts = series(text, "infera_router_plugin_duration_seconds_count");
    const count = (plugin: string, kind: string) => counts[`{plugin="${plugin}",kind="${kind}"}`];
    // kv-aware, no PD: one prefill profile run per pick, each filter, the data stage, each weighted scorer and the picker once.
    assert.equal(count("kv-aware", "picker"), picks, JSON.stringify(counts));
    for (const f of ["usable", "role-pool", "model"]) assert.equal(count(f, "filter"), picks, f);
    assert.equal(count("candidate-data", "data"), picks);
    assert.equal(count("prefix-overlap", "scorer"), picks);
    assert.equal(count("active-blocks", "scorer"), picks);
    // load-reservation runs at the pick, the first token and completion.
    assert.equal(count("load-reservation", "lifecycle"), 3 * picks);
    const sums = series(text, "infera_router_plugin_duration_seconds_sum");
    const pickerSum = sums[`{plugin="kv-aware",kind="picker"}`];
    assert.ok(pickerSum > 0 && pickerSum < 1, `picker time ${pickerSum}s`);
    assert.match(text, /# TYPE infera_router_plugin_duration_seconds histogram/);
  } finally {
    client.close();
  }
});
