// What each worker's engine says about itself on its /metrics page (vLLM,
// SGLang), or what a flag says instead: its KV capacity in blocks and its
// headroom right now (KV usage, requests waiting, requests running). The Node
// runtime fills it (runtime/engine-metrics.ts scrapes every
// --engine-metrics-interval-ms; --kv-capacity-blocks overrides capacity); the
// data stage (scheduling/data.ts) copies a candidate's reading into its
// Row.data, where scorers and admission read it. Keyed by epoch key, so a
// worker that rejoins starts without readings. Pure and ES5-safe (njs).
import { EpochKey } from "./types";
import { LoraState } from "./lora";
import { Store, storedJson } from "./store";

export interface EngineReading {
  /** KV cache capacity in blocks of the router's --block-size; null = not known. */
  capacityBlocks: number | null;
  /** Share of the KV cache held by running requests, 0..1 (vLLM kv_cache_usage_perc, SGLang token_usage); null = not known. */
  kvUsage: number | null;
  /** Requests queued in the engine, not yet scheduled (vLLM num_requests_waiting, SGLang num_queue_reqs). */
  waitingRequests: number | null;
  /** Requests in the engine's running batch. */
  runningRequests: number | null;
  /** When the headroom figures were read (ms, the reader's clock); 0 = never. */
  at: number;
}

export interface EngineReadings {
  get(epochKey: EpochKey): EngineReading | null;
  set(epochKey: EpochKey, r: EngineReading): void;
  forget(epochKey: EpochKey): void;
}

/**
 * A worker's reading after one scrape, from the one before (null: none):
 * capacity as scraped or overridden (null: keep the last known, which does
 * not change while the worker stays), the headroom figures from the page
 * (a failed scrape, f null: unknown), read at `now`.
 */
export function nextReading(
  prev: EngineReading | null,
  capacityBlocks: number | null,
  f: { kvUsage: number | null; waitingRequests: number | null; runningRequests: number | null } | null,
  now: number,
): EngineReading {
  return {
    capacityBlocks: capacityBlocks !== null ? capacityBlocks : prev ? prev.capacityBlocks : null,
    kvUsage: f ? f.kvUsage : null,
    waitingRequests: f ? f.waitingRequests : null,
    runningRequests: f ? f.runningRequests : null,
    at: f ? now : prev ? prev.at : 0,
  };
}

/** A table in one process's memory (the Node router; each njs VM would have its own). */
export function engineReadings(): EngineReadings {
  const byKey: { [ek: string]: EngineReading } = {};
  return {
    get: (ek) => (Object.prototype.hasOwnProperty.call(byKey, ek) ? byKey[ek] : null),
    set: (ek, r) => {
      byKey[ek] = r;
    },
    forget: (ek) => {
      delete byKey[ek];
    },
  };
}

/**
 * One worker's /metrics page as the bridge pushes it to nginx after a scrape
 * (njs/bridge.ts): capacity in tokens (njs divides by its own block size),
 * the headroom figures, and the LoRA state.
 */
export interface EnginePage {
  capacityTokens: number | null;
  kvUsage: number | null;
  waitingRequests: number | null;
  runningRequests: number | null;
  lora: LoraState | null;
}

/** nginx: the readings in the shared dict ("ER:<epoch key>"), so every worker process reads the bridge's last push. */
export function storeEngineReadings(st: Store): EngineReadings {
  return {
    get: (ek) => storedJson(st, "ER:" + ek) as EngineReading | null,
    set(ek, r) {
      st.set("ER:" + ek, JSON.stringify(r));
    },
    forget(ek) {
      st.del("ER:" + ek);
    },
  };
}
