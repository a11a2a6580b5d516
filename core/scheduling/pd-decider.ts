// Conditional disaggregation (--pd-decider prefix), after llm-d's
// prefix-based P/D decider: under PD, once the decode worker is picked, the
// request skips the prefill pool when the decode worker can prefill it
// cheaply itself. That is when the prompt tokens its cache does not hold
// (by the KV events the router mirrors) are at most
// --pd-decode-first-max-uncached-tokens, or the whole prompt is at most
// --pd-decode-first-max-prompt-tokens. A prefill hop costs a second queue,
// an extra request and a KV transfer; for a short remainder those cost more
// than computing it where the decode runs.
import { Features, RouterConfig } from "../types";
import { Row } from "./framework";

export type PdPath = "decode-first" | "prefill";

export interface PdDecision {
  path: PdPath;
  /** Prompt tokens the decode worker's cache does not hold. */
  uncached: number;
  prompt: number;
}

/** The path of one PD request given its decode pick; null when the decider is off. */
export function decidePd(cfg: RouterConfig, f: Features, decode: Row): PdDecision | null {
  if (cfg.pdDecider !== "prefix") return null;
  const prompt = f.inputTokens;
  // Image requests: the decode worker's text hits say nothing about the images' KV.
  const hits = f.mediaHashes.length ? 0 : decode.data.hits;
  const uncached = Math.max(0, prompt - Math.floor(hits) * cfg.blockSize);
  const local = uncached <= cfg.pdDecodeFirstMaxUncachedTokens || prompt <= cfg.pdDecodeFirstMaxPromptTokens;
  return { path: local ? "decode-first" : "prefill", uncached: uncached, prompt: prompt };
}
