// Predicted time to first token on a fleet whose workers differ in speed.
//
// The cost counts work in blocks and the framework turns it into time by
// multiplying it with the worker's learned slowness (core/latency.ts). On a
// uniform fleet queued prefill is priced at half an uncached block
// (queued-prefill.ts: waiting behind a queue costs nobody else, a copy costs
// the fleet), so a request for a cached document waits on its holder until
// that queue is about twice what computing the document elsewhere would take.
// On a mixed fleet the same half price lets the fast worker keep every hot
// document: its queue is multiplied by its slowness too, so a third-speed
// worker outbids it only once the fast worker's queue is several documents
// deep, and by then a request there waits longer than it would take a cold
// slow worker to compute its document from scratch.
//
// So on a mixed fleet (some candidate's slowness is not 1) this term adds the
// other half of the queue's price: with the framework's multiply, a worker
// then costs overlap weight × slowness × (its queued prefill + the request's
// uncached blocks), which is its predicted time to first token (the work
// ahead of the request and its own prefill, both at that worker's learned
// time per block), plus the load term. The fast worker stops taking a
// document's requests once its queue would make them slower than a cold
// worker. On a uniform fleet, and before any worker's speed is learned, every
// slowness is 1 and the term is 0: picks are today's.
import { overlapWeight, Scorer } from "../../framework";

export const predictedTtftScorer: Scorer = {
  name: "predicted-ttft",
  profiles: ["prefill"],
  weight: (ctx) => (ctx.latency ? overlapWeight(ctx) / 2 : 0),
  score(_ctx, rows) {
    const out: number[] = [];
    let mixed = false;
    for (let i = 0; i < rows.length; i++) {
      out.push(0);
      if (rows[i].data.slowness !== 1) mixed = true;
    }
    if (!mixed) return out;
    for (let i = 0; i < rows.length; i++) out[i] = rows[i].data.pending;
    return out;
  },
};
