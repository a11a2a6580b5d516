// The reference engine step: Llama-3.1-8B-Instruct, BF16, one H100 80GB SXM,
// vLLM V1 defaults (docs/simulator.md has the published figures behind it).
// One table for the two places that price a step: the simulator's default
// engine (sim/model.ts llama8bH100) and the router's scheduler replica
// (core/twin.ts), which scales it by a factor learned per worker. A
// recalibration changes both together.
// ES5-safe: njs bundles this file (through core/twin.ts).

/** A step's fixed cost (ms): weights read once per step. */
export const STEP_BASE_MS = 6.3;
/** Linear-layer cost per batched token (µs). */
export const PREFILL_US_PER_TOKEN = 35;
/** Prefill attention per thousand token pairs (µs). */
export const PREFILL_ATTN_US_PER_KCTX = 1.0;
/** Per running decode sequence (µs). */
export const DECODE_US_PER_SEQ = 60;
/** Decode KV read per thousand tokens of context (µs). */
export const KV_READ_US_PER_KTOKEN = 55;
/** The knee's exponent p: how sharply the fixed cost gives way to the batch's. */
export const STEP_KNEE_EXP = 1.4;

/**
 * A step's linear layers under the knee model (ms): (F^p + B^p)^(1/p), flat at
 * the fixed cost F for small batches and the batch's own cost B for large ones.
 */
export function kneeMs(fixedMs: number, batchMs: number, p: number): number {
  return Math.pow(Math.pow(fixedMs, p) + Math.pow(batchMs, p), 1 / p);
}
