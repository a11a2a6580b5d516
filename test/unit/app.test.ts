// The ext_proc app without transports: tokenize once per request, decode demand
// metrics on /metrics, env fallbacks for flags.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { App } from "../../runtime/app";
import { parseArgs, parseWorkers } from "../../runtime/config";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };

test("a PD request is tokenized exactly once, shared by the prefill and decode picks", async () => {
  const app = new App(
    parseArgs(["--workers", "prefill=127.0.0.1:1,decode=127.0.0.1:2", "--decode-input-demand", "on"], {}),
    () => undefined,
    noEvents,
  );
  app.setWorkers(app.opts.workers);
  let calls = 0;
  const tok = app.tokenizer!;
  const orig = tok.encode.bind(tok);
  tok.encode = (t: string) => {
    calls++;
    return orig(t);
  };
  const body = Buffer.from(
    JSON.stringify({ model: "m", n: 2, messages: [{ role: "user", content: "hello there ".repeat(50) }] }),
  );
  const p = app.route("chat", body, null);
  assert.equal(calls, 1);
  assert.ok(p.prefill && p.target.role === "decode");
  const d = app.router.demand(p.target.id);
  assert.equal(d.requests, 1);
  assert.ok(d.tokens > 100 && d.tokens % 2 === 0, "input tokens x n=2");
  const m = await app.metrics.registry.metrics();
  assert.match(m, /infera_router_decode_demand_decisions_total\{mode="on",input="exact",agrees="(true|false)"\} 1/);
  assert.match(m, new RegExp(`infera_router_decode_demand_tokens\\{target="127\\.0\\.0\\.1:2"\\} ${d.tokens}`));
  assert.match(m, /infera_router_decode_demand_requests\{target="127\.0\.0\.1:2"\} 1/);
  p.reservation.finish();
  assert.match(await app.metrics.registry.metrics(), /infera_router_decode_demand_tokens\{target="127\.0\.0\.1:2"\} 0/);
  await app.close();
});

test("flags: env fallbacks, validation with the flag named, worker list syntax", () => {
  assert.equal(
    parseArgs(["--workers", "127.0.0.1:1"], { INFERA_DECODE_INPUT_DEMAND: "shadow", INFERA_DECODE_REQUEST_WEIGHT: "7" })
      .router.decodeInputDemand,
    "shadow",
  );
  assert.equal(
    parseArgs(["--workers", "127.0.0.1:1"], { INFERA_DECODE_REQUEST_WEIGHT: "7" }).router.decodeRequestWeight,
    7,
  );
  assert.equal(
    parseArgs(["--workers", "127.0.0.1:1", "--decode-input-demand", "off"], { INFERA_DECODE_INPUT_DEMAND: "on" }).router
      .decodeInputDemand,
    "off",
    "the flag wins over the env",
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1", "--decode-input-demand", "maybe"], {}),
    /--decode-input-demand: 'maybe' is not one of off, shadow, on/,
  );
  assert.throws(() => parseArgs([], {}), /--workers is required/);
  assert.throws(() => parseArgs(["--workers", "x"], {}), /not \[role=\]host:port/);
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1", "--bogus"], {}), /unknown flag --bogus/);
  assert.deepEqual(parseWorkers("prefill=10.0.0.1:8000@tcp://10.0.0.1:5557,10.0.0.2:8000"), [
    { id: "10.0.0.1:8000", address: "10.0.0.1:8000", role: "prefill", events: "tcp://10.0.0.1:5557" },
    { id: "10.0.0.2:8000", address: "10.0.0.2:8000", role: "mixed", events: undefined },
  ]);
  assert.throws(
    () =>
      new App(
        parseArgs(["--workers", "127.0.0.1:1", "--router-policy", "random", "--decode-input-demand", "on"], {}),
        () => undefined,
        noEvents,
      ),
    /needs --router-policy kv-aware/,
  );
});

test("400s for malformed requests come out of route() with status and type", () => {
  const app = new App(
    parseArgs(["--workers", "127.0.0.1:1", "--max-body-bytes", "100"], {}),
    () => undefined,
    noEvents,
  );
  app.setWorkers(app.opts.workers);
  const err = (b: string) => {
    try {
      app.route("chat", Buffer.from(b), null);
    } catch (e) {
      return [(e as { status: number }).status, (e as { type: string }).type];
    }
    return null;
  };
  assert.deepEqual(err("{"), [400, "invalid_request_error"]);
  assert.deepEqual(err(JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(200) }] })), [
    413,
    "request_too_large",
  ]);
});

test("a session id over --max-session-id-bytes is refused with a 400 before it reaches the session table", () => {
  const app = new App(
    parseArgs(
      [
        "--workers",
        "127.0.0.1:7001",
        "--health-interval-ms",
        "0",
        "--session-affinity",
        "prefill",
        "--max-session-id-bytes",
        "64",
      ],
      {},
    ),
    () => undefined,
    { subscribe: () => ({ close() {} }), close: async () => undefined },
  );
  app.setWorkers(app.opts.workers);
  const body = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }));
  assert.throws(
    () => app.route("chat", body, "s".repeat(65)),
    (e: Error & { status?: number }) => e.status === 400 && /65 bytes, over the 64-byte limit/.test(e.message),
  );
  assert.throws(() => app.route("chat", body, "é".repeat(33)), /66 bytes/);
  assert.equal(app.state.sessions.size(), 0);
  app.route("chat", body, "s".repeat(64)).reservation.finish();
  assert.equal(app.state.sessions.size(), 1);
});

test("decode-demand input is an estimate for multimodal requests and once a worker's render diverged", async () => {
  const http = await import("http");
  // A worker whose /tokenize disagrees with the router (e.g. another chat template).
  const srv = http.createServer((q, r) => {
    if (q.url === "/tokenize") {
      r.setHeader("content-type", "application/json");
      return void r.end(JSON.stringify({ count: 3, max_model_len: 4096, tokens: [1, 2, 3] }));
    }
    r.statusCode = 404;
    r.end();
  });
  await new Promise<void>((res) => srv.listen(0, "127.0.0.1", res));
  const diverging = `127.0.0.1:${(srv.address() as { port: number }).port}`;
  const app = new App(
    parseArgs(["--workers", "prefill=127.0.0.1:1,decode=127.0.0.1:2", "--decode-input-demand", "shadow"], {}),
    () => undefined,
    noEvents,
  );
  try {
    app.setWorkers(app.opts.workers);
    const text = (s: string) => Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: s }] }));
    app.route("chat", text("plain ".repeat(40)), null).reservation.finish();
    const img = Buffer.from(
      JSON.stringify({
        model: "m",
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "what is this" },
              { type: "image_url", image_url: { url: "https://img/1.png" } },
            ],
          },
        ],
      }),
    );
    app.route("chat", img, null).reservation.finish();
    let m = await app.metrics.registry.metrics();
    assert.match(
      m,
      /infera_router_decode_demand_decisions_total\{mode="shadow",input="exact",agrees="(true|false)"\} 1/,
    );
    assert.match(
      m,
      /infera_router_decode_demand_decisions_total\{mode="shadow",input="estimate",agrees="(true|false)"\} 1/,
      "multimodal -> estimate",
    );
    app.addWorker({ id: "x", address: diverging, role: "mixed" });
    for (let i = 0; i < 100 && app.probes!.state("x").status !== "diverged"; i++)
      await new Promise((r) => setTimeout(r, 50));
    assert.equal(app.probes!.state("x").status, "diverged");
    app.route("chat", text("plain again ".repeat(40)), null).reservation.finish();
    m = await app.metrics.registry.metrics();
    // (agreeing or not: which decode worker a tie goes to is the rotation's turn)
    const estimates = [
      ...m.matchAll(
        /infera_router_decode_demand_decisions_total\{mode="shadow",input="estimate",agrees="(?:true|false)"\} (\d+)/g,
      ),
    ];
    assert.equal(
      estimates.reduce((a, x) => a + Number(x[1]), 0),
      2,
      "a diverged worker -> estimate",
    );
  } finally {
    await app.close();
    srv.close();
  }
});

test("speed learning times first tokens on a sub-millisecond clock (epoch milliseconds)", async () => {
  const app = new App(parseArgs(["--workers", "127.0.0.1:1"], {}), () => undefined, noEvents);
  app.setWorkers(app.opts.workers);
  const body = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hello there" }] }));
  const p = app.route("chat", body, null);
  const before = Date.now();
  p.reservation.dispatched();
  p.reservation.firstToken();
  const twin = app.router.latency!.twin!;
  const at = twin.view(app.router.worker(p.target.id)!.epochKey).anchor;
  // The first token's time is the replica's anchor: epoch time, not rounded to whole milliseconds.
  assert.ok(Math.abs(at - before) < 1000, `anchor ${at}, Date.now() ${before}`);
  assert.notEqual(at, Math.round(at));
  p.reservation.finish();
  await app.close();
});
