// The ext_proc port's gRPC transport (extproc/grpc.ts) against the official
// gRPC client (grpc-js): unknown methods, health Check and Watch with
// readiness transitions, compressed or split messages, statuses in trailers,
// and a graceful shutdown that lets an open stream finish.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { ExtProcService, startExtProc } from "../../extproc/server";
import { EXT_PROC_SERVICE } from "../../extproc/health";
import {
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  HttpHeadersSchema,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderMapSchema, HeaderValueSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const def = ExtProcService.Process;
const cleanup: (() => void)[] = [];
after(() => cleanup.forEach((f) => f()));

async function serve(args: string[] = []) {
  const app = new App(
    parseArgs(["--workers", "127.0.0.1:7001", "--health-interval-ms", "0", ...args], {}),
    () => undefined,
    noEvents,
  );
  app.setWorkers(app.opts.workers);
  const s = await startExtProc(app, "127.0.0.1", 0);
  cleanup.push(() => s.server.forceShutdown());
  const c = new grpc.Client(`127.0.0.1:${s.port}`, grpc.credentials.createInsecure());
  cleanup.push(() => c.close());
  return { app, server: s.server, port: s.port, c };
}

const enc = (s: string) => Buffer.concat([Buffer.from([0x0a, Buffer.byteLength(s)]), Buffer.from(s)]);
const statusOf = (b: Buffer) => (b.length >= 2 && b[0] === 0x08 ? b[1] : -1);
const hdrs = (pairs: Record<string, string>) =>
  create(HeaderMapSchema, {
    headers: Object.entries(pairs).map(([key, v]) => create(HeaderValueSchema, { key, rawValue: Buffer.from(v) })),
  });
const chatHeaders = (): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: {
      case: "requestHeaders",
      value: create(HttpHeadersSchema, { headers: hdrs({ ":path": "/v1/chat/completions", ":method": "POST" }) }),
    },
  });

function check(c: grpc.Client, service: string): Promise<number | string> {
  return new Promise((resolve) =>
    c.makeUnaryRequest("/grpc.health.v1.Health/Check", enc, statusOf, service, (err, v) =>
      resolve(err ? "error:" + grpc.status[err.code] : (v as number)),
    ),
  );
}

test("an unknown method is UNIMPLEMENTED; health Check answers per service and NOT_FOUND for others", async () => {
  const { c } = await serve();
  const unknown = await new Promise<string>((resolve) =>
    c.makeUnaryRequest(
      "/no.Such/Method",
      (x: Buffer) => x,
      (b: Buffer) => b,
      Buffer.alloc(0),
      (err) => resolve(err ? grpc.status[err.code] : "ok"),
    ),
  );
  assert.equal(unknown, "UNIMPLEMENTED");
  assert.equal(await check(c, "liveness"), 1);
  assert.equal(await check(c, "readiness"), 2, "not ready before discovery has synced");
  assert.equal(await check(c, "nope"), "error:NOT_FOUND");
});

test("health Check answers readiness as it is at the call, not as the last periodic refresh saw it", async () => {
  const { app, c } = await serve();
  assert.equal(await check(c, EXT_PROC_SERVICE), 2);
  // Envoy probes once at start and, until traffic flows, again only after its
  // no-traffic interval: a stale NOT_SERVING here would keep the router out for it.
  app.setSynced(true);
  assert.equal(await check(c, EXT_PROC_SERVICE), 1, "SERVING at once");
});

test("health Watch streams readiness as it changes; an unknown service is SERVICE_UNKNOWN", async () => {
  const { app, c } = await serve();
  const seen: number[] = [];
  const w = c.makeServerStreamRequest("/grpc.health.v1.Health/Watch", enc, statusOf, EXT_PROC_SERVICE);
  w.on("data", (s: number) => seen.push(s));
  w.on("error", () => undefined);
  for (let i = 0; i < 100 && seen.length < 1; i++) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(seen, [2], "NOT_SERVING first");
  // Discovery synced: the next refresh turns readiness on.
  app.setSynced(true);
  for (let i = 0; i < 200 && seen.length < 2; i++) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(seen, [2, 1], "then SERVING, once");
  w.cancel();
  const u: number[] = [];
  const w2 = c.makeServerStreamRequest("/grpc.health.v1.Health/Watch", enc, statusOf, "nope");
  w2.on("data", (s: number) => u.push(s));
  w2.on("error", () => undefined);
  for (let i = 0; i < 100 && !u.length; i++) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(u, [3]);
  w2.cancel();
});

test("a message split over several writes is decoded once whole; a compressed one ends the call UNIMPLEMENTED", async () => {
  const { port } = await serve();
  const http2 = await import("http2");
  const s = http2.connect(`http://127.0.0.1:${port}`);
  cleanup.push(() => s.destroy());
  const call = (frames: Buffer[]) =>
    new Promise<{ status: string; bytes: number }>((resolve) => {
      const st = s.request({
        ":method": "POST",
        ":path": def.path,
        "content-type": "application/grpc",
        te: "trailers",
      });
      let bytes = 0;
      st.on("data", (d: Buffer) => (bytes += d.length));
      st.on("trailers", (t) => resolve({ status: String(t["grpc-status"]), bytes }));
      st.on("error", () => resolve({ status: "error", bytes }));
      (async () => {
        for (const f of frames) {
          st.write(f);
          await new Promise((r) => setTimeout(r, 20));
        }
        st.end();
      })();
    });
  const msg = Buffer.from(
    def.requestSerialize(
      create(ProcessingRequestSchema, {
        request: {
          case: "requestHeaders",
          value: create(HttpHeadersSchema, {
            headers: hdrs({ ":path": "/v1/models", ":method": "GET" }),
            endOfStream: true,
          }),
        },
      }),
    ),
  );
  const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), msg]);
  framed.writeUInt32BE(msg.length, 1);
  // Prefix split mid-length, then the rest: one answer (a headers reply, bytes > 5), status OK.
  const ok = await call([framed.subarray(0, 3), framed.subarray(3, 9), framed.subarray(9)]);
  assert.equal(ok.status, "0");
  assert.ok(ok.bytes > 5, "the bodiless GET was answered");
  const compressed = Buffer.from(framed);
  compressed[0] = 1;
  const bad = await call([compressed]);
  assert.equal(bad.status, String(grpc.status.UNIMPLEMENTED));
  assert.equal(bad.bytes, 0, "nothing answered");
});

test("tryShutdown: new streams are refused while one already open runs to its end, then the callback", async () => {
  const { app, server, port, c } = await serve();
  const call = c.makeBidiStreamRequest(
    def.path,
    def.requestSerialize,
    def.responseDeserialize,
  ) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
  const answers: string[] = [];
  call.on("data", (m: ProcessingResponse) => answers.push(String(m.response.case)));
  const ended = new Promise<string>((resolve) => {
    call.on("status", (s: grpc.StatusObject) => resolve(grpc.status[s.code]));
    call.on("error", () => undefined);
  });
  call.write(chatHeaders());
  for (let i = 0; i < 100 && !answers.length; i++) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(answers, ["requestHeaders"]);
  let shut = false;
  server.tryShutdown(() => (shut = true));
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(shut, false, "the open stream holds the shutdown");
  // A fresh client cannot open a connection any more.
  const c2 = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  cleanup.push(() => c2.close());
  assert.match(String(await check(c2, "liveness")), /^error:/);
  call.end();
  assert.equal(await ended, "OK");
  for (let i = 0; i < 200 && !shut; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(shut, "the callback ran once the stream was gone");
  assert.equal(app.router.openGuards(), 0);
});
