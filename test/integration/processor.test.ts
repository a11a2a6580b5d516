// The per-phase ext_proc processor (extproc/processor.ts) seen through its
// phase hooks: a gRPC client plays Envoy against the real server and App, and
// a hook records what each phase saw of the stream's state.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { addPhaseHooks, StreamState } from "../../extproc/server";
import { Decision } from "../../runtime/director";
import {
  ExtProcFixture,
  processStream,
  reqBody,
  reqHeaders,
  respBody,
  respHeaders,
  startExtProcFixture,
} from "../extproc-client";

let f: ExtProcFixture;
const seen: { phase: string; path: string; detail: string }[] = [];
const note = (phase: string, s: StreamState, detail = "") => seen.push({ phase, path: s.headers[":path"], detail });

before(async () => {
  f = await startExtProcFixture(["--workers", "127.0.0.1:7401,127.0.0.1:7402", "--health-interval-ms", "0"]);
  addPhaseHooks({
    requestHeaders: (s) => note("requestHeaders", s, s.headers["x-infera-worker"] ?? "stripped"),
    decided: (s: StreamState, d: Decision) =>
      note("decided", s, d.kind === "route" ? `route ${s.routed?.pick.target.id}` : `refuse ${d.status}`),
    firstByte: (s) => note("firstByte", s, String(s.routed?.reservation.open)),
    finished: (s) => note("finished", s),
  });
});
after(() => f.close());

const until = async (ok: () => boolean) => {
  for (let i = 0; i < 200 && !ok(); i++) await new Promise((r) => setTimeout(r, 10));
  return ok();
};

test("phase hooks: headers (client routing headers already gone), decision, first byte, finished once", async () => {
  seen.length = 0;
  const s = processStream(f.client);
  s.send(reqHeaders("/v1/chat/completions", "POST", false, { "x-infera-worker": "forged" }));
  s.send(reqBody(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hello ".repeat(200) }] })));
  await s.wait(2);
  assert.equal(s.got[1].response.case, "requestBody");
  s.send(respHeaders());
  s.send(respBody(false));
  s.send(respBody(false));
  s.send(respBody(true));
  assert.ok(await until(() => seen.some((x) => x.phase === "finished")), JSON.stringify(seen));
  await new Promise((r) => setTimeout(r, 50));
  const phases = seen.map((x) => x.phase);
  assert.deepEqual(phases, ["requestHeaders", "decided", "firstByte", "finished"], JSON.stringify(seen));
  assert.equal(seen[0].detail, "stripped", "hooks see the headers after the client's routing headers are removed");
  assert.match(seen[1].detail, /^route 127\.0\.0\.1:740[12]$/);
  assert.equal(seen[2].detail, "true", "the first byte hook runs with the reservation still open");
  assert.equal(f.app.router.openGuards(), 0, "the end released the pick");
  s.call.end();
});

test("phase hooks: a refused path is never decided by the director, and still finishes once", async () => {
  seen.length = 0;
  const s = processStream(f.client);
  s.send(reqHeaders("/v1/nope", "GET", true));
  await s.wait(1);
  assert.equal(s.got[0].response.case, "immediateResponse");
  assert.ok(await until(() => seen.some((x) => x.phase === "finished")), JSON.stringify(seen));
  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(
    seen.map((x) => x.phase),
    ["requestHeaders", "finished"],
  );
});
