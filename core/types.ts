// Domain types shared by the scheduler, the state backends and the adapters.

/** Our chained XXH3-64 of one prompt block, 16 hex digits. Only hashing code makes one. */
export type BlockHash = string & { readonly __brand: "BlockHash" };
/** The engine's own id for a block (opaque; only used to find our hash again on removal). */
export type EngineHash = string;
/**
 * A worker's identity for one stay in the fleet ("<id>#<n>"): new on every
 * join, so a late release or event never touches a recreated entry.
 */
export type EpochKey = string & { readonly __brand: "EpochKey" };

export type Role = "prefill" | "decode" | "mixed";
export type Policy = "kv-aware" | "round-robin" | "random";
export type DemandMode = "off" | "shadow" | "on";
export type SessionAffinity = "off" | "prefill" | "both";

export interface WorkerSpec {
  id: string;
  /** host:port the gateway proxies to. */
  address: string;
  role: Role;
  /** Block size the worker reports; a mismatch with the router excludes it. */
  blockSize?: number;
  /** KV event endpoint (zmq tcp://… or a NATS subject). */
  events?: string;
  /** The engine's KV event replay ROUTER endpoint (zmq tcp://…), used to repair gaps. */
  replay?: string;
  /**
   * SGLang's KV placement snapshot ROUTER endpoint (zmq tcp://…, its
   * snapshot_endpoint; "snapshot-v1" protocol): a gap replay cannot fill
   * resyncs the mirror from it instead of wiping it.
   */
  snapshot?: string;
  /**
   * Data-parallel rank this target is, on an engine serving several behind one
   * address (core/fleet.ts expandDp). The pick sends it as X-data-parallel-rank.
   */
  dpRank?: number;
  /** DP events: "port" (vLLM: endpoint port + rank) or "tagged" (one socket, batches tagged with the rank). */
  dpEvents?: "port" | "tagged";
  /**
   * The engine behind the address, where vLLM and SGLang differ in how a
   * picked DP rank reaches them: "sglang" also gets it in the request body
   * (routed_dp_rank; disagg_prefill_dp_rank for PD). Unset = vLLM (header only).
   */
  engine?: "vllm" | "sglang";
}

export interface Worker extends WorkerSpec {
  epochKey: EpochKey;
}

export interface RouterConfig {
  policy: Policy;
  blockSize: number;
  overlapWeight: number;
  prefillOverlapWeight: number | null;
  decodeOverlapWeight: number | null;
  decodeInputDemand: DemandMode;
  decodeRequestWeight: number;
  sessionAffinity: SessionAffinity;
  pdPrefillGuardRelease: "first-token" | "completion";
  /** Conditional disaggregation (core/scheduling/pd-decider.ts): off = every PD request takes the prefill hop. */
  pdDecider: "off" | "prefix";
  pdDecodeFirstMaxUncachedTokens: number;
  pdDecodeFirstMaxPromptTokens: number;
  /** ITL guard: decode-first only while uncached tokens x requests held on the decode pick stay within this; 0 = no guard. */
  pdDecodeFirstMaxInterference: number;
  /** Name the best cache holder when the pick went elsewhere, so the target can pull its KV (core/scheduling/kv-source.ts). */
  kvSourceHint: "off" | "on";
  mmLruSize: number;
  /** Share of a GPU hit a block cached on a lower tier earns (--kv-tier-weights). */
  kvTierWeights: { [tier: string]: number };
  /** Per-scorer weight overrides by plugin name (--scorer-weights); a scorer that does not apply stays off. */
  scorerWeights: { [scorer: string]: number };
  /** Learn each worker's speed from its first tokens and price its work in time (core/latency.ts). */
  speedLearning: "on" | "off";
  /** The engines' chunked-prefill token budget per step, for the TTFT replica (core/twin.ts). */
  prefillTokenBudget: number;
}

/** What routing needs from one request (see core/request.ts). */
export interface Features {
  blocks: BlockHash[];
  inputTokens: number;
  exact: boolean;
  /** XXH3 of each media reference, in request order. */
  mediaHashes: string[];
  /** Requested completions (n); demand books input tokens x n. */
  n: number;
  /** The request's `model`: only workers serving it are eligible (core/models.ts). */
  model?: string;
  /** Target time to first token (x-slo-ttft-ms, trusted objective headers only); absent or 0: none. */
  sloTtftMs?: number;
}

/** One held piece of load; released exactly once. Plain data, so njs can keep it in a shared dict between phases. */
export interface Guard {
  epochKey: EpochKey;
  blocks: BlockHash[];
  tokens: number;
  requests: number;
  /** Prompt blocks still to prefill (uncached at the pick), until the first token. */
  pending: number;
  done: boolean;
  /**
   * A compact guard (the key-encoded backend, core/state/marks.ts): blocks are
   * the request's blocks at these positions only, of a list ending at block n.
   */
  at?: number[];
  n?: number;
}

/** Where a session's earlier requests went (prefill or only target, and decode). */
export interface SessionBinding {
  prefill?: EpochKey;
  decode?: EpochKey;
}

/** A scored candidate as callers see it. */
export interface Candidate {
  id: string;
  cost: number;
  hits: number;
  active: number;
}
