// The ext_proc port as a closed control plane (issue #26, item 3). The router
// runs as a process with the shipped EPP setup's flags (mTLS, the gateway's
// client-certificate name as the only allowed identity); plain gRPC clients
// that are not the gateway try what the adversarial pass did: hold load on
// workers, occupy prefill-admission slots, move load with `…-served`
// metadata, and grow the router's memory with large bodies.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as http2 from "http2";
import * as grpc from "@grpc/grpc-js";
import { create, type JsonObject } from "@bufbuild/protobuf";
import { startRouter, stopAll, sleep, waitFor, RouterProc } from "../harness";
import { makePki, issue, gatewayCert, routerMtlsArgs, Pki } from "../pki";
import { processStream, reqHeaders, hdrs } from "../extproc-client";
import { ExtProcService } from "../../extproc/server";
import {
  HttpBodySchema,
  HttpHeadersSchema,
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { MetadataSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";

after(stopAll);

const A = "127.0.0.1:7301";
const B = "127.0.0.1:7302";
const k: Pki = makePki();
const gw = gatewayCert(k);
// Same CA, another name: a workload that has a certificate but is not the gateway.
const other = issue(k, "batch-job", ["DNS:batch-job.infera.svc"]);
const ca = fs.readFileSync(k.ca);
const clients: grpc.Client[] = [];
after(() => clients.forEach((c) => c.close()));

function client(port: number, who: { cert: string; key: string } | "anonymous" | "plaintext"): grpc.Client {
  const creds =
    who === "plaintext"
      ? grpc.credentials.createInsecure()
      : who === "anonymous"
        ? grpc.credentials.createSsl(ca)
        : grpc.credentials.createSsl(ca, fs.readFileSync(who.key), fs.readFileSync(who.cert));
  // A channel per client: grpc-js would otherwise share one subchannel between equal targets.
  const c = new grpc.Client(`127.0.0.1:${port}`, creds, { "grpc.use_local_subchannel_pool": 1 });
  clients.push(c);
  return c;
}

// A cold prompt (well over --prefill-admission-warm-tokens) unique to its seed.
const coldBody = (seed: string) =>
  Buffer.from(
    JSON.stringify({
      model: "m",
      stream: true,
      max_tokens: 400,
      messages: [
        { role: "user", content: Array.from({ length: 1500 }, (_, i) => `${seed}${i}w${(i * 7919) % 1009}`).join(" ") },
      ],
    }),
  );
const body = (b: Buffer): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: { case: "requestBody", value: create(HttpBodySchema, { body: b, endOfStream: true }) },
  });
const servedHeaders = (served: string): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: { case: "responseHeaders", value: create(HttpHeadersSchema, { headers: hdrs({ ":status": "200" }) }) },
    metadataContext: create(MetadataSchema, {
      filterMetadata: { "envoy.lb": { "x-gateway-destination-endpoint-served": served } as JsonObject },
    }),
  });

/** Opens a Process call, sends a cold request (and optionally served metadata); resolves with the first answer's case or the call's status name. */
function attempt(
  c: grpc.Client,
  seed: string,
  served?: string,
): { result: Promise<string>; call: grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse> } {
  const s = processStream(c);
  const result = new Promise<string>((resolve) => {
    s.call.on("error", (e: grpc.ServiceError) => resolve(grpc.status[e.code]));
    s.call.on("data", (m: ProcessingResponse) => {
      if (m.response.case !== "requestHeaders") resolve(String(m.response.case));
    });
    setTimeout(() => resolve("no answer"), 20000).unref();
  });
  s.send(reqHeaders("/v1/chat/completions"));
  s.send(body(coldBody(seed)));
  if (served) s.send(servedHeaders(served));
  return { result, call: s.call };
}

const load = async (r: RouterProc) => Object.fromEntries((await r.workers()).map((w) => [w.id, w.active_blocks]));
const rssMb = (pid: number) =>
  Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024;

test("mTLS with the gateway identity: no certificate, or a certificate that is not the gateway, cannot hold load, take admission slots or move load", async () => {
  const router = await startRouter([
    "--workers",
    `${A},${B}`,
    "--health-interval-ms",
    "0",
    "--prefill-admission-slots",
    "1",
    "--prefill-admission-max-wait-ms",
    "3000",
    ...routerMtlsArgs(k),
  ]);

  // Without a client certificate (or without TLS) there is no connection at all.
  for (const who of ["plaintext", "anonymous"] as const) {
    const c = client(router.grpcPort, who);
    const rs = await Promise.all(Array.from({ length: 10 }, (_, i) => attempt(c, `${who}-${i}-`).result));
    assert.ok(
      rs.every((r) => r === "UNAVAILABLE"),
      `${who}: ${rs.join(",")}`,
    );
  }
  assert.deepEqual(await load(router), { [A]: 0, [B]: 0 });

  // A certificate from the same CA with another name: every stream is refused,
  // whatever it sends (40 cold requests, some with served metadata naming B).
  const intruder = client(router.grpcPort, other);
  const tries = Array.from({ length: 40 }, (_, i) => attempt(intruder, `intruder-${i}-`, i % 2 ? B : undefined));
  const rs = await Promise.all(tries.map((t) => t.result));
  assert.ok(
    rs.every((r) => r === "PERMISSION_DENIED"),
    rs.join(","),
  );
  assert.deepEqual(await load(router), { [A]: 0, [B]: 0 }, "no load held by the intruder");
  assert.match(await router.metrics(), /infera/, "router still answers");

  // While an intruder keeps trying, a cold gateway request gets its pick at
  // once: no admission slot is held by anyone else.
  const gwc = client(router.grpcPort, gw);
  const storm = Array.from({ length: 20 }, (_, i) => attempt(intruder, `storm-${i}-`));
  const t0 = Date.now();
  const g = processStream(gwc);
  g.send(reqHeaders("/v1/chat/completions"));
  g.send(body(coldBody("gateway-cold-")));
  const picked = await g.next(); // the headers CONTINUE
  const pick = picked.response.case === "requestHeaders" ? await g.next() : picked;
  const waited = Date.now() - t0;
  assert.equal(pick.response.case, "requestBody");
  assert.ok(waited < 1500, `the gateway's cold request waited ${waited} ms for admission`);
  assert.ok((await Promise.all(storm.map((t) => t.result))).every((r) => r === "PERMISSION_DENIED"));
  const to = (pick.dynamicMetadata as { "envoy.lb": { "x-gateway-destination-endpoint": string } })["envoy.lb"][
    "x-gateway-destination-endpoint"
  ];
  const elsewhere = to === A ? B : A;
  const before = await load(router);
  assert.ok(before[to] > 0 && before[elsewhere] === 0, JSON.stringify(before));

  // The intruder's served metadata naming the other worker moves nothing...
  const fake = attempt(intruder, "fake-served-", elsewhere);
  assert.equal(await fake.result, "PERMISSION_DENIED");
  await sleep(200);
  assert.deepEqual(await load(router), before);
  // ...the gateway's own does (the identity is what makes the difference).
  g.send(servedHeaders(elsewhere));
  await g.next();
  const moved = await load(router);
  assert.ok(moved[to] === 0 && moved[elsewhere] > 0, JSON.stringify(moved));
  g.call.cancel();
  await router.proc.kill();
});

/** A raw HTTP/2 client over mTLS: `n` Process streams, each declaring one `size`-byte message and sending all of it but the last byte. */
async function partialMessages(port: number, who: { cert: string; key: string }, n: number, size: number) {
  const session = http2.connect(`https://127.0.0.1:${port}`, {
    ca,
    cert: fs.readFileSync(who.cert),
    key: fs.readFileSync(who.key),
  });
  session.on("error", () => undefined);
  const chunk = Buffer.alloc(size - 1, 0x61);
  const outcomes = Array.from({ length: n }, () => {
    const st = session.request({
      ":method": "POST",
      ":path": ExtProcService.Process.path,
      "content-type": "application/grpc",
      te: "trailers",
    });
    st.on("error", () => undefined);
    return new Promise<string>((done) => {
      const limit = setTimeout(() => done("pending"), 60000);
      const resolve = (r: string) => {
        clearTimeout(limit);
        done(r);
      };
      const status = (h: http2.IncomingHttpHeaders) => {
        if (h["grpc-status"] !== undefined) resolve(`status ${h["grpc-status"]}`);
      };
      st.on("response", status);
      st.on("trailers", status);
      st.on("close", () => resolve("closed"));
      const head = Buffer.alloc(5);
      head.writeUInt32BE(size, 1);
      st.write(head);
      // The router answers a refused stream on its first bytes; the rest goes
      // only to a stream still open (Node's client drops the answer of a
      // stream reset under a pending write).
      setTimeout(() => {
        if (!st.closed && !st.destroyed) st.write(chunk, () => resolve("buffered"));
      }, 300);
    });
  });
  return { outcomes: await Promise.all(outcomes), close: () => session.destroy() };
}

const metric = (text: string, re: RegExp) => Number(re.exec(text)?.[1] ?? 0);
const refusedBy = async (r: RouterProc, reason: string) =>
  metric(await r.metrics(), new RegExp(`infera_router_ext_proc_refused_streams_total\\{reason="${reason}"\\} (\\d+)`));
const bufferedBytes = async (r: RouterProc) => metric(await r.metrics(), /infera_router_ext_proc_buffered_bytes (\d+)/);

test("buffered request bytes are capped per connection and overall: 30 x 16 MB partial bodies, refused past the caps, router RSS bounded", async () => {
  const MB = 1024 * 1024;
  // Caps sized for the test: 2 messages of 16 MB per connection, 3 in all.
  const router = await startRouter([
    "--workers",
    `${A},${B}`,
    "--health-interval-ms",
    "0",
    "--ext-proc-max-buffered-bytes-per-connection",
    String(40 * MB),
    "--ext-proc-max-buffered-bytes",
    String(56 * MB),
    ...routerMtlsArgs(k),
  ]);
  const pid = router.proc.child.pid!;
  await sleep(500);
  const base = rssMb(pid);

  // Not the gateway: refused on arrival, before a byte is kept.
  const intr = await partialMessages(router.grpcPort, other, 30, 16 * MB);
  await waitFor("intruder refused", async () => (await refusedBy(router, "not_gateway")) === 30, 10000);
  assert.ok(!intr.outcomes.includes("status 8"), intr.outcomes.join(","));
  await sleep(500);
  assert.equal(await bufferedBytes(router), 0);
  const afterIntruder = rssMb(pid);

  // The gateway itself, over two connections: the caps bound what it buffers.
  const one = await partialMessages(router.grpcPort, gw, 30, 16 * MB);
  const two = await partialMessages(router.grpcPort, gw, 30, 16 * MB);
  const all = [...one.outcomes, ...two.outcomes];
  assert.ok(one.outcomes.filter((o) => o === "status 8").length >= 28, one.outcomes.join(","));
  assert.ok(all.filter((o) => o === "status 8").length >= 57, all.join(","));
  assert.ok((await refusedBy(router, "buffer_cap")) >= 57);
  // What was admitted arrives in full and stays under the server-wide cap.
  await waitFor("admitted bodies buffered", async () => (await bufferedBytes(router)) >= 32 * MB, 30000);
  await sleep(500);
  const held = await bufferedBytes(router);
  assert.ok(held <= 56 * MB, `buffered ${held}`);
  const peak = rssMb(pid);
  one.close();
  two.close();
  intr.close();
  await waitFor("released on close", async () => (await bufferedBytes(router)) === 0, 10000);
  // Generous bounds (GC timing, a noisy machine); without the caps 60 x 16 MB would be ~960 MB.
  assert.ok(afterIntruder - base < 60, `intruder grew RSS ${base.toFixed(0)} -> ${afterIntruder.toFixed(0)} MB`);
  assert.ok(
    peak - base < 220,
    `RSS ${base.toFixed(0)} -> ${peak.toFixed(0)} MB with ${(held / MB).toFixed(0)} MB buffered`,
  );
  // The router serves on: a new gateway stream gets its answer.
  const g = processStream(client(router.grpcPort, gw));
  g.send(reqHeaders("/v1/models", "GET", true));
  assert.equal((await g.next()).response.case, "requestHeaders");
  g.call.cancel();
  await router.proc.kill();
});

test("a client whose connection drops inside a message does not take the router down", async () => {
  // It did: the stream's end of input came after it had closed, and answering it threw.
  const MB = 1024 * 1024;
  // mTLS with flags today's main has too.
  const router = await startRouter([
    "--workers",
    `${A},${B}`,
    "--health-interval-ms",
    "0",
    "--ext-proc-tls-cert",
    k.cert,
    "--ext-proc-tls-key",
    k.key,
    "--ext-proc-tls-client-ca",
    k.ca,
  ]);
  for (let i = 0; i < 3; i++) {
    // Streams in the middle of large messages when the connection goes.
    const p = await partialMessages(router.grpcPort, gw, 4, 8 * MB);
    await sleep(2000);
    p.close();
    await sleep(500);
    assert.equal(router.proc.child.exitCode, null, router.proc.log().slice(-1500));
  }
  assert.ok((await fetch(`${router.admin}/livez`)).ok);
  await router.proc.kill();
});
