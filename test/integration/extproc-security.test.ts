// The ext_proc server's own doors: TLS and mTLS, a stream that goes quiet,
// and a gRPC message limit tied to the body limit. A gRPC client plays Envoy.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { ExtProcService, startExtProc } from "../../extproc/server";
import { ProcessingRequest, ProcessingRequestSchema, ProcessingResponse, HttpHeadersSchema, HttpBodySchema } from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderMapSchema, HeaderValueSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";
import { makePki } from "../pki";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const def = ExtProcService.Process;
const cleanup: (() => void)[] = [];
after(() => cleanup.forEach((f) => f()));


async function serve(args: string[]) {
  const app = new App(parseArgs(["--workers", "127.0.0.1:7001", "--health-interval-ms", "0", ...args], {}), () => undefined, noEvents);
  app.setWorkers(app.opts.workers);
  const s = await startExtProc(app, "127.0.0.1", 0);
  cleanup.push(() => s.server.forceShutdown());
  return { app, port: s.port };
}

const hdrs = (pairs: Record<string, string>) => create(HeaderMapSchema, { headers: Object.entries(pairs).map(([key, v]) => create(HeaderValueSchema, { key, rawValue: Buffer.from(v) })) });
const getModels = (): ProcessingRequest => create(ProcessingRequestSchema, { request: { case: "requestHeaders", value: create(HttpHeadersSchema, { headers: hdrs({ ":path": "/v1/models", ":method": "GET" }), endOfStream: true }) } });

/** One bodiless request; resolves with the first answer's case or the call's error code. */
function roundTrip(c: grpc.Client, first: ProcessingRequest = getModels()): Promise<string> {
  return new Promise((resolve) => {
    const call = c.makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, new grpc.Metadata(), { deadline: Date.now() + 5000 }) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
    call.on("data", (m: ProcessingResponse) => {
      resolve(String(m.response.case));
      call.cancel();
    });
    call.on("error", (e: grpc.ServiceError) => resolve("error:" + grpc.status[e.code]));
    call.write(first);
  });
}

test("TLS: a TLS client is served, a plaintext one is not; mTLS wants a client certificate from the CA", async () => {
  const k = makePki();
  const tls = await serve(["--ext-proc-tls-cert", k.cert, "--ext-proc-tls-key", k.key]);
  const ca = fs.readFileSync(k.ca);
  const ok = new grpc.Client(`127.0.0.1:${tls.port}`, grpc.credentials.createSsl(ca));
  assert.equal(await roundTrip(ok), "requestHeaders");
  const plain = new grpc.Client(`127.0.0.1:${tls.port}`, grpc.credentials.createInsecure());
  assert.match(await roundTrip(plain), /^error:/);
  const m = await serve(["--ext-proc-tls-cert", k.cert, "--ext-proc-tls-key", k.key, "--ext-proc-tls-client-ca", k.ca]);
  const anon = new grpc.Client(`127.0.0.1:${m.port}`, grpc.credentials.createSsl(ca));
  assert.match(await roundTrip(anon), /^error:/);
  const mutual = new grpc.Client(`127.0.0.1:${m.port}`, grpc.credentials.createSsl(ca, fs.readFileSync(k.clientKey), fs.readFileSync(k.clientCert)));
  assert.equal(await roundTrip(mutual), "requestHeaders");
  for (const c of [ok, plain, anon, mutual]) c.close();
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1", "--ext-proc-tls-cert", k.cert], {}), /go together/);
});

test("a stream that goes quiet after its pick is ended and its load released", async () => {
  const { app, port } = await serve(["--ext-proc-stream-idle-s", "0.3"]);
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const call = c.makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
  const errored = new Promise<void>((resolve) => call.on("error", () => resolve()));
  call.on("data", () => undefined);
  call.write(create(ProcessingRequestSchema, { request: { case: "requestHeaders", value: create(HttpHeadersSchema, { headers: hdrs({ ":path": "/v1/chat/completions", ":method": "POST" }) }) } }));
  call.write(create(ProcessingRequestSchema, { request: { case: "requestBody", value: create(HttpBodySchema, { body: Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hold me ".repeat(30) }] })), endOfStream: true }) } }));
  for (let i = 0; i < 50 && app.router.openGuards() === 0; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(app.router.openGuards() > 0, "the pick holds load while the stream is open");
  await errored;
  assert.equal(app.router.openGuards(), 0);
  c.close();
});

test("gRPC messages larger than twice the body limit (plus headers) are refused by the transport", async () => {
  const { port } = await serve(["--max-body-bytes", "65536"]);
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const big = create(ProcessingRequestSchema, { request: { case: "requestBody", value: create(HttpBodySchema, { body: Buffer.alloc(2 * 65536 + 1024 * 1024 + 1, 120), endOfStream: true }) } });
  assert.equal(await roundTrip(c, big), "error:RESOURCE_EXHAUSTED");
  c.close();
});

test("admin: a bearer token guards /metrics and /v1/admin/* (probes stay open); HTTPS with --admin-tls-*; tokens from files", async () => {
  const { startAdmin } = await import("../../runtime/admin");
  const k = makePki();
  const tokenFile = path.join(k.dir, "admin-token");
  fs.writeFileSync(tokenFile, "s3cret-token\n");
  const app = new App(parseArgs(["--workers", "127.0.0.1:7001", "--health-interval-ms", "0", "--admin-token-file", tokenFile, "--admin-tls-cert", k.cert, "--admin-tls-key", k.key], {}), () => undefined, noEvents);
  app.setWorkers(app.opts.workers);
  assert.equal(app.opts.adminToken, "s3cret-token", "the file's trailing newline is not part of the token");
  const a = await startAdmin(app, "127.0.0.1", 0);
  cleanup.push(() => a.server.close());
  const https = await import("https");
  const ca = fs.readFileSync(k.ca);
  const get = (p: string, auth?: string) =>
    new Promise<number>((resolve, reject) => {
      const req = https.get({ host: "127.0.0.1", port: a.port, path: p, ca, headers: auth ? { authorization: auth } : {} }, (res) => {
        res.resume();
        resolve(res.statusCode!);
      });
      req.on("error", reject);
    });
  assert.equal(await get("/metrics"), 401);
  assert.equal(await get("/v1/admin/workers", "Bearer wrong"), 401);
  assert.equal(await get("/metrics", "Bearer s3cret-token"), 200);
  assert.equal(await get("/v1/admin/workers", "Bearer s3cret-token"), 200);
  assert.equal(await get("/livez"), 200);
  await assert.rejects(fetch(`http://127.0.0.1:${a.port}/livez`), "plain HTTP is not served");
});
