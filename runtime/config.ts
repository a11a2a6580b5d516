// Router and bridge Options, built from the shared flag table (core/flags.ts)
// by the shared CLI layer (cli/args.ts).
import * as fs from "fs";
import { defaultConfig, RouterConfig, Role, WorkerSpec } from "../core/router";
import { flagsFor, FlagValue } from "../core/flags";
import { PathRule, pathRules } from "../core/paths";
import { parseObjectives } from "../core/objectives";
import { BandLimit, parseQueueBound, queueLimits } from "../core/admission";
import { defaultTierWeights, parseTierWeights } from "../core/kvevents";
import { expandDp, offsetPort } from "../core/fleet";
import { configureTransportSecurity } from "./transport-security";
import { parseInterval } from "./probe";
import { CliError, parseCommand } from "./args";
import { parseSessionHeaders } from "../core/session-headers";

export interface Options {
  router: RouterConfig;
  host: string;
  extProcPort: number;
  /** TLS for the ext_proc gRPC server: PEM files; a client CA turns on mTLS. */
  extProcTls: { cert: string; key: string; clientCa: string | null } | null;
  /** A stream with no message for this long is ended and its load released (direct clients). */
  extProcStreamIdleS: number;
  extProcMaxStreams: number;
  /** mTLS client-certificate names allowed to open ext_proc streams (null: any client that reaches the port). */
  extProcClientIdentities: string[] | null;
  /** Caps on request bytes the ext_proc server buffers: per connection, and over all of them. */
  extProcMaxBufferedBytesPerConnection: number;
  extProcMaxBufferedBytes: number;
  /** Bearer token for /metrics and /v1/admin/* (probes stay open); empty = none. */
  adminToken: string;
  adminTls: { cert: string; key: string } | null;
  adminPort: number;
  workers: WorkerSpec[];
  tokenizerPath: string | null;
  /** Tokenizer threads and bounds (--tokenizer-*, --tokenize-*). */
  tokenize: {
    backend: "auto" | "fast-bpe" | "hf";
    threads: number | null;
    inlineChars: number;
    timeoutMs: number;
    queue: number;
  };
  /** Request objectives (core/objectives.ts): the name -> priority table, and whether the headers count. */
  objectives: { table: { [name: string]: number }; trust: boolean };
  /** Prefill admission (core/admission.ts): slots per worker (0 = off), the warm bound, the wait bound. */
  admission: { slots: number; warmTokens: number; maxWaitMs: number };
  /** Flow control (core/admission.ts, runtime/flow.ts): the queue TTL (0 = off) and the queue bounds. */
  flow: {
    ttlMs: number;
    /** --queue-late-binding on: movable waiters go to the first worker with a free slot. */
    lateBinding: boolean;
    /** --queue-flow-max-slots: cold-prefill slots one named flow may hold over the fleet (0 = no cap). */
    flowMaxSlots: number;
    /** --queue-flow-reserve: fleet slots one named flow of priority 0 and below leaves to others while another is active (0 = off). */
    flowReserve: number;
    maxQueued: number;
    maxQueuedBytes: number;
    bandLimits: { [priority: string]: BandLimit };
  };
  maxBodyBytes: number;
  /** Paths that reach a worker (core/paths.ts): the built-in inference endpoints and --extra-paths. */
  pathRules: PathRule[];
  maxSessionIdBytes: number;
  maxMessages: number;
  maxImages: number;
  maxJsonDepth: number;
  sessionHeader: string;
  /** Agent session headers read after sessionHeader (core/session-headers.ts). */
  sessionHeaders: string[];
  upstreamHeader: string;
  prefillHeader: string;
  logLevel: "debug" | "info" | "warn" | "error";
  logFormat: "json" | "text";
  kvEventTransport: "zmq" | "nats";
  kvEventTopic: string;
  natsUrl: string;
  /** Router replicas sharing in-flight load (runtime/replicas.ts). */
  replica: { sync: "off" | "nats"; id: string | null; subject: string; heartbeatMs: number; ttlMs: number };
  discovery: "static" | "etcd" | "k8s";
  etcdEndpoint: string;
  etcdPrefix: string;
  /** Bridge mode: nginx push location and its token. */
  nginxPushUrl: string;
  /** Active health checks: GET <worker>/health every N ms (0 = off). */
  healthIntervalMs: number;
  /**
   * Engine /metrics scraping (runtime/engine-metrics.ts): every N ms (0 = off), one GET per worker for
   * capacity, headroom and LoRA state; per-worker capacity overrides; saturation thresholds (0 = off).
   */
  engineMetrics?: {
    intervalMs: number;
    capacity: { [id: string]: number };
    saturation?: { queueDepth: number; kvUsage: number };
  };
  pushToken: string;
  /** k8s discovery (see k8s.ts). */
  kubeconfig: string | null;
  k8sNamespace: string;
  inferencePool: string;
  k8sSelector: string;
  k8sTargetPorts: number[];
  /** Endpoint Picker Protocol: next-best endpoints listed after the pick for the gateway's retries. */
  eppFallbackCount: number;
  /** EPP load shedding: requests of these objectives get a 429 while every candidate holds >= N active blocks (0 = off). */
  eppShedActiveBlocks: number;
  eppSheddableObjectives: string[];
  /** SIGTERM: seconds in-flight ext_proc streams get before the server closes them. */
  drainTimeoutS: number;
  bridgeQueueMax: number;
  /** KV event blocks per push to nginx (0: one push per engine batch). */
  bridgePushMaxBlocks: number;
  bridgeBackoffMaxMs: number;
  /** Render-parity probe (runtime/probe.ts): period in ms (0 = on join only), and the engine's tokenize API. */
  renderProbeIntervalMs: number;
  renderProbeApi: "vllm" | "sglang" | "off";
  /** --send-token-ids: the router's prompt ids to workers whose render parity is exact (runtime/token-ids.ts). */
  sendTokenIds: "off" | "exact";
  /** A worker with an events endpoint silent this long while serving traffic is flagged (0 = off). */
  kvEventSilenceS: number;
  /** Bound on engine blocks mirrored per target (worker and tier); the oldest go first (0 = none). */
  maxMirrorBlocks: number;
  kvReplayTimeoutMs: number;
}

/** A secret from a flag or env value, or read from a file (a mounted Kubernetes Secret); trailing newline dropped. */
export function secretFrom(value: string | null, file: string | null): string {
  if (file) {
    let s: string;
    try {
      s = fs.readFileSync(file, "utf8").replace(/\r?\n$/, "");
    } catch (e) {
      throw new CliError(`secret file '${file}': ${(e as Error).message}`);
    }
    // An empty token would leave the endpoint open: a mounted but unfilled Secret is an error, not "no token".
    if (!s) throw new CliError(`secret file '${file}' is empty`);
    return s;
  }
  return value ?? "";
}

/** Why a KV event endpoint cannot work, or null: ZMQ tcp://host:port / ipc://path, or a NATS subject. */
export function badEventEndpoint(ep: string): string | null {
  const m = /^([a-z]+):\/\/(.*)$/.exec(ep);
  if (!m)
    return /^[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*$/.test(ep)
      ? null
      : `'${ep}' is neither tcp://host:port, ipc://path nor a NATS subject`;
  if (m[1] === "ipc") return m[2] ? null : `'${ep}' has an empty ipc path`;
  if (m[1] !== "tcp") return `'${ep}': scheme ${m[1]}:// is not supported (tcp:// or ipc://)`;
  const hp = /^([^:\s/]+|\[[0-9a-fA-F:]+\]):(\d{1,5})$/.exec(m[2]);
  if (!hp || Number(hp[2]) < 1 || Number(hp[2]) > 65535) return `'${ep}' needs tcp://host:port with a port 1..65535`;
  return null;
}

/** Parses [role=]host:port[@endpoint] entries. */
export function parseWorkers(s: string): WorkerSpec[] {
  const out: WorkerSpec[] = [];
  for (const raw of s
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean)) {
    let rest = raw;
    let role: Role = "mixed";
    const eq = rest.indexOf("=");
    if (eq > 0 && !rest.slice(0, eq).includes(":")) {
      const r = rest.slice(0, eq);
      if (r !== "prefill" && r !== "decode" && r !== "mixed")
        throw new CliError(`--workers: unknown role '${r}' in '${raw}'`);
      role = r;
      rest = rest.slice(eq + 1);
    }
    let events: string | undefined;
    let replay: string | undefined;
    let snapshot: string | undefined;
    const at = rest.indexOf("@");
    if (at >= 0) {
      events = rest.slice(at + 1);
      rest = rest.slice(0, at);
      // @events[+replay[+snapshot]]; an empty replay ("pub++snap") means none.
      const parts = events.split("+");
      events = parts[0];
      if (parts.length > 1 && parts[1] !== "") replay = parts[1];
      if (parts.length > 2) snapshot = parts.slice(2).join("+");
    }
    // host:port/dp=N[/tagged]: an engine with N data-parallel ranks, N route targets;
    // /sglang (anywhere after host:port): the rank also goes in the body, as SGLang reads it.
    let dp = 1;
    let dpMode: "port" | "tagged" = "port";
    let engine: "vllm" | "sglang" | undefined;
    const em = /\/(sglang|vllm)(?=\/|$)/.exec(rest);
    if (em) {
      engine = em[1] as "vllm" | "sglang";
      rest = rest.slice(0, em.index) + rest.slice(em.index + em[0].length);
    }
    const dpm = /\/dp=(\d+)(\/tagged)?$/.exec(rest);
    if (dpm) {
      dp = Number(dpm[1]);
      if (dpm[2]) dpMode = "tagged";
      rest = rest.slice(0, dpm.index);
    }
    if (!/^[^:\s@]+:\d{1,5}$/.test(rest) || Number(rest.slice(rest.lastIndexOf(":") + 1)) > 65535)
      throw new CliError(
        `--workers: '${raw}' is not [role=]host:port[/dp=N[/tagged]][/sglang][@kv-endpoint[+replay-endpoint[+snapshot-endpoint]]]`,
      );
    if (events !== undefined) {
      const why = badEventEndpoint(events);
      if (why) throw new CliError(`--workers: '${raw}': KV event endpoint ${why}`);
    }
    if (replay !== undefined && !/^tcp:\/\/[^\s]+:\d+$/.test(replay))
      throw new CliError(`--workers: '${raw}': replay endpoint '${replay}' is not tcp://host:port`);
    if (snapshot !== undefined && !/^tcp:\/\/[^\s]+:\d+$/.test(snapshot))
      throw new CliError(`--workers: '${raw}': snapshot endpoint '${snapshot}' is not tcp://host:port`);
    const base: WorkerSpec = replay
      ? { id: rest, address: rest, role, events, replay }
      : { id: rest, address: rest, role, events };
    if (snapshot) base.snapshot = snapshot;
    if (engine === "sglang") base.engine = "sglang";
    for (const w of expandDp(base, dp, dpMode)) {
      // Two entries for one id would share one mirror and one load ledger, the
      // later silently replacing the earlier: refuse rather than guess.
      const dup = out.find((o) => o.id === w.id);
      if (dup)
        throw new CliError(
          `--workers: worker id '${w.id}' appears twice ('${raw}'); each host:port (and DP rank) may be listed once`,
        );
      out.push(w);
    }
  }
  return out;
}

/**
 * --kv-replay-endpoint host:port=tcp://h:5600,… : the same as a "+replay" suffix
 * in --workers, per worker address (DP ranks get port + rank).
 */
export function applyReplayEndpoints(workers: WorkerSpec[], s: string): void {
  for (const raw of s
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean)) {
    const eq = raw.indexOf("=");
    if (eq <= 0) throw new CliError(`--kv-replay-endpoint: '${raw}' is not host:port=tcp://host:port`);
    const addr = raw.slice(0, eq);
    const ep = raw.slice(eq + 1);
    const hit = workers.filter((w) => w.address === addr);
    if (!hit.length) throw new CliError(`--kv-replay-endpoint: no worker ${addr} in --workers`);
    for (const w of hit) w.replay = w.dpRank !== undefined && w.dpEvents !== "tagged" ? offsetPort(ep, w.dpRank) : ep;
  }
}

/** Options for the router (or the bridge) from the shared flag table (core/flags.ts). */
export function optionsFrom(values: Record<string, FlagValue>, cmd: "router" | "bridge" = "router"): Options {
  // A flag this command lacks (the bridge shares Options with the router) takes the table's default too:
  // every default lives in core/flags.ts only.
  const defaults: Record<string, FlagValue> = {};
  for (const f of flagsFor(cmd === "router" ? "bridge" : "router")) defaults[f.name] = f.def;
  for (const f of flagsFor(cmd)) defaults[f.name] = f.def;
  const v = (k: string): FlagValue => (values[k] !== undefined ? values[k] : defaults[k]);
  configureTransportSecurity(values);
  const r = defaultConfig() as unknown as Record<string, FlagValue>;
  for (const f of flagsFor("router"))
    if (f.routerKey && values[f.name] !== undefined && !(values[f.name] === null && f.kind === "weights"))
      r[f.routerKey] = values[f.name];
  const o: Options = {
    router: r as unknown as RouterConfig,
    host: v("host") as string,
    extProcPort: v("ext-proc-port") as number,
    adminPort: v("admin-port") as number,
    workers: v("workers") ? parseWorkers(v("workers") as string) : [],
    tokenizerPath: v("router-tokenizer-path") as string | null,
    tokenize: {
      backend: v("tokenizer-backend") as Options["tokenize"]["backend"],
      threads: v("tokenizer-threads") as number | null,
      inlineChars: v("tokenize-inline-chars") as number,
      timeoutMs: v("tokenize-timeout-ms") as number,
      queue: v("tokenize-queue") as number,
    },
    objectives: { table: parseObjectives(v("objectives") as string), trust: v("objective-headers") === "trust" },
    admission: {
      slots: v("prefill-admission-slots") as number,
      warmTokens: v("prefill-admission-warm-tokens") as number,
      maxWaitMs: v("prefill-admission-max-wait-ms") as number,
    },
    flow: {
      ttlMs: queueTtl(
        v("queue-ttl-ms") as number | null,
        v("prefill-admission-max-wait-ms") as number,
        parseObjectives(v("objectives") as string),
        v("objective-headers") === "trust",
      ),
      lateBinding: v("queue-late-binding") === "on",
      flowMaxSlots: v("queue-flow-max-slots") as number,
      flowReserve: v("queue-flow-reserve") as number,
      ...queueLimits(
        parseQueueBound(v("queue-max-requests") as string),
        parseQueueBound(v("queue-max-bytes") as string),
      ),
    },
    maxBodyBytes: v("max-body-bytes") as number,
    pathRules: pathRules(v("extra-paths") as string),
    maxSessionIdBytes: v("max-session-id-bytes") as number,
    maxMessages: v("max-messages") as number,
    maxImages: v("max-images") as number,
    maxJsonDepth: v("max-json-depth") as number,
    sessionHeader: (v("session-header") as string).toLowerCase(),
    sessionHeaders: parseSessionHeaders(v("session-headers") as string),
    upstreamHeader: "x-infera-upstream",
    prefillHeader: "x-infera-prefill",
    logLevel: v("log-level") as Options["logLevel"],
    logFormat: v("log-format") as Options["logFormat"],
    kvEventTransport: v("kv-event-transport") as Options["kvEventTransport"],
    kvEventTopic: v("kv-event-topic") as string,
    natsUrl: v("nats-url") as string,
    replica: {
      sync: v("replica-sync") as string as "off" | "nats",
      id: v("replica-id") as string | null,
      subject: v("replica-subject") as string,
      heartbeatMs: v("replica-heartbeat-ms") as number,
      ttlMs: v("replica-ttl-ms") as number,
    },
    discovery: v("discovery-backend") as Options["discovery"],
    etcdEndpoint: v("etcd-endpoint") as string,
    etcdPrefix: v("etcd-prefix") as string,
    nginxPushUrl: v("nginx-push-url") as string,
    healthIntervalMs: v("health-interval-ms") as number,
    engineMetrics: {
      intervalMs: v("engine-metrics-interval-ms") as number,
      capacity: (v("kv-capacity-blocks") as { [id: string]: number } | null) || {},
      saturation: {
        queueDepth: v("saturation-queue-depth") as number,
        kvUsage: v("saturation-kv-usage") as number,
      },
    },
    pushToken: secretFrom(v("push-token") as string, v("push-token-file") as string | null),
    kubeconfig: v("kubeconfig") as string | null,
    k8sNamespace: v("k8s-namespace") as string,
    inferencePool: v("inference-pool") as string,
    k8sSelector: v("k8s-selector") as string,
    k8sTargetPorts: (v("k8s-target-port") as string)
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean)
      .map((x) => {
        const n = Number(x);
        if (!(Number.isInteger(n) && n >= 1 && n <= 65535))
          throw new CliError(`--k8s-target-port: '${x}' is not a port 1..65535`);
        return n;
      }),
    eppFallbackCount: v("epp-fallback-endpoints") as number,
    eppShedActiveBlocks: v("epp-shed-active-blocks") as number,
    eppSheddableObjectives: (v("epp-sheddable-objectives") as string)
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean),
    drainTimeoutS: v("drain-timeout-s") as number,
    bridgeQueueMax: v("bridge-queue-max") as number,
    bridgePushMaxBlocks: v("bridge-push-max-blocks") as number,
    bridgeBackoffMaxMs: v("bridge-backoff-max-ms") as number,
    renderProbeIntervalMs: parseInterval("--render-probe-interval", v("render-probe-interval") as string),
    renderProbeApi: v("render-probe-api") as string as Options["renderProbeApi"],
    sendTokenIds: v("send-token-ids") as string as Options["sendTokenIds"],
    extProcTls:
      v("ext-proc-tls-cert") || v("ext-proc-tls-key")
        ? {
            cert: (v("ext-proc-tls-cert") as string) ?? "",
            key: (v("ext-proc-tls-key") as string) ?? "",
            clientCa: (v("ext-proc-tls-client-ca") as string | null) ?? null,
          }
        : null,
    extProcStreamIdleS: v("ext-proc-stream-idle-s") as number,
    extProcMaxStreams: v("ext-proc-max-streams") as number,
    extProcClientIdentities: v("ext-proc-client-identities")
      ? (v("ext-proc-client-identities") as string)
          .split(",")
          .map((x) => x.trim())
          .filter(Boolean)
      : null,
    extProcMaxBufferedBytesPerConnection: v("ext-proc-max-buffered-bytes-per-connection") as number,
    extProcMaxBufferedBytes: v("ext-proc-max-buffered-bytes") as number,
    kvEventSilenceS: v("kv-event-silence-s") as number,
    maxMirrorBlocks: v("max-mirror-blocks") as number,
    kvReplayTimeoutMs: v("kv-replay-timeout-ms") as number,
    adminToken: secretFrom(v("admin-token") as string | null, v("admin-token-file") as string | null),
    adminTls:
      v("admin-tls-cert") || v("admin-tls-key")
        ? { cert: (v("admin-tls-cert") as string) ?? "", key: (v("admin-tls-key") as string) ?? "" }
        : null,
  };
  if (o.adminTls && (!o.adminTls.cert || !o.adminTls.key))
    throw new CliError("--admin-tls-cert and --admin-tls-key go together");
  if (v("kv-tier-weights")) {
    try {
      o.router.kvTierWeights = { ...defaultTierWeights(), ...parseTierWeights(v("kv-tier-weights") as string) };
    } catch (e) {
      throw new CliError((e as Error).message);
    }
  }
  if (v("kv-replay-endpoint")) applyReplayEndpoints(o.workers, v("kv-replay-endpoint") as string);
  if (o.extProcTls && (!o.extProcTls.cert || !o.extProcTls.key))
    throw new CliError("--ext-proc-tls-cert and --ext-proc-tls-key go together");
  if (!o.extProcTls && v("ext-proc-tls-client-ca"))
    throw new CliError("--ext-proc-tls-client-ca needs --ext-proc-tls-cert and --ext-proc-tls-key");
  if (o.extProcClientIdentities && !o.extProcTls?.clientCa)
    throw new CliError(
      "--ext-proc-client-identities needs mTLS: --ext-proc-tls-cert, --ext-proc-tls-key and --ext-proc-tls-client-ca (without a verified client certificate there is no identity to check)",
    );
  if (
    v("ext-proc-client-identities") !== null &&
    v("ext-proc-client-identities") !== undefined &&
    !o.extProcClientIdentities
  )
    throw new CliError("--ext-proc-client-identities: no identity given");
  {
    // One message must fit in a connection's budget, or no body near --max-body-bytes could be sent at all.
    const message = 2 * o.maxBodyBytes + 1024 * 1024 + 5;
    if (o.extProcMaxBufferedBytesPerConnection < message)
      throw new CliError(
        `--ext-proc-max-buffered-bytes-per-connection must be at least ${message} (one gRPC message carrying a body of twice --max-body-bytes)`,
      );
    if (o.extProcMaxBufferedBytes < o.extProcMaxBufferedBytesPerConnection)
      throw new CliError("--ext-proc-max-buffered-bytes must be at least --ext-proc-max-buffered-bytes-per-connection");
  }
  if (o.discovery === "k8s" && !o.inferencePool && !o.k8sSelector)
    throw new CliError("--discovery-backend k8s needs --inference-pool NAME or --k8s-selector LABELS");
  if (o.discovery === "static" && o.workers.length === 0)
    throw new CliError("--workers is required with --discovery-backend static");
  if (o.replica.sync !== "off" && o.replica.ttlMs <= o.replica.heartbeatMs)
    throw new CliError(
      "--replica-ttl-ms must be longer than --replica-heartbeat-ms (a live replica would expire between heartbeats)",
    );
  if (cmd === "bridge" && !o.pushToken) throw new CliError("--push-token (or INFERA_PUSH_TOKEN) is required");
  const em = o.engineMetrics;
  if (cmd === "router" && em && em.saturation && !em.intervalMs && (em.saturation.queueDepth || em.saturation.kvUsage))
    throw new CliError(
      "--saturation-queue-depth and --saturation-kv-usage read the engines' /metrics: set --engine-metrics-interval-ms above 0",
    );
  return o;
}

/**
 * --queue-ttl-ms unset: the wait bound when there is critical traffic to
 * protect (trusted objectives with a priority above 0), so a request of
 * priority 0 or below still waiting then is answered 503 instead of being
 * sent into an engine queue ahead of critical work; with one band only
 * (no objectives, or headers ignored) there is nothing to protect, and a
 * request is sent at the wait bound as before.
 */
export function queueTtl(
  set: number | null,
  maxWaitMs: number,
  objectives: { [name: string]: number },
  trust: boolean,
): number {
  if (set !== null) return set;
  for (const n in objectives) if (trust && objectives[n] > 0) return maxWaitMs;
  return 0;
}

/** Parses a command line (and env, and --config) into Options; --help and --version belong to the commands (runCommand). */
export function parseArgs(
  argv: string[],
  env: NodeJS.ProcessEnv = process.env,
  cmd: "router" | "bridge" = "router",
): Options {
  return optionsFrom(parseCommand(cmd, argv, env).values, cmd);
}
