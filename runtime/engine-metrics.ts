// Engine metrics: one GET of each worker's own Prometheus page (/metrics)
// every --engine-metrics-interval-ms (default 1000; 0 = off), whose text feeds
// everything the router reads from it:
// - the router state's engine readings (core/engine-readings.ts): KV capacity
//   and headroom, which the data stage puts on every candidate's Row.data
//   (capacityBlocks, kvUsage, waitingRequests) for the scorers (kv-capacity.ts);
// - the LoRA table (core/lora.ts parseLoraInfo: vllm:lora_requests_info), which
//   the lora-slots filter and lora-affinity scorer read;
// - flow control's saturation (runtime/saturation.ts): a worker over
//   --saturation-queue-depth or --saturation-kv-usage holds its cold prompts at
//   the router until a scrape finds headroom again.
// One page per worker per round, never two rounds at once, each bounded by a
// timeout: an engine is not asked the same thing twice.
//
// What is read, by engine (the names llm-d's endpoint picker scrapes by default):
//   vLLM:   vllm:cache_config_info, an info gauge whose labels are the engine's
//           CacheConfig fields; num_gpu_blocks x block_size is the capacity in
//           tokens (num_gpu_blocks is "None" until profiling ends: no capacity
//           yet). vllm:kv_cache_usage_perc (0..1), vllm:num_requests_waiting,
//           vllm:num_requests_running, vllm:lora_requests_info.
//   SGLang: sglang:max_total_num_tokens (the KV pool's capacity in tokens), else
//           sglang:cache_config_info{num_pages,page_size} or the gauges
//           sglang:num_pages x sglang:page_size; sglang:token_usage (0..1),
//           sglang:num_queue_reqs, sglang:num_running_reqs. Newer SGLang writes
//           the same names with "sglang_" for "sglang:"; both are read.
// Capacity in tokens becomes blocks of the router's --block-size (what the
// mirror counts). --kv-capacity-blocks id=N,... (or *=N) overrides a worker's
// capacity, for engines that do not report it or report it wrong.
//
// An engine serving several data-parallel ranks behind one address labels its
// series engine="<rank>": a DP target (core/fleet.ts expandDp) reads its own
// rank's series. Several series otherwise (SGLang's tp_rank copies) read as
// their largest value. An address is fetched once per round, whatever the
// number of DP targets behind it. A failed scrape clears the headroom figures
// (usage, queue) and keeps the capacity, which does not change while the
// worker stays; it clears the worker's LoRA state too (the LoRA plugins then
// treat it as unknown rather than as full or loaded), and counts as headroom
// for saturation.
import { LogHook } from "../core/log";
import { spec } from "./metrics";
import * as client from "prom-client";
import { nextReading } from "../core/engine-readings";
import type { EngineReading, EngineReadings } from "../core/engine-readings";
import type { Router, Worker } from "../core/router";
import { LoraState, LoraTable, parseLoraInfo } from "../core/lora";
import type { SaturationFeed } from "./saturation";
import { engineIdOf } from "../core/fleet";

export interface Sample {
  name: string;
  labels: { [k: string]: string };
  value: number;
}

/** The series readEngineFigures reads (either SGLang spelling); a page's other lines are skipped unparsed. */
const WANTED = new Set([
  "vllm:cache_config_info",
  "vllm:kv_cache_usage_perc",
  "vllm:gpu_cache_usage_perc",
  "vllm:num_requests_waiting",
  "vllm:num_requests_running",
  "sglang:max_total_num_tokens",
  "sglang:cache_config_info",
  "sglang:num_pages",
  "sglang:page_size",
  "sglang:token_usage",
  "sglang:num_queue_reqs",
  "sglang:num_running_reqs",
]);
export const engineSeries = (name: string) => WANTED.has(name.startsWith("sglang_") ? "sglang:" + name.slice(7) : name);

/**
 * Prometheus text exposition format, samples only (comments and malformed
 * lines skipped); with want, only the series it accepts (an engine's page is
 * mostly histogram buckets nobody here reads).
 */
export function parsePrometheusText(text: string, want?: (name: string) => boolean): Sample[] {
  const out: Sample[] = [];
  lines: for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line[0] === "#") continue;
    let i = 0;
    while (i < line.length && line[i] !== "{" && line[i] !== " " && line[i] !== "\t") i++;
    const name = line.slice(0, i);
    if (want && !want(name)) continue;
    const labels: { [k: string]: string } = {};
    if (line[i] === "{") {
      i++;
      for (;;) {
        while (line[i] === " " || line[i] === ",") i++;
        if (i >= line.length || line[i] === "}") break;
        const eq = line.indexOf("=", i);
        if (eq < 0 || line[eq + 1] !== '"') continue lines;
        const key = line.slice(i, eq).trim();
        let j = eq + 2;
        let v = "";
        while (j < line.length && line[j] !== '"') {
          // Escapes in label values: \\, \" and \n.
          if (line[j] === "\\" && j + 1 < line.length) {
            const c = line[j + 1];
            v += c === "n" ? "\n" : c;
            j += 2;
          } else v += line[j++];
        }
        labels[key] = v;
        i = j + 1;
      }
      i++;
    }
    const rest = line.slice(i).trim().split(/\s+/);
    const value = Number(rest[0]);
    if (!name || rest[0] === undefined || rest[0] === "" || Number.isNaN(value)) continue;
    out.push({ name, labels, value });
  }
  return out;
}

export interface EngineFigures {
  engine: "vllm" | "sglang" | null;
  /** KV capacity in tokens; null = not reported (or not yet: vLLM before profiling). */
  capacityTokens: number | null;
  kvUsage: number | null;
  waitingRequests: number | null;
  runningRequests: number | null;
}

/** The figures in one /metrics page; dpRank picks the engine="<rank>" series when the page has them. */
export function readEngineFigures(samples: Sample[], dpRank?: number): EngineFigures {
  const byName: { [n: string]: Sample[] } = {};
  for (const s of samples) {
    const n = s.name.startsWith("sglang_") ? "sglang:" + s.name.slice(7) : s.name;
    (byName[n] = byName[n] || []).push(s);
  }
  const series = (n: string): Sample[] => {
    const all = byName[n] || [];
    if (dpRank === undefined) return all;
    const mine = all.filter((s) => s.labels.engine === String(dpRank) || s.labels.dp_rank === String(dpRank));
    return mine.length ? mine : all;
  };
  const max = (n: string): number | null => {
    const xs = series(n).filter((s) => Number.isFinite(s.value));
    return xs.length ? Math.max(...xs.map((s) => s.value)) : null;
  };
  const positive = (x: number): number | null => (Number.isFinite(x) && x > 0 ? x : null);
  const vllm = Object.keys(byName).some((n) => n.startsWith("vllm:"));
  const sglang = Object.keys(byName).some((n) => n.startsWith("sglang:"));
  if (vllm) {
    let cap: number | null = null;
    for (const s of series("vllm:cache_config_info")) {
      const c = positive(Number(s.labels.num_gpu_blocks) * Number(s.labels.block_size));
      if (c !== null && (cap === null || c > cap)) cap = c;
    }
    const usage = max("vllm:kv_cache_usage_perc") ?? max("vllm:gpu_cache_usage_perc");
    return {
      engine: "vllm",
      capacityTokens: cap,
      kvUsage: usage === null ? null : Math.min(1, Math.max(0, usage)),
      waitingRequests: max("vllm:num_requests_waiting"),
      runningRequests: max("vllm:num_requests_running"),
    };
  }
  if (sglang) {
    let cap = positive(max("sglang:max_total_num_tokens") ?? NaN);
    if (cap === null)
      for (const s of series("sglang:cache_config_info")) {
        const c = positive(Number(s.labels.num_pages) * Number(s.labels.page_size));
        if (c !== null && (cap === null || c > cap)) cap = c;
      }
    if (cap === null) cap = positive((max("sglang:num_pages") ?? NaN) * (max("sglang:page_size") ?? NaN));
    const usage = max("sglang:token_usage");
    return {
      engine: "sglang",
      capacityTokens: cap,
      kvUsage: usage === null ? null : Math.min(1, Math.max(0, usage)),
      waitingRequests: max("sglang:num_queue_reqs"),
      runningRequests: max("sglang:num_running_reqs"),
    };
  }
  return { engine: null, capacityTokens: null, kvUsage: null, waitingRequests: null, runningRequests: null };
}

/** What one worker's /metrics page says: its engine figures (its DP rank's series) and, when asked for, its LoRA state. */
export interface PageRead {
  figures: EngineFigures;
  lora: LoraState | null;
}

/**
 * One scrape round: each address's /metrics fetched once, concurrently, each
 * within timeoutMs, its text parsed once, and read for every worker behind it
 * (the router's engine-metrics, and the bridge, which pushes what it read to
 * nginx). each(w, null, why, …) for a worker whose page could not be read;
 * now is when its page arrived.
 */
export async function scrapeRound<W extends { address: string; dpRank?: number }>(
  workers: W[],
  timeoutMs: number,
  lora: boolean,
  each: (w: W, read: PageRead | null, why: string, url: string, now: number) => void,
): Promise<void> {
  const byAddress: { [a: string]: W[] } = {};
  for (const w of workers) (byAddress[w.address] = byAddress[w.address] || []).push(w);
  await Promise.all(
    Object.keys(byAddress).map(async (addr) => {
      const url = `http://${addr}/metrics`;
      let text: string | null = null;
      let why = "";
      try {
        const r = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
        if (r.ok) text = await r.text();
        else {
          why = `HTTP ${r.status}`;
          await r.arrayBuffer().catch(() => undefined);
        }
      } catch (e) {
        why = (e as Error).message;
      }
      // The one page feeds every reader: engine figures, LoRA state, saturation.
      const samples = text === null ? null : parsePrometheusText(text, engineSeries);
      const loraState = text === null || !lora ? null : parseLoraInfo(text);
      const now = Date.now();
      for (const w of byAddress[addr])
        each(w, samples ? { figures: readEngineFigures(samples, w.dpRank), lora: loraState } : null, why, url, now);
    }),
  );
}

export interface EngineMetricsOptions {
  /** 0 = no scraping (capacity overrides still apply). */
  intervalMs: number;
  timeoutMs: number;
  /** The router's block size: capacities are kept in its blocks. */
  blockSize: number;
  /** --kv-capacity-blocks: worker id (or "*") -> blocks. */
  capacityOverride: { [id: string]: number };
  log: LogHook;
  /** The LoRA table each page's vllm:lora_requests_info feeds (none: LoRA state is not read). */
  lora?: LoraTable;
  /** Flow control's saturation, fed each worker's reading after every scrape. */
  saturation?: SaturationFeed;
}

/** Scrapes every worker's /metrics each interval into router.state.engine. */
export class EngineMetrics {
  private timer: NodeJS.Timeout | null = null;
  private inFlight = false;
  /** Workers whose last scrape failed (logged once until one succeeds). */
  private failing: { [id: string]: boolean } = {};

  constructor(
    private router: () => Router,
    readonly o: EngineMetricsOptions,
  ) {}

  private get readings(): EngineReadings {
    return this.router().state.engine!;
  }

  get running(): boolean {
    return this.timer !== null;
  }

  /** The override for a worker (its DP targets share the engine's id before the /dp suffix), or null. */
  private override(w: Worker): number | null {
    const o = this.o.capacityOverride;
    const base = engineIdOf(w.id);
    const v = o[w.id] ?? o[base] ?? o["*"];
    return v !== undefined && v > 0 ? v : null;
  }

  /** Writes a worker's reading from what its page said (null: the scrape failed or is off). */
  apply(w: Worker, f: EngineFigures | null, now: number): void {
    const prev = this.readings.get(w.epochKey);
    const scraped = f && f.capacityTokens !== null ? Math.floor(f.capacityTokens / this.o.blockSize) : null;
    this.readings.set(w.epochKey, nextReading(prev, this.override(w) ?? scraped, f, now));
  }

  /** One round: every worker's address fetched once, concurrently. */
  async scrapeAll(): Promise<void> {
    await scrapeRound(this.router().workers(), this.o.timeoutMs, !!this.o.lora, (w, read, why, url, now) => {
      // The worker may have been replaced while the page was in flight.
      const cur = this.router().worker(w.id);
      if (!cur || cur.epochKey !== w.epochKey) return;
      this.apply(w, read ? read.figures : null, now);
      if (this.o.lora) this.o.lora.set(w.id, read ? read.lora : null);
      if (this.o.saturation) this.o.saturation.update(w.id, this.readings.get(w.epochKey));
      if (!read && !this.failing[w.id]) {
        this.failing[w.id] = true;
        this.o.log("warn", "engine-metrics scrape failed", { worker: w.id, url, error: why });
      } else if (read && this.failing[w.id]) {
        delete this.failing[w.id];
        this.o.log("info", "engine-metrics readable again", { worker: w.id });
      }
    });
    if (this.o.saturation)
      this.o.saturation.retain(
        this.router()
          .workers()
          .map((w) => w.id),
      );
  }

  start(): void {
    if (this.timer) return;
    // Overrides hold from the start, with or without scraping.
    for (const w of this.router().workers()) if (!this.readings.get(w.epochKey)) this.apply(w, null, 0);
    if (!this.o.intervalMs) {
      if (!Object.keys(this.o.capacityOverride).length) return;
      // No scraping: a joining worker still gets its override at the next look.
      this.timer = setInterval(() => {
        for (const w of this.router().workers()) if (!this.readings.get(w.epochKey)) this.apply(w, null, 0);
      }, 1000);
      this.timer.unref();
      return;
    }
    const tick = () => {
      if (this.inFlight) return;
      this.inFlight = true;
      void this.scrapeAll().finally(() => (this.inFlight = false));
    };
    this.timer = setInterval(tick, this.o.intervalMs);
    this.timer.unref();
    tick();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** infera_router_worker_kv_capacity_blocks, _kv_usage_ratio, _engine_waiting_requests and _saturated, read at scrape time. */
  register(registry: client.Registry): void {
    const gauge = (name: string, pick: (r: EngineReading) => number | null) =>
      new client.Gauge({
        ...spec(name),
        registers: [registry],
        collect: () => {
          const g = registry.getSingleMetric(name) as client.Gauge;
          g.reset();
          const r = this.router();
          for (const w of r.workers()) {
            const x = r.state.engine ? r.state.engine.get(w.epochKey) : null;
            const v = x ? pick(x) : null;
            if (v !== null) g.set({ worker: w.id }, v);
          }
        },
      });
    gauge("infera_router_worker_kv_capacity_blocks", (r) => r.capacityBlocks);
    gauge("infera_router_worker_kv_usage_ratio", (r) => r.kvUsage);
    gauge("infera_router_worker_engine_waiting_requests", (r) => r.waitingRequests);
    new client.Gauge({
      ...spec("infera_router_worker_saturated"),
      registers: [registry],
      collect: () => {
        const g = registry.getSingleMetric("infera_router_worker_saturated") as client.Gauge;
        g.reset();
        const sat = this.o.saturation;
        if (!sat || !sat.on) return;
        for (const w of this.router().workers()) g.set({ worker: w.id }, sat.saturated(w.id) ? 1 : 0);
      },
    });
  }
}
