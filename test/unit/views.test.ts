// What the admin endpoints say about workers (core/views.ts), shared by the router's and nginx's.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { createRouter, defaultConfig } from "../../core/router";
import { memoryState } from "../../core/state/memory";
import { unknownWorker } from "../../core/views";

test("a cache-view for an unknown worker names the known ones", () => {
  const r = createRouter(memoryState(), defaultConfig());
  assert.equal(unknownWorker(r, "w9"), "unknown worker 'w9' (known: none)");
  for (let i = 0; i < 23; i++) r.addWorker({ id: `w${i}`, address: `127.0.0.1:${9000 + i}`, role: "mixed" });
  const m = unknownWorker(r, "nope");
  assert.match(m, /^unknown worker 'nope' \(known: w0, w1, .*w19, \.\.\. 3 more\)$/);
  assert.equal(r.cacheView("nope"), null);
});
