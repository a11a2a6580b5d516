// Prefill work already queued on the worker: the uncached blocks of requests
// routed there that have not produced a first token yet. A new request waits
// for every one of them before its own prefill starts.
//
// Another request's queued block is priced at half an uncached block of this
// one (weight = overlap weight / 2). Both delay the request by about the same
// time, but an uncached block is also work only this request needs, taken
// from whatever the engine serves next: a copy of a document on a free worker
// leaves the fleet that much less room for the next new one. Waiting behind a
// queue costs nobody else. At equal prices (the default before) a request for
// a cached document left its holder whenever the holder was computing another
// one, and the fleet computed documents twice. Measured with bench:policy-sim:
// docs/benchmarks/2026-12-05-policy-sim.md#measurements-behind-the-defaults
//
// Queued blocks this request shares (its document, still being computed there
// for an earlier request; prefix-overlap counts them as hits because they are
// in flight) count twice here, so they cost a full uncached block: a burst
// over one new prefix then ties a free worker computing its own copy, and
// spreads. Agent loops over one tool preamble need that spread: at half price
// a burst of them went to the preamble's first holder and their histories
// kept them there, slower than round-robin (same benchmark file). Once every
// worker is busy, queued-shared.ts takes those blocks back out.
//
// Overlap weight 0 (pure load balance) leaves in-flight blocks only.
import { overlapWeight, Scorer } from "../../framework";

export const queuedPrefillScorer: Scorer = {
  name: "queued-prefill",
  profiles: ["prefill"],
  weight: (ctx) => overlapWeight(ctx) / 2,
  score(_ctx, rows) {
    const out: number[] = [];
    for (let i = 0; i < rows.length; i++) out.push(rows[i].data.pending + rows[i].data.queuedShared);
    return out;
  },
};
