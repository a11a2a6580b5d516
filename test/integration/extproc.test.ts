// The ext_proc gRPC protocol without Envoy: a gRPC client plays Envoy's part
// (same service path and messages), so ordering and cancellation races can be
// driven exactly.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { App } from "../../runtime/app";
import {
  ProcessingRequestSchema,
  ProcessingResponse,
  HttpBodySchema,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
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
let app: App;
let client: grpc.Client;

before(async () => {
  f = await startExtProcFixture(["--workers", "127.0.0.1:7001,127.0.0.1:7002", "--health-interval-ms", "0"]);
  ({ app, client } = f);
});
after(() => f.close());

const stream = (c: grpc.Client = client) => processStream(c);

const body = (text: string) =>
  JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] });
const active = () => app.router.workers().reduce((n, w) => n + app.router.activeBlocks(w.id), 0);
const until = async (f: () => boolean) => {
  for (let i = 0; i < 100 && !f(); i++) await new Promise((r) => setTimeout(r, 10));
  return f();
};

test("headers -> CONTINUE, body -> upstream header mutation; EOF releases; a later cancel releases nothing more", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/chat/completions"));
  assert.equal((await s.next()).response.case, "requestHeaders");
  s.send(reqBody(body("hello world ".repeat(40))));
  const r = await s.next();
  assert.equal(r.response.case, "requestBody");
  const mut = (
    r.response.value as {
      response: {
        headerMutation: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[]; removeHeaders: string[] };
      };
    }
  ).response.headerMutation;
  const set = Object.fromEntries(mut.setHeaders.map((h) => [h.header.key, Buffer.from(h.header.rawValue).toString()]));
  assert.match(set["x-infera-upstream"], /^127\.0\.0\.1:700[12]$/);
  assert.equal(set["x-infera-worker"], set["x-infera-upstream"]);
  assert.deepEqual(
    mut.removeHeaders,
    ["x-infera-prefill", "x-infera-prefill-dp-rank", "x-prefiller-host-port", "x-prefiller-url"],
    "client-sent prefill headers (ours, its DP rank, llm-d's sidecar's) are stripped",
  );
  assert.ok(active() > 0);
  s.send(respHeaders());
  assert.equal((await s.next()).response.case, "responseHeaders");
  s.send(respBody(false));
  await s.next();
  s.send(respBody(true));
  await s.next();
  assert.ok(await until(() => active() === 0));
  s.call.cancel();
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(app.router.openGuards(), 0);
});

test("a non-streamed request carries no stream mark: the gateway gives it the whole-answer route", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/chat/completions", "POST", false, {}));
  await s.next();
  s.send(
    reqBody(
      JSON.stringify({ model: "m", stream: false, messages: [{ role: "user", content: "whole answer please" }] }),
    ),
  );
  const r = await s.next();
  const lb = (r.dynamicMetadata as { "envoy.lb": Record<string, unknown> })["envoy.lb"];
  assert.match(String(lb["x-gateway-destination-endpoint"]), /^127\.0\.0\.1:700[12]$/);
  assert.equal("x-infera-stream" in lb, false);
  s.call.end();
});

test("client-sent routing headers are removed at the headers phase; the pick also travels as envoy.lb metadata", async () => {
  const s = stream();
  s.send(
    reqHeaders("/v1/chat/completions", "POST", false, {
      "x-infera-upstream": "127.0.0.1:1",
      "x-gateway-destination-endpoint": "127.0.0.1:1",
      "X-Infera-Anything": "x",
      "x-session-id": "keep",
    }),
  );
  const h = await s.next();
  assert.equal(h.response.case, "requestHeaders");
  const hm = (
    h.response.value as { response: { headerMutation: { removeHeaders: string[] }; clearRouteCache: boolean } }
  ).response;
  for (const k of ["x-infera-upstream", "x-gateway-destination-endpoint", "x-infera-anything"])
    assert.ok(hm.headerMutation.removeHeaders.includes(k), k);
  assert.ok(!hm.headerMutation.removeHeaders.includes("x-session-id"));
  assert.equal(hm.clearRouteCache, true);
  s.send(reqBody(body("metadata please ".repeat(20))));
  const r = await s.next();
  const set = Object.fromEntries(
    (
      r.response.value as {
        response: { headerMutation: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[] } };
      }
    ).response.headerMutation.setHeaders.map((x) => [x.header.key, Buffer.from(x.header.rawValue).toString()]),
  );
  // A streamed request (body() asks for one) is marked for the gateway's streamed route.
  assert.deepEqual(r.dynamicMetadata, {
    "envoy.lb": { "x-gateway-destination-endpoint": set["x-infera-upstream"], "x-infera-stream": true },
  });
  assert.match(set["x-infera-upstream"], /^127\.0\.0\.1:700[12]$/);
  s.call.cancel();
  assert.ok(await until(() => app.router.openGuards() === 0));
});

test("request trailers end the body: a headers-then-trailers request is decided at the trailers", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/models", "GET", false, { "x-infera-upstream": "127.0.0.1:1" }));
  await s.next();
  s.send(create(ProcessingRequestSchema, { request: { case: "requestTrailers", value: {} as never } }));
  const r = await s.next();
  assert.equal(r.response.case, "requestTrailers");
  assert.match(
    String(
      (r.dynamicMetadata as { "envoy.lb": { "x-gateway-destination-endpoint": string } })["envoy.lb"][
        "x-gateway-destination-endpoint"
      ],
    ),
    /^127\.0\.0\.1:700[12]$/,
  );
  s.call.cancel();
  assert.ok(await until(() => app.router.openGuards() === 0));
});

test("a stream cancelled after the pick (client gone, upstream reset) releases the pick", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/chat/completions"));
  await s.next();
  s.send(reqBody(body("cancel me ".repeat(40))));
  await s.next();
  assert.ok(active() > 0);
  s.call.cancel();
  assert.ok(await until(() => active() === 0 && app.router.openGuards() === 0));
});

test("bad JSON -> ImmediateResponse 400 with an OpenAI-style JSON error", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/chat/completions"));
  await s.next();
  s.send(reqBody("{broken"));
  const r = await s.next();
  assert.equal(r.response.case, "immediateResponse");
  const v = r.response.value as {
    status: { code: number };
    body: Uint8Array;
    headers: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[] };
  };
  assert.equal(v.status.code, 400);
  assert.deepEqual(JSON.parse(Buffer.from(v.body).toString()), {
    error: { message: "request body is not valid JSON", type: "invalid_request_error", code: 400 },
  });
  assert.equal(Buffer.from(v.headers.setHeaders[0].header.rawValue).toString(), "application/json");
  s.call.end();
  assert.equal(app.router.openGuards(), 0);
});

test("a partial request body (STREAMED mode) is refused with the config to fix", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/chat/completions"));
  await s.next();
  s.send(
    create(ProcessingRequestSchema, {
      request: { case: "requestBody", value: create(HttpBodySchema, { body: Buffer.from("{"), endOfStream: false }) },
    }),
  );
  const r = await s.next();
  assert.equal(r.response.case, "immediateResponse");
  const v = r.response.value as { status: { code: number }; body: Uint8Array };
  assert.equal(v.status.code, 500);
  assert.match(Buffer.from(v.body).toString(), /request_body_mode must be BUFFERED/);
  s.call.end();
  assert.equal(app.router.openGuards(), 0);
});

test("a bodiless GET is routed at the headers phase", async () => {
  const s = stream();
  s.send(reqHeaders("/v1/models", "GET", true));
  const r = await s.next();
  assert.equal(r.response.case, "requestHeaders");
  const set = (
    r.response.value as { response: { headerMutation: { setHeaders: { header: { key: string } }[] } } }
  ).response.headerMutation.setHeaders.map((h) => h.header.key);
  assert.ok(set.includes("x-infera-upstream"));
  s.send(respHeaders());
  await s.next();
  s.call.end();
  assert.ok(await until(() => app.router.openGuards() === 0));
});

test("race: 40 concurrent streams ending by EOF, cancel, half-close or both, in random order -> zero held", async () => {
  let seed = 7;
  const rnd = () => ((seed = (Math.imul(seed, 48271) + 11) >>> 0) % 1000) / 1000;
  await Promise.all(
    Array.from({ length: 40 }, async (_, i) => {
      const s = stream();
      s.send(reqHeaders("/v1/chat/completions"));
      await s.next();
      s.send(reqBody(body(`race ${i} `.repeat(30 + i))));
      await s.next();
      const x = rnd();
      if (x < 0.3) {
        s.send(respHeaders());
        await s.next();
        s.send(respBody(true));
        await s.next();
        s.call.cancel();
      } else if (x < 0.6) s.call.cancel();
      else if (x < 0.8) s.call.end();
      else {
        s.send(respHeaders());
        s.send(respBody(false));
        s.call.cancel();
      }
    }),
  );
  assert.ok(
    await until(() => active() === 0 && app.router.openGuards() === 0),
    `held ${active()} blocks, ${app.router.openGuards()} guards`,
  );
});

test("session affinity over ext_proc: the x-session-id header pins the worker while load says otherwise", async () => {
  const f2 = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7001,127.0.0.1:7002",
    "--session-affinity",
    "prefill",
    "--health-interval-ms",
    "0",
  ]);
  const c2 = f2.client;
  const upstreamOf = (r: ProcessingResponse) =>
    Object.fromEntries(
      (
        r.response.value as {
          response: { headerMutation: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[] } };
        }
      ).response.headerMutation.setHeaders.map((h) => [h.header.key, Buffer.from(h.header.rawValue).toString()]),
    )["x-infera-upstream"];
  const open = async (text: string, session?: string) => {
    const s = stream(c2);
    s.send(reqHeaders("/v1/chat/completions", "POST", false, session ? { "x-session-id": session } : {}));
    await s.next();
    s.send(reqBody(body(text)));
    return { s, upstream: upstreamOf(await s.next()) };
  };
  try {
    const first = await open("session one ".repeat(40), "S1");
    const second = await open("something else entirely ".repeat(40), "S1");
    assert.equal(second.upstream, first.upstream, "bound although the other worker is idle");
    const free = await open("no session here ".repeat(40));
    assert.notEqual(free.upstream, first.upstream, "without a session, load decides");
    for (const x of [first, second, free]) x.s.call.cancel();
  } finally {
    await f2.close();
  }
});

test("a data-parallel target: the pick sets X-data-parallel-rank for the engine; a client-sent one is stripped", async () => {
  const f2 = await startExtProcFixture(["--workers", "127.0.0.1:7003/dp=2", "--health-interval-ms", "0"]);
  const c2 = f2.client;
  try {
    const ranks: string[] = [];
    const open: ReturnType<typeof stream>[] = [];
    for (let i = 0; i < 2; i++) {
      const s = stream(c2);
      open.push(s);
      s.send(reqHeaders("/v1/chat/completions", "POST", false, { "x-data-parallel-rank": "7" }));
      const h = await s.next();
      const hm = (h.response.value as { response?: { headerMutation?: { removeHeaders: string[] } } }).response
        ?.headerMutation;
      assert.ok(
        hm?.removeHeaders.includes("x-data-parallel-rank"),
        "the client's rank header never reaches the engine",
      );
      s.send(reqBody(body(`rank test ${i} `.repeat(40))));
      const r = await s.next();
      const mut = (
        r.response.value as {
          response: { headerMutation: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[] } };
        }
      ).response.headerMutation;
      const set = Object.fromEntries(
        mut.setHeaders.map((x) => [x.header.key, Buffer.from(x.header.rawValue).toString()]),
      );
      assert.equal(set["x-infera-upstream"], "127.0.0.1:7003");
      assert.equal(set["x-infera-worker"], `127.0.0.1:7003/dp${set["x-data-parallel-rank"]}`);
      ranks.push(set["x-data-parallel-rank"]);
    }
    for (const s of open) s.call.cancel();
    assert.deepEqual(ranks.sort(), ["0", "1"], "two in-flight requests spread over both ranks");
  } finally {
    await f2.close();
  }
});

test("the server ends its side of the call after the last answer (response EOS, immediate response), status OK", async () => {
  const ended = (s: ReturnType<typeof stream>) =>
    new Promise<number>((resolve) => {
      s.call.on("status", (st: grpc.StatusObject) => resolve(st.code));
    });
  // A full exchange ending with the response body's end of stream.
  const a = stream();
  const aEnd = ended(a);
  a.send(reqHeaders("/v1/chat/completions"));
  await a.next();
  a.send(reqBody(body("end cleanly ".repeat(10))));
  await a.next();
  a.send(respHeaders());
  await a.next();
  a.send(respBody(true));
  await a.next();
  assert.equal(await aEnd, grpc.status.OK, "Envoy never has to reset the stream");
  assert.ok(await until(() => app.router.openGuards() === 0));
  // An immediate response is also the last word.
  const b = stream();
  const bEnd = ended(b);
  b.send(reqHeaders("/v1/chat/completions"));
  await b.next();
  b.send(reqBody("{broken"));
  assert.equal((await b.next()).response.case, "immediateResponse");
  assert.equal(await bEnd, grpc.status.OK);
});
