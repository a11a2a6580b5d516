// Prefill work already queued on the worker: the uncached blocks of requests
// routed there that have not produced a first token yet. A new request waits
// behind them. Weight 1, like in-flight blocks: the overlap weight on the
// request's own uncached blocks also prices keeping a prefix in one place for
// the requests after it, which a backlog does not.
import { Scorer } from "../../framework";

export const queuedPrefillScorer: Scorer = {
  name: "queued-prefill",
  profiles: ["prefill"],
  weight: () => 1,
  score(ctx, rows) {
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(ctx.state.load.pendingBlocks(rows[i].worker.epochKey));
    return out;
  },
};
