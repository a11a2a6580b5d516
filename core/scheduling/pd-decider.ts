// Conditional disaggregation (--pd-decider prefix), after llm-d's
// prefix-based P/D decider: under PD, once the decode worker is picked, the
// request skips the prefill pool when the decode worker can prefill it
// cheaply itself. That is when the prompt tokens its cache does not hold
// (by the KV events the router mirrors) are at most
// --pd-decode-first-max-uncached-tokens, or the whole prompt is at most
// --pd-decode-first-max-prompt-tokens. A prefill hop costs a second queue,
// an extra request and a KV transfer; for a short remainder those cost more
// than computing it where the decode runs.
//
// ITL guard (--pd-decode-first-max-interference B, 0 = off): a decode-first
// request's prefill runs as part of the decode worker's batch, so that step
// takes about as long as a decode step plus the uncached tokens' prefill, and
// every stream running there sees it as one long inter-token gap. The cost
// is the uncached tokens times the requests running on the worker (the
// router's own in-flight count there, data.held): the guard keeps the
// decode-first path only while that product is at most B, and otherwise
// takes the hop. An idle decode worker always passes (nobody to stall), so
// the guard bounds how many gaps a local prefill lengthens and by how much.
// Dynamo's conditional disaggregation has a decode-busy guard on the same
// grounds (decode load against a share of the worker's KV blocks).
//
// Which decode worker (decodeFirstIndex): a local prefill stalls every stream
// running where it lands, so when more than one decode candidate could take
// the request decode-first, the one with the fewest running streams does
// (ties keep the cost model's pick, then candidate order). A request no
// candidate can take decode-first keeps the cost model's pick and the hop.
import { Features, RouterConfig } from "../types";
import { Row } from "./framework";

export type PdPath = "decode-first" | "prefill";

export interface PdDecision {
  path: PdPath;
  /** Prompt tokens the decode worker's cache does not hold. */
  uncached: number;
  prompt: number;
  /** Requests running on the decode worker when decided (the router's in-flight count). */
  running: number;
  /** True when the prefix rules allowed decode-first but the ITL guard sent it to prefill. */
  guarded: boolean;
}

/** The path of one PD request given its decode pick; null when the decider is off. */
export function decidePd(cfg: RouterConfig, f: Features, decode: Row): PdDecision | null {
  if (cfg.pdDecider !== "prefix") return null;
  const prompt = f.inputTokens;
  // Image requests: the decode worker's text hits say nothing about the images' KV.
  const hits = f.mediaHashes.length ? 0 : decode.data.hits;
  const uncached = Math.max(0, prompt - Math.floor(hits) * cfg.blockSize);
  const cheap = uncached <= cfg.pdDecodeFirstMaxUncachedTokens || prompt <= cfg.pdDecodeFirstMaxPromptTokens;
  const running = decode.data.held;
  const budget = cfg.pdDecodeFirstMaxInterference;
  const guarded = cheap && budget > 0 && uncached * running > budget;
  const local = cheap && !guarded;
  return {
    path: local ? "decode-first" : "prefill",
    uncached: uncached,
    prompt: prompt,
    running: running,
    guarded: guarded,
  };
}

/**
 * The decode row to serve a PD request from: among the decode candidates that
 * would take it decode-first, the one with the fewest requests running; the
 * cost model's pick when it is among the fewest or when none qualifies.
 */
export function decodeFirstIndex(cfg: RouterConfig, f: Features, rows: Row[], picked: number): number {
  if (cfg.pdDecider !== "prefix") return picked;
  let best = -1;
  let bestRunning = 0;
  for (let i = 0; i < rows.length; i++) {
    const d = decidePd(cfg, f, rows[i]);
    if (d === null || d.path !== "decode-first") continue;
    if (best < 0 || d.running < bestRunning || (d.running === bestRunning && i === picked)) {
      best = i;
      bestRunning = d.running;
    }
  }
  return best < 0 ? picked : best;
}
