// Load: distinct prompt blocks in flight on the worker that this request does
// not share. Blocks it shares with requests already running there (a common
// system prompt, the earlier turns of its conversation) sit in that worker's
// KV cache once; counting them as load would make the worker that holds the
// prefix look exactly as costly as a cold one.
import { Scorer } from "../../framework";

export const activeBlocksScorer: Scorer = {
  name: "active-blocks",
  profiles: ["prefill", "decode"],
  weight: () => 1,
  score(_ctx, rows) {
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(rows[i].data.active - rows[i].data.inflight);
    return out;
  },
};
