// The Endpoint Picker Protocol at the gRPC level (a client plays the gateway):
// message order in FULL_DUPLEX_STREAMED with and without trailers, the body
// echoed back unchanged, header == metadata with the fallback list, the subset
// hint (list, string, empty), the served-endpoint reconcile, and STREAMED refused.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { App } from "../../runtime/app";
import { ExtProcFixture, hdrs, processStream, startExtProcFixture } from "../extproc-client";
import {
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  HttpHeadersSchema,
  HttpBodySchema,
  HttpTrailersSchema,
  ProtocolConfigurationSchema,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { MetadataSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";
import { ProcessingMode_BodySendMode as Mode } from "../../extproc/gen/envoy/extensions/filters/http/ext_proc/v3/processing_mode_pb";
import type { JsonObject } from "@bufbuild/protobuf";

const A = "127.0.0.1:7101";
const B = "127.0.0.1:7102";
let f: ExtProcFixture;
let app: App;

before(async () => {
  f = await startExtProcFixture(
    ["--workers", `${A},${B}`, "--health-interval-ms", "0", "--epp-fallback-endpoints", "1"],
    { synced: true },
  );
  app = f.app;
});
after(() => f.close());

const meta = (ns: Record<string, JsonObject>) => create(MetadataSchema, { filterMetadata: ns });
function reqHeaders(mode: Mode, opts: { subset?: unknown; extra?: Record<string, string> } = {}): ProcessingRequest {
  return create(ProcessingRequestSchema, {
    request: {
      case: "requestHeaders",
      value: create(HttpHeadersSchema, {
        headers: hdrs({ ":path": "/v1/chat/completions", ":method": "POST", ...(opts.extra ?? {}) }),
      }),
    },
    protocolConfig: create(ProtocolConfigurationSchema, {
      requestBodyMode: mode,
      responseBodyMode: mode === Mode.FULL_DUPLEX_STREAMED ? mode : Mode.STREAMED,
    }),
    metadataContext:
      opts.subset === undefined
        ? undefined
        : meta({ "envoy.lb.subset_hint": { "x-gateway-destination-endpoint-subset": opts.subset as never } }),
  });
}
const reqBody = (b: Buffer, eos: boolean) =>
  create(ProcessingRequestSchema, {
    request: { case: "requestBody", value: create(HttpBodySchema, { body: b, endOfStream: eos }) },
  });
const reqTrailers = () =>
  create(ProcessingRequestSchema, {
    request: { case: "requestTrailers", value: create(HttpTrailersSchema, { trailers: hdrs({ "x-t": "1" }) }) },
  });
const respHeaders = (served?: string) =>
  create(ProcessingRequestSchema, {
    request: { case: "responseHeaders", value: create(HttpHeadersSchema, { headers: hdrs({ ":status": "200" }) }) },
    metadataContext: served ? meta({ "envoy.lb": { "x-gateway-destination-endpoint-served": served } }) : undefined,
  });
const respBody = (b: string, eos: boolean) =>
  create(ProcessingRequestSchema, {
    request: { case: "responseBody", value: create(HttpBodySchema, { body: Buffer.from(b), endOfStream: eos }) },
  });

const stream = () => processStream(f.client);
type Common = {
  headerMutation?: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[] };
  bodyMutation?: { mutation: { case: string; value: { body: Uint8Array; endOfStream: boolean } } };
};
const common = (m: ProcessingResponse) => (m.response.value as { response: Common }).response;
const setOf = (m: ProcessingResponse) =>
  Object.fromEntries(
    (common(m).headerMutation?.setHeaders ?? []).map((h) => [h.header.key, Buffer.from(h.header.rawValue).toString()]),
  );
const dest = (m: ProcessingResponse) =>
  (m.dynamicMetadata as { "envoy.lb": { "x-gateway-destination-endpoint": string } })["envoy.lb"][
    "x-gateway-destination-endpoint"
  ];
const streamed = (m: ProcessingResponse) => common(m).bodyMutation!.mutation.value;
const body = (text: string) =>
  Buffer.from(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] }));
const held = () => app.router.workers().reduce((n, w) => n + app.router.activeBlocks(w.id), 0);
const until = async (f: () => boolean) => {
  for (let i = 0; i < 100 && !f(); i++) await new Promise((r) => setTimeout(r, 10));
  return f();
};

test("FULL_DUPLEX_STREAMED: nothing answered until end of body; then headers (pick) and the body back unchanged", async () => {
  const s = stream();
  s.send(reqHeaders(Mode.FULL_DUPLEX_STREAMED));
  const b = body("duplex ".repeat(30000)); // > 64 KiB: comes back in several pieces
  const parts = [b.subarray(0, 1000), b.subarray(1000, 90000), b.subarray(90000)];
  s.send(reqBody(parts[0], false));
  s.send(reqBody(parts[1], false));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(s.got.length, 0, "the headers answer waits for the body");
  s.send(reqBody(parts[2], true));
  const pieces = Math.ceil(b.length / 65536);
  await s.wait(1 + pieces);
  assert.equal(s.got[0].response.case, "requestHeaders");
  const set = setOf(s.got[0]);
  assert.equal(set["x-gateway-destination-endpoint"], dest(s.got[0]), "header and metadata carry the same value");
  const list = dest(s.got[0]).split(",");
  assert.equal(list.length, 2, "pick + 1 fallback");
  assert.deepEqual([...list].sort(), [A, B].sort());
  const back = s.got.slice(1).map((m) => {
    assert.equal(m.response.case, "requestBody");
    return streamed(m);
  });
  assert.deepEqual(
    back.map((x) => x.endOfStream),
    back.map((_, i) => i === back.length - 1),
  );
  assert.ok(Buffer.concat(back.map((x) => Buffer.from(x.body))).equals(b), "body echoed unchanged");
  // Response side in full duplex: every chunk is echoed too.
  s.send(respHeaders());
  s.send(respBody("data: a\n\n", false));
  s.send(respBody("data: [DONE]\n\n", true));
  await s.wait(1 + pieces + 3);
  assert.deepEqual(
    s.got.slice(-2).map((m) => Buffer.from(streamed(m).body).toString()),
    ["data: a\n\n", "data: [DONE]\n\n"],
  );
  assert.ok(await until(() => held() === 0), "released at response end");
  s.call.end();
});

test("FULL_DUPLEX_STREAMED with request trailers: headers, body (not end), trailers", async () => {
  const s = stream();
  s.send(reqHeaders(Mode.FULL_DUPLEX_STREAMED));
  const b = body("trailers follow");
  s.send(reqBody(b, false));
  s.send(reqTrailers());
  await s.wait(3);
  assert.deepEqual(
    s.got.map((m) => m.response.case),
    ["requestHeaders", "requestBody", "requestTrailers"],
  );
  assert.equal(streamed(s.got[1]).endOfStream, false);
  assert.ok(Buffer.from(streamed(s.got[1]).body).equals(b));
  s.call.cancel();
  assert.ok(await until(() => held() === 0));
});

test("subset hint: a list binds the pick, a string list too, an empty list is a 503, a foreign one is a 503", async () => {
  for (const [subset, want] of [
    [[B], B],
    [A, A],
    [[], 503],
    [["10.0.0.1:80"], 503],
  ] as const) {
    const s = stream();
    s.send(reqHeaders(Mode.BUFFERED, { subset }));
    s.send(reqBody(body("subset " + JSON.stringify(subset)), true));
    await s.wait(2);
    const r = s.got[1];
    if (want === 503) {
      assert.equal(r.response.case, "immediateResponse");
      assert.equal((r.response.value as { status: { code: number } }).status.code, 503);
    } else {
      assert.equal(dest(r).split(",")[0], want);
      assert.equal(dest(r), want, "no fallback outside the subset");
    }
    s.call.cancel();
  }
  assert.ok(await until(() => held() === 0));
});

test("served endpoint differs from the pick: the load moves there and is released once", async () => {
  const s = stream();
  s.send(reqHeaders(Mode.BUFFERED, { subset: [A] }));
  s.send(reqBody(body("served elsewhere ".repeat(50)), true));
  await s.wait(2);
  const before = app.router.activeBlocks(A);
  assert.ok(before > 0 && app.router.activeBlocks(B) === 0);
  s.send(respHeaders(B));
  await s.wait(3);
  assert.equal(app.router.activeBlocks(A), 0);
  assert.equal(app.router.activeBlocks(B), before);
  s.send(respBody("data: x\n\n", true));
  await s.wait(4);
  assert.ok(
    await until(() => held() === 0 && app.router.openGuards() === 0),
    `held ${held()} guards ${app.router.openGuards()}`,
  );
  s.call.cancel();
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(app.router.openGuards(), 0, "cancel after completion releases nothing more");
});

test("STREAMED request bodies are refused with the modes to use", async () => {
  const s = stream();
  s.send(reqHeaders(Mode.STREAMED));
  await s.wait(1);
  s.send(reqBody(body("partial"), false));
  await s.wait(2);
  const r = s.got[1];
  assert.equal(r.response.case, "immediateResponse");
  assert.match(
    Buffer.from((r.response.value as { body: Uint8Array }).body).toString(),
    /BUFFERED or FULL_DUPLEX_STREAMED/,
  );
  s.call.cancel();
});

test("the llm-d sidecar header is set for PD picks and stripped from clients otherwise", async () => {
  const s = stream();
  s.send(reqHeaders(Mode.FULL_DUPLEX_STREAMED, { extra: { "x-prefiller-host-port": "10.9.9.9:80" } }));
  s.send(reqBody(body("no pd here"), true));
  await s.wait(2);
  const rm = (common(s.got[0]).headerMutation as unknown as { removeHeaders: string[] }).removeHeaders;
  assert.ok(rm.includes("x-prefiller-host-port"), rm.join(","));
  assert.equal(setOf(s.got[0])["x-prefiller-host-port"], undefined);
  s.call.cancel();
  assert.ok(await until(() => held() === 0));
});

test("FULL_DUPLEX_STREAMED: a body streamed past --max-body-bytes is refused at the limit, not accumulated", async () => {
  const s = stream();
  s.send(reqHeaders(Mode.FULL_DUPLEX_STREAMED));
  const mb = Buffer.alloc(1024 * 1024, 0x20);
  // Envoy does not buffer duplex bodies, so nothing but the router bounds them.
  for (let i = 0; i < 9; i++) s.send(reqBody(mb, false));
  await s.wait(1);
  const r = s.got[0];
  assert.equal(r.response.case, "immediateResponse");
  const v = r.response.value as { status: { code: number }; body: Uint8Array };
  assert.equal(v.status.code, 413);
  assert.match(Buffer.from(v.body).toString(), /over the 8388608-byte limit/);
  s.send(reqBody(mb, true)); // after the answer: ignored, no second reply
  await s.wait(1);
  assert.equal(held(), 0);
  s.call.end();
});
