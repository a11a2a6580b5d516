// KV source hint (--kv-source-hint on): when the pick went to a worker other
// than the one holding the longest cached prefix of the prompt, the cost
// model judged that holder too loaded to wait for. The target can then pull
// the holder's blocks over the KV-transfer link (vLLM's KV connectors,
// LMCache, NIXL) instead of recomputing them, so the router names the holder
// in a request header (extproc: x-infera-kv-source). Only cached blocks
// count: blocks still being computed on the holder cannot be pulled yet.
import { Row } from "./framework";

/** The request header naming the KV source (host:port); the simulator's --kv-source-header default. */
export const KV_SOURCE_HEADER = "x-infera-kv-source";

/** Index of the row to name as KV source for the pick at `index`, or -1 when the target holds as much as anyone. */
export function kvSource(rows: Row[], index: number): number {
  // What the target holds, cached or in flight there, it need not pull.
  const own = rows[index].data.hits;
  let best = -1;
  let bestHits = own;
  for (let i = 0; i < rows.length; i++) {
    if (i === index) continue;
    // Only what KV events report cached can be pulled; blocks in flight there are not computed yet.
    const cached = rows[i].data.cached;
    if (cached > bestHits) {
      best = i;
      bestHits = cached;
    }
  }
  return best;
}
