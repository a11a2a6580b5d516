import * as client from "prom-client";
import { monitorEventLoopDelay } from "perf_hooks";
import { Router, Worker } from "../core/router";

export type Metrics = ReturnType<typeof createMetrics>;

/** What the KV-event gauges read at scrape time (the app's per-worker event status). */
export type EventStatus = (id: string) => { kv_event_age_s: number | null; kv_events_silent: boolean };

/**
 * How the router answered a request's routing question (infera_router_requests_total{outcome}):
 * routed (a pick went to the gateway), bad_request (4xx: malformed body, path not served),
 * too_large (413), shed (429, --epp-shed-active-blocks), no_worker (503: nothing routable),
 * overloaded (503: the tokenizer queue was full or the wait ran out), client_closed (499: the
 * stream ended while the pick was being computed) and error (5xx: a misconfigured gateway or a fault).
 */
export const REQUEST_OUTCOMES = [
  "routed",
  "bad_request",
  "too_large",
  "shed",
  "no_worker",
  "overloaded",
  "client_closed",
  "error",
] as const;
export type RequestOutcome = (typeof REQUEST_OUTCOMES)[number];

/** Out of every pool for a configuration fault: excluded by the router, or a declared block size not the router's. */
function excludedNow(r: Router, w: Worker): boolean {
  return r.excluded(w.id) !== null || (w.blockSize !== undefined && w.blockSize !== r.config.blockSize);
}

/** probed: whether a worker passed a health probe since it joined (always true with health checks off). */
export function createMetrics(
  router: () => Router,
  tokenizerCache?: () => { hitTokens: number; missTokens: number; pieces: number; chars: number } | null,
  eventStatus?: EventStatus,
  probed?: (id: string) => boolean,
) {
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry });
  /** A gauge with one series per worker, read from the router at scrape time (so it never drifts); null = no series. */
  const perWorker = (name: string, help: string, value: (w: Worker, r: Router) => number | null, label = "worker") =>
    new client.Gauge({
      name,
      help,
      labelNames: [label],
      registers: [registry],
      collect() {
        this.reset();
        const r = router();
        for (const w of r.workers()) {
          const v = value(w, r);
          if (v !== null) this.set({ [label]: w.id }, v);
        }
      },
    });
  const picks = new client.Counter({
    name: "infera_router_picks_total",
    help: "Picks per worker and role",
    labelNames: ["worker", "role", "policy"],
    registers: [registry],
  });
  const hitBlocks = new client.Counter({
    name: "infera_router_cache_hit_blocks_total",
    help: "Prompt blocks already cached on the picked worker",
    labelNames: ["worker", "role"],
    registers: [registry],
  });
  const reqBlocks = new client.Counter({
    name: "infera_router_request_blocks_total",
    help: "Prompt blocks of routed requests",
    labelNames: ["role"],
    registers: [registry],
  });
  const pickLatency = new client.Histogram({
    name: "infera_router_pick_latency_seconds",
    help: "Parse + tokenize + hash + score time per request",
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
    registers: [registry],
  });
  const events = new client.Counter({
    name: "infera_router_kv_events_total",
    help: "KV events applied",
    labelNames: ["worker", "type"],
    registers: [registry],
  });
  const eventErrors = new client.Counter({
    name: "infera_router_kv_event_errors_total",
    help: "KV event frames refused or resyncs",
    labelNames: ["worker", "reason"],
    registers: [registry],
  });
  const admissionWait = new client.Histogram({
    name: "infera_router_prefill_admission_wait_seconds",
    help: "Time cold requests waited at the router for a prefill slot on their worker (--prefill-admission-slots)",
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [registry],
  });
  const admissionForced = new client.Counter({
    name: "infera_router_prefill_admission_forced_total",
    help: "Requests sent past the slot limit because they waited --prefill-admission-max-wait-ms",
    registers: [registry],
  });
  const ttftPredictionError = new client.Histogram({
    name: "infera_router_ttft_prediction_error_ratio",
    help: "|predicted - observed| / observed time to first token, per worker, for requests the speed model had learned enough to predict (sum/count = MAPE)",
    labelNames: ["worker"],
    buckets: [0.05, 0.1, 0.15, 0.25, 0.5, 1, 2, 5],
    registers: [registry],
  });
  new client.Gauge({
    name: "infera_router_worker_slowness",
    help: "Time per unit of work against the fleet median, as the cost uses it (1 = typical or not learned yet; --speed-learning)",
    labelNames: ["worker"],
    registers: [registry],
    collect() {
      this.reset();
      const r = router();
      if (!r.latency) return;
      const ws = r.workers();
      const s = r.latency.slowness(ws.map((w) => w.epochKey));
      for (const w of ws) this.set({ worker: w.id }, s[w.epochKey] ?? 1);
    },
  });
  perWorker(
    "infera_router_worker_prefill_ms_per_token",
    "Learned prefill milliseconds per prompt token (absent until learned; --speed-learning)",
    (w, r) => (r.latency ? r.latency.msPerToken(w.epochKey) : null),
  );
  const shed = new client.Counter({
    name: "infera_router_shed_total",
    help: "Sheddable requests (negative priority, --objectives) refused with 429 because their worker had no free prefill slot",
    labelNames: ["priority"],
    registers: [registry],
  });
  const badRequests = new client.Counter({
    name: "infera_router_bad_requests_total",
    help: "Requests refused with 4xx",
    labelNames: ["status"],
    registers: [registry],
  });
  const requests = new client.Counter({
    name: "infera_router_requests_total",
    help: "Requests the router answered, by outcome: routed, bad_request, too_large, shed, no_worker, overloaded, client_closed, error",
    labelNames: ["outcome"],
    registers: [registry],
  });
  // Every outcome exists from the start at 0, so rate() and alerts see the first one.
  for (const o of REQUEST_OUTCOMES) requests.inc({ outcome: o }, 0);
  // Read at scrape time from the router's own health state, like the gauges below.
  new client.Gauge({
    name: "infera_router_worker_up",
    help: "1 when the worker can take picks (healthy, not excluded, through a health probe since it joined when checks are on), else 0",
    labelNames: ["worker", "role"],
    registers: [registry],
    collect() {
      this.reset();
      const r = router();
      for (const w of r.workers())
        this.set(
          { worker: w.id, role: w.role },
          !excludedNow(r, w) && r.healthy(w.id) && (!probed || probed(w.id)) ? 1 : 0,
        );
    },
  });
  perWorker(
    "infera_router_worker_excluded",
    "1 when the router keeps the worker out of every pool for a configuration fault (e.g. block size mismatch; reason in /v1/admin/workers), else 0",
    (w, r) => (excludedNow(r, w) ? 1 : 0),
  );
  const eppFallbacks = new client.Counter({
    name: "infera_router_epp_served_elsewhere_total",
    help: "Responses the gateway reports served from an endpoint other than the pick (known: a worker we track)",
    labelNames: ["known"],
    registers: [registry],
  });
  const decisions = new client.Counter({
    name: "infera_router_decode_demand_decisions_total",
    help: "Decode input-demand decisions; agrees=whether the demand suggestion matched the original choice",
    labelNames: ["mode", "input", "agrees"],
    registers: [registry],
  });
  const pdPaths = new client.Counter({
    name: "infera_router_pd_paths_total",
    help: "PD requests by the path --pd-decider chose: decode-first (no prefill hop) or prefill",
    labelNames: ["path"],
    registers: [registry],
  });
  // Gauges read the router at scrape time, so they can never drift from the truth.
  perWorker(
    "infera_router_decode_demand_tokens",
    "In-flight input tokens booked on each decode target",
    (w, r) => (w.role !== "prefill" ? r.demand(w.id).tokens : null),
    "target",
  );
  perWorker(
    "infera_router_decode_demand_requests",
    "Requests held on each decode target",
    (w, r) => (w.role !== "prefill" ? r.demand(w.id).requests : null),
    "target",
  );
  perWorker("infera_router_active_blocks", "Distinct in-flight prompt blocks per worker", (w, r) =>
    r.activeBlocks(w.id),
  );
  perWorker(
    "infera_router_mirror_blocks",
    "Blocks mirrored from each worker's KV events",
    (w, r) => r.cacheView(w.id)?.block_count ?? 0,
  );
  perWorker(
    "infera_router_kv_event_age_seconds",
    "Seconds since each worker's last KV event batch (since it joined, if none yet)",
    (w) => (eventStatus && w.events ? eventStatus(w.id).kv_event_age_s : null),
  );
  perWorker(
    "infera_router_kv_events_silent",
    "1 when a worker with a KV events endpoint sent nothing for --kv-event-silence-s while serving picks",
    (w) => (eventStatus && w.events ? (eventStatus(w.id).kv_events_silent ? 1 : 0) : null),
  );
  new client.Gauge({
    name: "infera_router_mirror_tier_blocks",
    help: "Blocks mirrored per worker and storage tier (medium)",
    labelNames: ["worker", "tier"],
    registers: [registry],
    collect() {
      this.reset();
      for (const w of router().workers()) {
        const t = router().cacheView(w.id)?.tiers ?? {};
        for (const k of Object.keys(t)) this.set({ worker: w.id, tier: k }, t[k]);
      }
    },
  });
  new client.Gauge({
    name: "infera_router_workers",
    help: "Workers known to the router (excluded ones included)",
    registers: [registry],
    collect() {
      this.set(router().workers().length);
    },
  });
  new client.Gauge({
    name: "infera_router_tokenizer_piece_cache_tokens",
    help: "Prompt tokens served from the tokenizer's piece cache (hit) or encoded afresh (miss), since start",
    labelNames: ["result"],
    registers: [registry],
    collect() {
      const s = tokenizerCache ? tokenizerCache() : null;
      if (!s) return;
      this.set({ result: "hit" }, s.hitTokens);
      this.set({ result: "miss" }, s.missTokens);
    },
  });
  // Event-loop delay sampled every 10 ms; each scrape reports the window since the last one.
  const lag = monitorEventLoopDelay({ resolution: 10 });
  lag.enable();
  new client.Gauge({
    name: "infera_router_event_loop_lag_seconds",
    help: "Event-loop delay since the previous scrape (max, p99, mean): how long picks and KV events waited behind other work",
    labelNames: ["stat"],
    registers: [registry],
    collect() {
      // An empty window (no sample yet) reads as zero delay rather than the histogram's sentinels.
      const has = lag.count > 0;
      this.set({ stat: "max" }, has ? lag.max / 1e9 : 0);
      this.set({ stat: "p99" }, has ? lag.percentile(99) / 1e9 : 0);
      this.set({ stat: "mean" }, has ? lag.mean / 1e9 : 0);
      lag.reset();
    },
  });
  const tokenizeJobs = new client.Counter({
    name: "infera_router_tokenize_jobs_total",
    help: "Long prompts sent to tokenizer threads, by outcome (ok, timeout, queue_full, error)",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const tokenizeQueue = new client.Gauge({
    name: "infera_router_tokenize_queue",
    help: "Prompts waiting for or on tokenizer threads",
    registers: [registry],
  });
  new client.Gauge({
    name: "infera_router_tokenizer_piece_cache_hit_ratio",
    help: "Share of prompt tokens served from the piece cache since start (event loop and threads)",
    registers: [registry],
    collect() {
      const s = tokenizerCache ? tokenizerCache() : null;
      if (s && s.hitTokens + s.missTokens > 0) this.set(s.hitTokens / (s.hitTokens + s.missTokens));
    },
  });
  new client.Gauge({
    name: "infera_router_tokenizer_piece_cache_chars",
    help: "Characters of prompt pieces held in the piece caches (bounded per cache)",
    registers: [registry],
    collect() {
      const s = tokenizerCache ? tokenizerCache() : null;
      if (s) this.set(s.chars);
    },
  });
  return {
    registry,
    tokenizeJobs,
    tokenizeQueue,
    picks,
    hitBlocks,
    reqBlocks,
    pickLatency,
    events,
    eventErrors,
    badRequests,
    requests,
    decisions,
    pdPaths,
    eppFallbacks,
    admissionWait,
    admissionForced,
    ttftPredictionError,
    shed,
  };
}
