import * as client from "prom-client";
import { monitorEventLoopDelay, performance } from "perf_hooks";
import { Router, Worker } from "../core/router";
import { metricSpec } from "../core/metric-table";
import { setPluginTimer } from "../core/scheduling/framework";
import { FastChild, FastHistogram } from "./fast-histogram";
import { FastCounter } from "./fast-counter";

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

/** prom-client's configuration of a metric of core/metric-table.ts: name, help, labels, buckets. */
export function spec(name: string): { name: string; help: string; labelNames: string[]; buckets?: number[] } {
  const m = metricSpec(name);
  return m.buckets
    ? { name: m.name, help: m.help, labelNames: m.labels, buckets: m.buckets }
    : { name: m.name, help: m.help, labelNames: m.labels };
}

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
  /**
   * A gauge with one series per worker, read from the router at scrape time (so it never drifts); null = no series.
   * Its one label (worker, or target) comes from the table.
   */
  const perWorker = (name: string, value: (w: Worker, r: Router) => number | null) => {
    const label = metricSpec(name).labels[0];
    return new client.Gauge({
      ...spec(name),
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
  };
  const picks = new FastCounter(spec("infera_router_picks_total"), registry);
  const hitBlocks = new FastCounter(spec("infera_router_cache_hit_blocks_total"), registry);
  const reqBlocks = new FastCounter(spec("infera_router_request_blocks_total"), registry);
  const pickLatency = new FastHistogram(spec("infera_router_pick_latency_seconds"), registry);
  // Each plugin run of the scheduling pipeline, timed by core through this
  // process-wide timer (the last registry created gets them). Label children
  // are bound once so a run costs two clock reads and a bucket increment
  // (runtim./fast-histogram.ts: prom-client's observe re-checks the labels every time).
  const pluginDuration = new FastHistogram(spec("infera_router_plugin_duration_seconds"), registry);
  const pluginChildren: Record<string, Record<string, FastChild>> = {};
  setPluginTimer({
    now: () => performance.now(),
    observe(kind, plugin, seconds) {
      const byName = pluginChildren[kind] ?? (pluginChildren[kind] = {});
      const h = byName[plugin] ?? (byName[plugin] = pluginDuration.labels({ plugin, kind }));
      h.observe(seconds);
    },
  });
  const events = new client.Counter({
    ...spec("infera_router_kv_events_total"),
    registers: [registry],
  });
  const eventErrors = new client.Counter({
    ...spec("infera_router_kv_event_errors_total"),
    registers: [registry],
  });
  const admissionWait = new client.Histogram({
    ...spec("infera_router_prefill_admission_wait_seconds"),
    registers: [registry],
  });
  const admissionForced = new client.Counter({
    ...spec("infera_router_prefill_admission_forced_total"),
    registers: [registry],
  });
  const ttftPredictionError = new FastHistogram(spec("infera_router_ttft_prediction_error_ratio"), registry);
  new client.Gauge({
    ...spec("infera_router_worker_slowness"),
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
  perWorker("infera_router_worker_prefill_ms_per_token", (w, r) =>
    r.latency ? r.latency.msPerToken(w.epochKey) : null,
  );
  const shed = new client.Counter({
    ...spec("infera_router_shed_total"),
    registers: [registry],
  });
  const badRequests = new client.Counter({
    ...spec("infera_router_bad_requests_total"),
    registers: [registry],
  });
  const requests = new FastCounter(spec("infera_router_requests_total"), registry);
  // Every outcome exists from the start at 0, so rate() and alerts see the first one.
  for (const o of REQUEST_OUTCOMES) requests.inc({ outcome: o }, 0);
  // Read at scrape time from the router's own health state, like the gauges below.
  new client.Gauge({
    ...spec("infera_router_worker_up"),
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
  perWorker("infera_router_worker_excluded", (w, r) => (excludedNow(r, w) ? 1 : 0));
  const eppFallbacks = new client.Counter({
    ...spec("infera_router_epp_served_elsewhere_total"),
    registers: [registry],
  });
  const decisions = new client.Counter({
    ...spec("infera_router_decode_demand_decisions_total"),
    registers: [registry],
  });
  const pdPaths = new client.Counter({
    ...spec("infera_router_pd_paths_total"),
    registers: [registry],
  });
  const tokenIds = new client.Counter({
    ...spec("infera_router_token_id_requests_total"),
    registers: [registry],
  });
  // Gauges read the router at scrape time, so they can never drift from the truth.
  perWorker("infera_router_decode_demand_tokens", (w, r) => (w.role !== "prefill" ? r.demand(w.id).tokens : null));
  perWorker("infera_router_decode_demand_requests", (w, r) => (w.role !== "prefill" ? r.demand(w.id).requests : null));
  perWorker("infera_router_active_blocks", (w, r) => r.activeBlocks(w.id));
  perWorker("infera_router_mirror_blocks", (w, r) => r.cacheView(w.id)?.block_count ?? 0);
  perWorker("infera_router_kv_event_age_seconds", (w) =>
    eventStatus && w.events ? eventStatus(w.id).kv_event_age_s : null,
  );
  perWorker("infera_router_kv_events_silent", (w) =>
    eventStatus && w.events ? (eventStatus(w.id).kv_events_silent ? 1 : 0) : null,
  );
  new client.Gauge({
    ...spec("infera_router_mirror_tier_blocks"),
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
    ...spec("infera_router_workers"),
    registers: [registry],
    collect() {
      this.set(router().workers().length);
    },
  });
  new client.Gauge({
    ...spec("infera_router_tokenizer_piece_cache_tokens"),
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
    ...spec("infera_router_event_loop_lag_seconds"),
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
    ...spec("infera_router_tokenize_jobs_total"),
    registers: [registry],
  });
  const tokenizeQueue = new client.Gauge({
    ...spec("infera_router_tokenize_queue"),
    registers: [registry],
  });
  new client.Gauge({
    ...spec("infera_router_tokenizer_piece_cache_hit_ratio"),
    registers: [registry],
    collect() {
      const s = tokenizerCache ? tokenizerCache() : null;
      if (s && s.hitTokens + s.missTokens > 0) this.set(s.hitTokens / (s.hitTokens + s.missTokens));
    },
  });
  new client.Gauge({
    ...spec("infera_router_tokenizer_piece_cache_chars"),
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
    tokenIds,
    eppFallbacks,
    admissionWait,
    admissionForced,
    ttftPredictionError,
    shed,
  };
}
