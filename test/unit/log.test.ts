// Structured logs: JSON lines by default, text on request, levels (flag or
// INFERA_LOG_LEVEL), request ids carried across awaits, state changes once.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { backoff, makeLogger, stateLogger, withRequestId } from "../../runtime/log";
import { parseArgs } from "../../runtime/config";

function capture(level: "debug" | "info" | "warn" | "error", format: "json" | "text") {
  const lines: string[] = [];
  return { lines, log: makeLogger(level, format, { component: "t" }, (l) => lines.push(l)) };
}

test("JSON lines by default with level, msg, fields and the request id of the request being handled", async () => {
  const { lines, log } = capture("info", "json");
  log("debug", "hidden");
  log("info", "plain", { worker: "w0" });
  await withRequestId("rid-1", async () => {
    await new Promise((r) => setTimeout(r, 5));
    log("warn", "inside", { n: 1 });
    await Promise.resolve().then(() => log("error", "deeper"));
  });
  log("info", "after");
  const recs = lines.map((l) => JSON.parse(l));
  assert.deepEqual(
    recs.map((r) => r.msg),
    ["plain", "inside", "deeper", "after"],
  );
  assert.equal(recs[0].worker, "w0");
  assert.equal(recs[0].component, "t");
  assert.equal(recs[0].request_id, undefined);
  assert.equal(recs[1].request_id, "rid-1");
  assert.equal(recs[2].request_id, "rid-1");
  assert.equal(recs[3].request_id, undefined);
  assert.ok(!Number.isNaN(Date.parse(recs[0].time)));
});

test("--log-format text is for humans; the level comes from the flag or INFERA_LOG_LEVEL", () => {
  const { lines, log } = capture("debug", "text");
  withRequestId("r9", () => log("debug", "pick", { worker: "w1" }));
  assert.match(lines[0], /^\S+Z debug \[r9\] pick worker=w1\n$/);
  assert.equal(parseArgs(["--workers", "127.0.0.1:1"], {}).logFormat, "json");
  assert.equal(parseArgs(["--workers", "127.0.0.1:1"], { INFERA_LOG_LEVEL: "debug" }).logLevel, "debug");
  assert.equal(
    parseArgs(["--workers", "127.0.0.1:1", "--log-level", "error"], { INFERA_LOG_LEVEL: "debug" }).logLevel,
    "error",
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1"], { INFERA_LOG_LEVEL: "loud" }),
    /INFERA_LOG_LEVEL: 'loud' is not one of debug, info, warn, error/,
  );
});

test("a failing loop logs once when it starts failing and once when it recovers; backoff grows to its cap", () => {
  const { lines, log } = capture("info", "json");
  const s = stateLogger(log, "etcd: discovery");
  for (let i = 0; i < 100; i++) s.fail("connection refused");
  assert.equal(lines.length, 1);
  assert.match(JSON.parse(lines[0]).msg, /etcd: discovery: connection refused; retrying with backoff/);
  s.ok();
  s.ok();
  assert.equal(lines.length, 2);
  assert.match(JSON.parse(lines[1]).msg, /recovered after .* and 100 failed attempt/);
  const d = Array.from({ length: 30 }, (_, i) => backoff(i, 5000));
  assert.ok(d[0] <= 50 && d[3] >= 200 && d[3] <= 400, `early delays ${d.slice(0, 4)}`);
  assert.ok(
    d.slice(10).every((x) => x >= 2500 && x <= 5000),
    "capped, with jitter",
  );
});

test("text fields are logfmt: one-token values bare, others quoted so they cannot split or forge a field", () => {
  const { lines, log } = capture("info", "text");
  log("warn", "kv-events: cannot subscribe", {
    worker: "w0",
    error: "Invalid argument x=1",
    n: 3,
    ok: false,
    empty: "",
    nested: { a: 1 },
  });
  assert.match(
    lines[0],
    /^\S+Z warn kv-events: cannot subscribe worker=w0 error="Invalid argument x=1" n=3 ok=false empty="" nested="\{\\"a\\":1\}"\n$/,
  );
});
