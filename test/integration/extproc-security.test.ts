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
import {
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  HttpHeadersSchema,
  HttpBodySchema,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderMapSchema, HeaderValueSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";
import { makePki } from "../pki";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const def = ExtProcService.Process;
const cleanup: (() => void)[] = [];
after(() => cleanup.forEach((f) => f()));

async function serve(args: string[]) {
  const app = new App(
    parseArgs(["--workers", "127.0.0.1:7001", "--health-interval-ms", "0", ...args], {}),
    () => undefined,
    noEvents,
  );
  app.setWorkers(app.opts.workers);
  const s = await startExtProc(app, "127.0.0.1", 0);
  cleanup.push(() => s.server.forceShutdown());
  return { app, port: s.port };
}

const hdrs = (pairs: Record<string, string>) =>
  create(HeaderMapSchema, {
    headers: Object.entries(pairs).map(([key, v]) => create(HeaderValueSchema, { key, rawValue: Buffer.from(v) })),
  });
const getModels = (): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: {
      case: "requestHeaders",
      value: create(HttpHeadersSchema, {
        headers: hdrs({ ":path": "/v1/models", ":method": "GET" }),
        endOfStream: true,
      }),
    },
  });

/** One bodiless request; resolves with the first answer's case or the call's error code. */
function roundTrip(c: grpc.Client, first: ProcessingRequest = getModels()): Promise<string> {
  return new Promise((resolve) => {
    const call = c.makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, new grpc.Metadata(), {
      deadline: Date.now() + 5000,
    }) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
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
  const mutual = new grpc.Client(
    `127.0.0.1:${m.port}`,
    grpc.credentials.createSsl(ca, fs.readFileSync(k.clientKey), fs.readFileSync(k.clientCert)),
  );
  assert.equal(await roundTrip(mutual), "requestHeaders");
  for (const c of [ok, plain, anon, mutual]) c.close();
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1", "--ext-proc-tls-cert", k.cert], {}), /go together/);
});

test("a stream that goes quiet after its pick is ended and its load released", async () => {
  const { app, port } = await serve(["--ext-proc-stream-idle-s", "0.3"]);
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const call = c.makeBidiStreamRequest(
    def.path,
    def.requestSerialize,
    def.responseDeserialize,
  ) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
  const errored = new Promise<void>((resolve) => call.on("error", () => resolve()));
  call.on("data", () => undefined);
  call.write(
    create(ProcessingRequestSchema, {
      request: {
        case: "requestHeaders",
        value: create(HttpHeadersSchema, { headers: hdrs({ ":path": "/v1/chat/completions", ":method": "POST" }) }),
      },
    }),
  );
  call.write(
    create(ProcessingRequestSchema, {
      request: {
        case: "requestBody",
        value: create(HttpBodySchema, {
          body: Buffer.from(
            JSON.stringify({ model: "m", messages: [{ role: "user", content: "hold me ".repeat(30) }] }),
          ),
          endOfStream: true,
        }),
      },
    }),
  );
  for (let i = 0; i < 50 && app.router.openGuards() === 0; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(app.router.openGuards() > 0, "the pick holds load while the stream is open");
  await errored;
  assert.equal(app.router.openGuards(), 0);
  c.close();
});

test("gRPC messages larger than twice the body limit (plus headers) are refused by the transport", async () => {
  const { port } = await serve(["--max-body-bytes", "65536"]);
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const big = create(ProcessingRequestSchema, {
    request: {
      case: "requestBody",
      value: create(HttpBodySchema, { body: Buffer.alloc(2 * 65536 + 1024 * 1024 + 1, 120), endOfStream: true }),
    },
  });
  assert.equal(await roundTrip(c, big), "error:RESOURCE_EXHAUSTED");
  c.close();
});

test("admin: a bearer token guards /metrics and /v1/admin/* (probes stay open); HTTPS with --admin-tls-*; tokens from files", async () => {
  const { startAdmin } = await import("../../runtime/admin");
  const k = makePki();
  const tokenFile = path.join(k.dir, "admin-token");
  fs.writeFileSync(tokenFile, "s3cret-token\n");
  const app = new App(
    parseArgs(
      [
        "--workers",
        "127.0.0.1:7001",
        "--health-interval-ms",
        "0",
        "--admin-token-file",
        tokenFile,
        "--admin-tls-cert",
        k.cert,
        "--admin-tls-key",
        k.key,
      ],
      {},
    ),
    () => undefined,
    noEvents,
  );
  app.setWorkers(app.opts.workers);
  assert.equal(app.opts.adminToken, "s3cret-token", "the file's trailing newline is not part of the token");
  const a = await startAdmin(app, "127.0.0.1", 0);
  cleanup.push(() => a.server.close());
  const https = await import("https");
  const ca = fs.readFileSync(k.ca);
  const get = (p: string, auth?: string) =>
    new Promise<number>((resolve, reject) => {
      const req = https.get(
        { host: "127.0.0.1", port: a.port, path: p, ca, headers: auth ? { authorization: auth } : {} },
        (res) => {
          res.resume();
          resolve(res.statusCode!);
        },
      );
      req.on("error", reject);
    });
  assert.equal(await get("/metrics"), 401);
  assert.equal(await get("/v1/admin/workers", "Bearer wrong"), 401);
  assert.equal(await get("/metrics", "Bearer s3cret-token"), 200);
  assert.equal(await get("/v1/admin/workers", "Bearer s3cret-token"), 200);
  assert.equal(await get("/livez"), 200);
  await assert.rejects(fetch(`http://127.0.0.1:${a.port}/livez`), "plain HTTP is not served");
});

test("--ext-proc-client-identities: a SAN URI, SAN DNS or CN on the list opens ext_proc streams; another certificate gets PERMISSION_DENIED; health stays answerable", async () => {
  const { issue } = await import("../pki");
  const k = makePki();
  const spiffe = "spiffe://cluster.local/ns/infera/sa/gateway";
  const uri = issue(k, "uri-gw", [`URI:${spiffe}`]);
  const cnOnly = issue(k, "cn-gateway", []);
  const dns = issue(k, "dns-gw", ["DNS:gw.infera.svc"]);
  const stranger = issue(k, "stranger", ["DNS:stranger.infera.svc", "URI:spiffe://cluster.local/ns/infera/sa/other"]);
  const { port } = await serve([
    "--ext-proc-tls-cert",
    k.cert,
    "--ext-proc-tls-key",
    k.key,
    "--ext-proc-tls-client-ca",
    k.ca,
    "--ext-proc-client-identities",
    `${spiffe}, cn-gateway,gw.infera.svc`,
  ]);
  const ca = fs.readFileSync(k.ca);
  const as = (c: { cert: string; key: string }) =>
    new grpc.Client(
      `127.0.0.1:${port}`,
      grpc.credentials.createSsl(ca, fs.readFileSync(c.key), fs.readFileSync(c.cert)),
      { "grpc.use_local_subchannel_pool": 1 },
    );
  const cs = [uri, cnOnly, dns, stranger].map(as);
  assert.deepEqual(await Promise.all(cs.map((c) => roundTrip(c))), [
    "requestHeaders",
    "requestHeaders",
    "requestHeaders",
    "error:PERMISSION_DENIED",
  ]);
  // The health service answers any client the TLS layer admits (the gateway's checks, probes).
  const health = await new Promise<number>((resolve) => {
    cs[3].makeUnaryRequest(
      "/grpc.health.v1.Health/Check",
      (x: Buffer) => x,
      (b: Buffer) => b.length,
      Buffer.from([0x0a, 0x08, ...Buffer.from("liveness")]),
      (e, v) => resolve(e ? -e.code : (v as number)),
    );
  });
  assert.ok(health > 0, `health answered: ${health}`);
  for (const c of cs) c.close();
  assert.throws(
    () =>
      parseArgs(
        [
          "--workers",
          "127.0.0.1:1",
          "--ext-proc-tls-cert",
          k.cert,
          "--ext-proc-tls-key",
          k.key,
          "--ext-proc-client-identities",
          "gw",
        ],
        {},
      ),
    /needs mTLS/,
  );
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1", "--ext-proc-client-identities", "gw"], {}), /needs mTLS/);
});

test("request bodies held past the connection's buffered-bytes cap get a 503 immediate response; the bytes come back when streams end", async () => {
  const { ProtocolConfigurationSchema } =
    await import("../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb");
  const { ProcessingMode_BodySendMode: Mode } =
    await import("../../extproc/gen/envoy/extensions/filters/http/ext_proc/v3/processing_mode_pb");
  // The smallest allowed cap for a 64 KiB body limit: one gRPC message of twice the body limit, plus 1 MiB.
  const cap = 2 * 65536 + 1024 * 1024 + 5;
  const { app, port } = await serve([
    "--max-body-bytes",
    "65536",
    "--ext-proc-max-buffered-bytes-per-connection",
    String(cap),
  ]);
  const buffered = async () =>
    ((await app.metrics.registry.getSingleMetric("infera_router_ext_proc_buffered_bytes")!.get()).values[0]?.value ??
      -1) as number;
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  // Body pieces as Envoy streams them (small messages, each whole in one frame): the handler holds them until the body ends.
  const piece = create(ProcessingRequestSchema, {
    request: {
      case: "requestBody",
      value: create(HttpBodySchema, { body: Buffer.alloc(15000, 120), endOfStream: false }),
    },
  });
  const open = (n: number) =>
    Array.from({ length: n }, () => {
      const call = c.makeBidiStreamRequest(
        def.path,
        def.requestSerialize,
        def.responseDeserialize,
      ) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
      const got: ProcessingResponse[] = [];
      const x = { call, got, code: -1 };
      call.on("data", (m: ProcessingResponse) => got.push(m));
      call.on("error", (e: grpc.ServiceError) => (x.code = e.code));
      call.write(
        create(ProcessingRequestSchema, {
          request: {
            case: "requestHeaders",
            value: create(HttpHeadersSchema, { headers: hdrs({ ":path": "/v1/chat/completions", ":method": "POST" }) }),
          },
          protocolConfig: create(ProtocolConfigurationSchema, {
            requestBodyMode: Mode.FULL_DUPLEX_STREAMED,
            responseBodyMode: Mode.FULL_DUPLEX_STREAMED,
          }),
        }),
      );
      for (let i = 0; i < 4; i++) call.write(piece);
      return x;
    });
  const fit = Math.floor(cap / 60000);
  const calls = open(30);
  // Refused: by the handler (a 503 for the client), or by the transport when a piece was still arriving (RESOURCE_EXHAUSTED).
  const isRefused = (x: { got: ProcessingResponse[]; code: number }) =>
    x.got.length > 0 || x.code === grpc.status.RESOURCE_EXHAUSTED;
  for (let i = 0; i < 300 && calls.filter(isRefused).length < 30 - fit - 1; i++)
    await new Promise((r) => setTimeout(r, 10));
  await new Promise((r) => setTimeout(r, 200));
  const refused = calls.filter(isRefused);
  assert.ok(
    refused.length >= 30 - fit - 1 && refused.length <= 30 - fit,
    `${refused.length} refused of 30; ${fit} bodies fit`,
  );
  const answered = refused.filter((x) => x.got.length);
  assert.ok(answered.length > 0, "the handler's refusal is exercised");
  for (const r of answered) {
    assert.equal(r.got[0].response.case, "immediateResponse");
    assert.equal((r.got[0].response.value as { status: { code: number } }).status.code, 503);
  }
  assert.ok((await buffered()) <= cap);
  for (const x of calls) x.call.cancel();
  for (let i = 0; i < 100 && (await buffered()) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(await buffered(), 0, "every held byte given back");
  // As many bodies fit again.
  const again = open(fit - 1);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(again.filter(isRefused).length, 0);
  for (const x of again) x.call.cancel();
  c.close();
});
