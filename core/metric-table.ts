// The one metric table: name, type, help, labels and buckets of every metric
// the router exports. runtime/metrics.ts (and the modules that register their
// own: replicas, render probe, admission, ext_proc server) registers the Node
// (prom-client) metrics from it, njs/infera.ts writes its /metrics exposition's HELP/TYPE
// lines from it, and scripts/flags-doc.ts renders the metric list in
// docs/configuration.md (test/unit/metric-table.test.ts fails when any of the
// three differs from the table). Plain data, ES5-safe: njs bundles this file.

export type MetricType = "counter" | "gauge" | "histogram";

export interface MetricSpec {
  name: string;
  type: MetricType;
  help: string;
  labels: string[];
  /** Histogram bucket upper bounds, in the metric's unit. */
  buckets?: number[];
  /** The njs router (nginx) exports it too. */
  njs?: boolean;
  /** Exported by the bridge (infera-gate bridge) instead of the router. */
  bridge?: boolean;
  /** Exported by the njs router (nginx) alone: the Node router has no such event. */
  njsOnly?: boolean;
}

const WORKER = ["worker"];

/**
 * The table, built on first use: njs runs this module's top level in every
 * request's VM, and only /metrics reads it there.
 */
let table: MetricSpec[] | null = null;
export function metricTable(): MetricSpec[] {
  if (table === null) table = builtinMetrics();
  return table;
}

function builtinMetrics(): MetricSpec[] {
  return [
    {
      name: "infera_router_picks_total",
      type: "counter",
      help: "Picks per worker and role",
      labels: ["worker", "role", "policy"],
    },
    {
      name: "infera_router_cache_hit_blocks_total",
      type: "counter",
      help: "Prompt blocks already cached on the picked worker",
      labels: ["worker", "role"],
      njs: true,
    },
    {
      name: "infera_router_request_blocks_total",
      type: "counter",
      help: "Prompt blocks of routed requests",
      labels: ["role"],
    },
    {
      name: "infera_router_pick_latency_seconds",
      type: "histogram",
      help: "Parse + tokenize + hash + score time per request",
      labels: [],
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
    },
    {
      name: "infera_router_plugin_duration_seconds",
      type: "histogram",
      help: "Time each scheduling plugin took per run (kind: filter, data, scorer, picker, lifecycle)",
      labels: ["plugin", "kind"],
      buckets: [
        0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.025,
      ],
    },
    {
      name: "infera_router_kv_events_total",
      type: "counter",
      help: "KV events applied",
      labels: ["worker", "type"],
    },
    {
      name: "infera_router_kv_event_errors_total",
      type: "counter",
      help: "KV event frames refused or resyncs",
      labels: ["worker", "reason"],
    },
    {
      name: "infera_router_prefill_admission_wait_seconds",
      type: "histogram",
      help: "Time cold requests waited at the router for a prefill slot on their worker (--prefill-admission-slots)",
      labels: [],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    },
    {
      name: "infera_router_prefill_admission_forced_total",
      type: "counter",
      help: "Requests sent past the slot limit because they waited --prefill-admission-max-wait-ms",
      labels: [],
    },
    {
      name: "infera_router_ttft_prediction_error_ratio",
      type: "histogram",
      help: "|predicted - observed| / observed time to first token, per worker, for requests the router could predict when they left (the scheduler replica's prediction, or the speed model's until the replica has learned the worker; sum/count = MAPE)",
      labels: WORKER,
      buckets: [0.05, 0.1, 0.15, 0.25, 0.5, 1, 2, 5],
    },
    {
      name: "infera_router_worker_slowness",
      type: "gauge",
      help: "Time per unit of work against the fleet median, as the cost uses it (1 = typical or not learned yet; --speed-learning)",
      labels: WORKER,
    },
    {
      name: "infera_router_worker_prefill_ms_per_token",
      type: "gauge",
      help: "Learned prefill milliseconds per prompt token (absent until learned; --speed-learning)",
      labels: WORKER,
    },
    {
      name: "infera_router_shed_total",
      type: "counter",
      help: "Sheddable requests (negative priority, --objectives) refused with 429 because their worker had no free prefill slot",
      labels: ["priority"],
      njs: true,
    },
    {
      name: "infera_router_bad_requests_total",
      type: "counter",
      help: "Requests refused with 4xx",
      labels: ["status"],
    },
    {
      name: "infera_router_requests_total",
      type: "counter",
      help: "Requests the router answered, by outcome: routed, bad_request, too_large, shed, no_worker, overloaded, client_closed, error",
      labels: ["outcome"],
    },
    {
      name: "infera_router_worker_up",
      type: "gauge",
      help: "1 when the worker can take picks (healthy, not excluded, through a health probe since it joined when checks are on), else 0",
      labels: ["worker", "role"],
    },
    {
      name: "infera_router_worker_excluded",
      type: "gauge",
      help: "1 when the router keeps the worker out of every pool for a configuration fault (e.g. block size mismatch; reason in /v1/admin/workers), else 0",
      labels: WORKER,
    },
    {
      name: "infera_router_epp_served_elsewhere_total",
      type: "counter",
      help: "Responses the gateway reports served from an endpoint other than the pick (known: a worker we track)",
      labels: ["known"],
    },
    {
      name: "infera_router_decode_demand_decisions_total",
      type: "counter",
      help: "Decode input-demand decisions; agrees=whether the demand suggestion matched the original choice",
      labels: ["mode", "input", "agrees"],
      njs: true,
    },
    {
      name: "infera_router_decode_demand_tokens",
      type: "gauge",
      help: "In-flight input tokens booked on each decode target",
      labels: ["target"],
      njs: true,
    },
    {
      name: "infera_router_decode_demand_requests",
      type: "gauge",
      help: "Requests held on each decode target",
      labels: ["target"],
      njs: true,
    },
    {
      name: "infera_router_active_blocks",
      type: "gauge",
      help: "Distinct in-flight prompt blocks per worker",
      labels: WORKER,
      njs: true,
    },
    {
      name: "infera_router_mirror_blocks",
      type: "gauge",
      help: "Blocks mirrored from each worker's KV events",
      labels: WORKER,
      njs: true,
    },
    {
      name: "infera_router_kv_event_age_seconds",
      type: "gauge",
      help: "Seconds since each worker's last KV event batch (since it joined, if none yet)",
      labels: WORKER,
    },
    {
      name: "infera_router_kv_events_silent",
      type: "gauge",
      help: "1 when a worker with a KV events endpoint sent nothing for --kv-event-silence-s while serving picks",
      labels: WORKER,
    },
    {
      name: "infera_router_mirror_tier_blocks",
      type: "gauge",
      help: "Blocks mirrored per worker and storage tier (medium)",
      labels: ["worker", "tier"],
    },
    {
      name: "infera_router_workers",
      type: "gauge",
      help: "Workers known to the router (excluded ones included)",
      labels: [],
    },
    {
      name: "infera_router_tokenizer_piece_cache_tokens",
      type: "gauge",
      help: "Prompt tokens served from the tokenizer's piece cache (hit) or encoded afresh (miss), since start",
      labels: ["result"],
    },
    {
      name: "infera_router_event_loop_lag_seconds",
      type: "gauge",
      help: "Event-loop delay since the previous scrape (max, p99, mean): how long picks and KV events waited behind other work",
      labels: ["stat"],
    },
    {
      name: "infera_router_tokenize_jobs_total",
      type: "counter",
      help: "Long prompts sent to tokenizer threads, by outcome (ok, timeout, queue_full, error)",
      labels: ["outcome"],
    },
    {
      name: "infera_router_tokenize_queue",
      type: "gauge",
      help: "Prompts waiting for or on tokenizer threads",
      labels: [],
    },
    {
      name: "infera_router_tokenizer_piece_cache_hit_ratio",
      type: "gauge",
      help: "Share of prompt tokens served from the piece cache since start (event loop and threads)",
      labels: [],
    },
    {
      name: "infera_router_tokenizer_piece_cache_chars",
      type: "gauge",
      help: "Characters of prompt pieces held in the piece caches (bounded per cache)",
      labels: [],
    },
    {
      name: "infera_router_admission_waiting",
      type: "gauge",
      help: "Requests waiting at the router for a prefill slot, per priority band (--objectives)",
      labels: ["priority"],
    },
    {
      name: "infera_router_worker_kv_capacity_blocks",
      type: "gauge",
      help: "KV cache capacity per worker in router blocks (engine /metrics or --kv-capacity-blocks); absent = unknown",
      labels: WORKER,
    },
    {
      name: "infera_router_worker_kv_usage_ratio",
      type: "gauge",
      help: "Share of the worker's KV cache held by running requests (vllm:kv_cache_usage_perc, sglang:token_usage), last scrape",
      labels: WORKER,
    },
    {
      name: "infera_router_worker_engine_waiting_requests",
      type: "gauge",
      help: "Requests queued in the worker's engine (vllm:num_requests_waiting, sglang:num_queue_reqs), last scrape",
      labels: WORKER,
    },
    {
      name: "infera_router_worker_saturated",
      type: "gauge",
      help: "1 while the worker's engine reports waiting >= --saturation-queue-depth or KV usage >= --saturation-kv-usage (cold prompts wait at the router), else 0; absent with both off",
      labels: WORKER,
    },
    {
      name: "infera_router_failovers_total",
      type: "counter",
      help: "Requests sent to the pick's second choice after the first refused the connection (nginx)",
      labels: [],
      njs: true,
      njsOnly: true,
    },
    {
      name: "infera_router_mirror_unswept_blocks",
      type: "gauge",
      help: "Engine blocks of cleared worker mirrors still in nginx's shared dicts: out of every pick, they take zone room until pushes sweep them, a step each",
      labels: [],
      njs: true,
      njsOnly: true,
    },
    {
      name: "infera_router_pd_paths_total",
      type: "counter",
      help: "PD requests by the path --pd-decider chose: decode-first (no prefill hop) or prefill",
      labels: ["path"],
    },
    {
      name: "infera_router_token_id_requests_total",
      type: "counter",
      help: "Requests routed with --send-token-ids exact, by what the worker got: ids, text_not_exact (its render parity is not exact), text_ineligible (a request ids cannot serve: tools, logprobs, media, PD ...)",
      labels: ["outcome"],
      njs: true,
    },
    {
      name: "infera_router_flow_queued_bytes",
      type: "gauge",
      help: "Request body bytes waiting at the router (--queue-max-bytes)",
      labels: [],
    },
    {
      name: "infera_router_flow_wait_seconds",
      type: "histogram",
      help: "Time a request waited at the router for a prefill slot, per priority band and how the wait ended: dispatched, forced, expired, evicted, cancelled",
      labels: ["priority", "outcome"],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    },
    {
      name: "infera_router_decision_seconds",
      type: "histogram",
      help: "Time from the ext_proc message that completes a request (its body, or its headers when none follows) to the routing answer, per outcome: routed (any wait for a prefill slot included), shed (429 before any wait), queue_full, evicted, expired, and the other outcomes of infera_router_requests_total",
      labels: ["outcome"],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    },
    {
      name: "infera_router_flow_refused_total",
      type: "counter",
      help: "Requests flow control refused with 429, per priority band and reason: saturated (sheddable, its worker busy), queue_full, evicted (a higher band took its place)",
      labels: ["priority", "reason"],
    },
    {
      name: "infera_router_flow_expired_total",
      type: "counter",
      help: "Requests that waited out --queue-ttl-ms (or their SLO TTFT) in the router's queue and got 503, per priority band",
      labels: ["priority"],
    },
    {
      name: "infera_router_render_parity",
      type: "gauge",
      help: "1 for each worker's render-parity status (exact | diverged | unchecked) from the tokenize probe",
      labels: ["worker", "status"],
    },
    {
      name: "infera_router_ext_proc_refused_streams_total",
      type: "counter",
      help: "ext_proc streams refused: not_gateway (client certificate not in --ext-proc-client-identities), buffer_cap (over a buffered-bytes cap)",
      labels: ["reason"],
    },
    {
      name: "infera_router_ext_proc_buffered_bytes",
      type: "gauge",
      help: "Request bytes the ext_proc server holds now (messages being received, bodies before their pick); capped by --ext-proc-max-buffered-bytes",
      labels: [],
    },
    // With --replica-sync nats only (runtime/replicas.ts).
    {
      name: "infera_router_replica_peers",
      type: "gauge",
      help: "Other router replicas heard from within --replica-ttl-ms",
      labels: [],
    },
    {
      name: "infera_router_replica_remote_guards",
      type: "gauge",
      help: "In-flight load entries booked by other replicas; applied = counted in this replica's scores, unknown_worker = for a worker this replica does not know (yet)",
      labels: ["state"],
    },
    {
      name: "infera_router_replica_local_guards",
      type: "gauge",
      help: "In-flight load entries this replica booked and shares",
      labels: [],
    },
    {
      name: "infera_router_replica_messages_total",
      type: "counter",
      help: "Replica load-sync messages (kind: ops, heartbeat, bye)",
      labels: ["direction", "kind"],
    },
    {
      name: "infera_router_replica_publish_errors_total",
      type: "counter",
      help: "Load-sync messages NATS refused (disconnected, over max_payload); the next heartbeat resends the state",
      labels: [],
    },
    {
      name: "infera_router_replica_expired_total",
      type: "counter",
      help: "Replicas dropped after --replica-ttl-ms of silence (their load with them)",
      labels: [],
    },
    {
      name: "infera_router_replica_dropped_total",
      type: "counter",
      help: "Remote load entries dropped: expired (replica silent), bye (replica left), resync (absent from its heartbeat), bad (malformed message)",
      labels: ["reason"],
    },
    {
      name: "infera_router_replica_sync_lag_seconds",
      type: "histogram",
      help: "From a peer publishing a load change to it being applied here (wall clocks: exact on one host)",
      labels: [],
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5],
    },
    // The bridge that feeds nginx (njs/bridge.ts), on its own admin port.
    {
      name: "infera_bridge_tokenize_requests_total",
      type: "counter",
      help: "Prompts nginx sent to the tokenizer helper, by result (ok, refused, error)",
      labels: ["result"],
      bridge: true,
    },
    {
      name: "infera_bridge_pushes_total",
      type: "counter",
      help: "Pushes to nginx by result",
      labels: ["type", "result"],
      bridge: true,
    },
    {
      name: "infera_bridge_resyncs_total",
      type: "counter",
      help: "Full resyncs of nginx's state (fleet + mirrors)",
      labels: [],
      bridge: true,
    },
    {
      name: "infera_bridge_queue_overflows_total",
      type: "counter",
      help: "Times the queue passed --bridge-queue-max and was replaced by a resync",
      labels: [],
      bridge: true,
    },
    { name: "infera_bridge_queue_depth", type: "gauge", help: "Pushes waiting", labels: [], bridge: true },
    {
      name: "infera_bridge_nginx_dirty",
      type: "gauge",
      help: "1 while nginx may be missing state (a resync is pending)",
      labels: [],
      bridge: true,
    },
    {
      name: "infera_bridge_shadow_blocks",
      type: "gauge",
      help: "Resident blocks per worker as the bridge last saw them",
      labels: ["worker"],
      bridge: true,
    },
    {
      name: "infera_bridge_kv_event_errors_total",
      type: "counter",
      help: "KV event frames refused (malformed) or transport failures, per worker",
      labels: ["worker", "reason"],
      bridge: true,
    },
  ];
}

/** The table's entry for a metric; an unknown name is a programming error. */
export function metricSpec(name: string): MetricSpec {
  const t = metricTable();
  for (let i = 0; i < t.length; i++) if (t[i].name === name) return t[i];
  throw new Error("metric " + name + " is not in core/metric-table.ts");
}

/** The exposition's "# HELP" and "# TYPE" lines of one metric. */
export function metricHeader(name: string): string[] {
  const m = metricSpec(name);
  return ["# HELP " + m.name + " " + m.help, "# TYPE " + m.name + " " + m.type];
}

/** The metric list of docs/configuration.md (Markdown), one row per metric. */
export function metricTableMarkdown(): string {
  const rows = ["| Metric | Type | Labels | Exported by | Meaning |", "|---|---|---|---|---|"];
  const t = metricTable();
  for (let i = 0; i < t.length; i++) {
    const m = t[i];
    rows.push(
      "| `" +
        m.name +
        "` | " +
        m.type +
        " | " +
        m.labels.join(", ") +
        " | " +
        (m.bridge ? "bridge" : m.njsOnly ? "njs" : m.njs ? "router, njs" : "router") +
        " | " +
        m.help.replace(/\|/g, "\\|") +
        (m.buckets ? " (buckets " + m.buckets.join(", ") + ")" : "") +
        " |",
    );
  }
  return rows.join("\n") + "\n";
}
