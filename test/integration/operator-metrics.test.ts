// The operator metrics over the real ext_proc server (a gRPC client plays
// Envoy): infera_router_requests_total counts each request once under the
// outcome the router answered it with, and infera_router_worker_up /
// infera_router_worker_excluded follow the router's real health probes and
// the fleet discovery hands it. Values are read from the registry's Prometheus
// text exposition, as a scrape of /metrics sees them.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as http from "http";
import { AddressInfo } from "net";
import { create } from "@bufbuild/protobuf";
import type { JsonObject } from "@bufbuild/protobuf";
import {
  ExtProcFixture,
  hdrs,
  processStream,
  reqBody,
  reqHeaders,
  respBody,
  respHeaders,
  startExtProcFixture,
} from "../extproc-client";
import {
  HttpBodySchema,
  HttpHeadersSchema,
  ProcessingRequestSchema,
  ProcessingResponse,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { MetadataSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";
import { freePort } from "../harness";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = async (f: () => Promise<boolean> | boolean, tries = 300) => {
  for (let i = 0; i < tries && !(await f()); i++) await sleep(20);
  return f();
};

/** Every sample of the exposition: `name{labels}` -> value. */
async function scrape(f: ExtProcFixture): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const line of (await f.app.metrics.registry.metrics()).split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}
const outcomes = async (f: ExtProcFixture) => {
  const s = await scrape(f);
  const o: Record<string, number> = {};
  for (const k of Object.keys(s)) {
    const m = /^infera_router_requests_total\{outcome="([a-z_]+)"\}$/.exec(k);
    if (m) o[m[1]] = s[k];
  }
  return o;
};

const status = (r: ProcessingResponse) =>
  r.response.case === "immediateResponse" ? Number(r.response.value.status?.code) : 0;
const chat = (text: string) =>
  JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] });
// ~1,500 tokens, sharing nothing but the chat template: cold on any worker, so prefill admission applies.
const cold = (word: string) => `${word} `.repeat(1500);

/** Headers then a whole (BUFFERED-style) body; resolves with the routing answer. */
async function send(f: ExtProcFixture, body: string, extra: Record<string, string> = {}) {
  const s = processStream(f.client);
  s.send(reqHeaders("/v1/chat/completions", "POST", false, extra));
  assert.equal((await s.next()).response.case, "requestHeaders");
  s.send(reqBody(body));
  return { s, answer: s.next() };
}

test("each request is counted once under the outcome the router answered it with", async () => {
  const f = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7301",
    "--health-interval-ms",
    "0",
    "--max-body-bytes",
    "20000",
    "--epp-shed-active-blocks",
    "1",
    "--epp-sheddable-objectives",
    "batch",
  ]);
  try {
    const zero = await outcomes(f);
    assert.deepEqual(
      zero,
      { routed: 0, bad_request: 0, too_large: 0, shed: 0, no_worker: 0, overloaded: 0, client_closed: 0, error: 0 },
      "every outcome is exported at 0 from the start",
    );

    // routed: a cold prompt gets its pick (and holds its load until its response ends)
    const a = await send(f, chat(cold("alpha")));
    assert.equal((await a.answer).response.case, "requestBody");

    // shed: a sheddable objective while the only candidate holds active blocks
    const shed = await send(f, chat("a small batch job"), { "x-gateway-inference-objective": "batch" });
    assert.equal(status(await shed.answer), 429);

    // client_closed: a second cold prompt waits for prefill admission, and its stream ends meanwhile
    const b = await send(f, chat(cold("bravo")));
    void b.answer.catch(() => undefined);
    assert.ok(await until(() => f.app.admission.waiting() === 1), "bravo waits for a prefill slot");
    b.s.call.cancel();
    assert.ok(
      await until(async () => (await outcomes(f)).client_closed === 1),
      "the abandoned request counts as client_closed",
    );

    // bad_request: a body that is not JSON, and a path the gateway does not serve
    const bad = await send(f, "{not json");
    assert.equal(status(await bad.answer), 400);
    const nf = processStream(f.client);
    nf.send(reqHeaders("/admin/secret", "GET", true));
    assert.equal(status(await nf.next()), 404);

    // too_large: over --max-body-bytes
    const big = await send(f, chat("x".repeat(30000)));
    assert.equal(status(await big.answer), 413);

    // no_worker: the gateway's endpoint subset names no worker the router knows
    const nw = processStream(f.client);
    nw.send(
      create(ProcessingRequestSchema, {
        request: {
          case: "requestHeaders",
          value: create(HttpHeadersSchema, { headers: hdrs({ ":path": "/v1/chat/completions", ":method": "POST" }) }),
        },
        metadataContext: create(MetadataSchema, {
          filterMetadata: {
            "envoy.lb.subset_hint": { "x-gateway-destination-endpoint-subset": ["127.0.0.1:1"] } as JsonObject,
          },
        }),
      }),
    );
    await nw.next();
    nw.send(reqBody(chat("hello")));
    assert.equal(status(await nw.next()), 503);

    // error: a gateway sending a partial body (STREAMED request body mode) is misconfigured
    const part = processStream(f.client);
    part.send(reqHeaders("/v1/chat/completions"));
    await part.next();
    part.send(
      create(ProcessingRequestSchema, {
        request: { case: "requestBody", value: create(HttpBodySchema, { body: Buffer.from("{"), endOfStream: false }) },
      }),
    );
    assert.equal(status(await part.next()), 500);

    // alpha's response runs to its end: no second count for a routed request
    a.s.send(respHeaders());
    await a.s.next();
    a.s.send(respBody(true));
    await a.s.next();
    assert.ok(await until(() => f.app.router.openGuards() === 0));

    assert.deepEqual(await outcomes(f), {
      routed: 1,
      bad_request: 2,
      too_large: 1,
      shed: 1,
      no_worker: 1,
      overloaded: 0,
      client_closed: 1,
      error: 1,
    });
    // The 4xx counter by status is unchanged alongside.
    const s = await scrape(f);
    assert.equal(s['infera_router_bad_requests_total{status="400"}'], 1);
    assert.equal(s['infera_router_bad_requests_total{status="404"}'], 1);
    assert.equal(s['infera_router_bad_requests_total{status="429"}'], 1);
  } finally {
    await f.close();
  }
});

test("worker_up follows the real health probes; worker_excluded marks a block-size mismatch from discovery", async () => {
  // A live engine stand-in answering /health, and an address nobody listens on.
  const live = http.createServer((req, res) => {
    res.writeHead(req.url === "/health" ? 200 : 404);
    res.end();
  });
  await new Promise<void>((r) => live.listen(0, "127.0.0.1", () => r()));
  const up = `127.0.0.1:${(live.address() as AddressInfo).port}`;
  const down = `127.0.0.1:${await freePort()}`;
  const f = await startExtProcFixture([
    "--workers",
    `${up},${down}`,
    "--health-interval-ms",
    "200",
    "--block-size",
    "16",
  ]);
  try {
    f.app.startHealthChecks();
    const key = (m: string, w: string) => `${m}{worker="${w}",role="mixed"}`;
    assert.ok(
      await until(async () => {
        const s = await scrape(f);
        return s[key("infera_router_worker_up", up)] === 1 && s[key("infera_router_worker_up", down)] === 0;
      }),
      JSON.stringify(await scrape(f)),
    );
    let s = await scrape(f);
    assert.equal(s[`infera_router_worker_excluded{worker="${up}"}`], 0);
    assert.equal(s[`infera_router_worker_excluded{worker="${down}"}`], 0);
    // Discovery reports the live worker with another block size: it leaves every pool.
    f.app.setWorkers([
      { id: up, address: up, role: "mixed", blockSize: 32 },
      { id: down, address: down, role: "mixed" },
    ]);
    s = await scrape(f);
    assert.equal(s[`infera_router_worker_excluded{worker="${up}"}`], 1);
    assert.equal(s[key("infera_router_worker_up", up)], 0);
  } finally {
    await f.close();
    live.close();
  }
});

test("a full tokenizer queue counts as overloaded, not as no_worker", async () => {
  // Every prompt goes to the single tokenizer thread; one may wait or run, the rest are refused at once.
  const f = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7302",
    "--health-interval-ms",
    "0",
    "--tokenize-inline-chars",
    "0",
    "--tokenizer-threads",
    "1",
    "--tokenize-queue",
    "1",
  ]);
  try {
    const sent = await Promise.all(
      [0, 1, 2, 3].map((i) => send(f, chat(`${"lorem ipsum dolor sit amet ".repeat(8000)} ${i}`))),
    );
    const answers = await Promise.all(sent.map((x) => x.answer));
    const refused = answers.filter((r) => status(r) === 503).length;
    const routed = answers.filter((r) => r.response.case === "requestBody").length;
    assert.equal(refused + routed, 4, answers.map((r) => `${r.response.case}${status(r)}`).join(","));
    assert.ok(refused >= 1, "the queue of one refused some of four concurrent prompts");
    const o = await outcomes(f);
    assert.equal(o.overloaded, refused);
    assert.equal(o.no_worker, 0);
    assert.equal(o.routed, routed);
    for (const x of sent) x.s.call.cancel();
  } finally {
    await f.close();
  }
});
