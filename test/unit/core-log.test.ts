// core/log.ts: the logfmt rendering njs writes (and tests read) for core's structured log lines.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { logfmt } from "../../core/log";
import { createRouter, defaultConfig } from "../../core/router";
import { memoryState } from "../../core/state/memory";

test("logfmt: msg then k=v in field order; values with spaces, quotes or = are quoted", () => {
  assert.equal(logfmt("pick"), "pick");
  assert.equal(
    logfmt("pick", { policy: "kv-aware", role: "prefill", picked: "a", mm_images: 1, bound: true }),
    "pick policy=kv-aware role=prefill picked=a mm_images=1 bound=true",
  );
  assert.equal(
    logfmt("m", { why: "two words", q: 'say "hi"', eq: "a=b", empty: "" }),
    'm why="two words" q="say \\"hi\\"" eq="a=b" empty=""',
  );
});

test("the router logs each pick at debug as msg=pick with its fields", () => {
  const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
  const r = createRouter(memoryState(), defaultConfig(), {
    log: (level, msg, fields) => lines.push({ level, msg, fields }),
  });
  r.addWorker({ id: "a", address: "127.0.0.1:1", role: "mixed" });
  r.pick({ blocks: [], inputTokens: 3, exact: true, mediaHashes: [], n: 1 }).reservation.finish();
  const pick = lines.filter((l) => l.msg === "pick");
  assert.deepEqual(pick, [
    {
      level: "debug",
      msg: "pick",
      fields: { policy: "kv-aware", role: "prefill", picked: "a", mm_images: 0, mm_affinity_hits: 0 },
    },
  ]);
});
