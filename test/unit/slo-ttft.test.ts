// The slo-ttft scorer (core/scheduling/plugins/scorer/slo-ttft.ts) in the
// real pick: with a TTFT target, a worker the speed model predicts to miss it
// loses to one predicted to meet it, even when the first holds the prompt's
// prefix; without a target the cache fit wins as before.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { createRouter, defaultConfig } from "../../core/router";
import { memoryState } from "../../core/state/memory";
import { BlockHash, Features } from "../../core/types";

const prompt = (p: string, n: number, extra?: Partial<Features>): Features => ({
  blocks: Array.from({ length: n }, (_, i) => `${p}${i}` as BlockHash),
  inputTokens: n * 16,
  exact: true,
  mediaHashes: [],
  n: 1,
  ...extra,
});

/** Two workers of one speed whose first tokens slow down by 20 ms per running request. */
function taught() {
  let clock = 0;
  const router = createRouter(memoryState(), { ...defaultConfig(), speedLearning: "on" }, { now: () => clock });
  router.addWorker({ id: "a", address: "127.0.0.1:1", role: "mixed" });
  router.addWorker({ id: "b", address: "127.0.0.1:2", role: "mixed" });
  const truth = (tokens: number, running: number) => 5 + 0.035 * tokens + 20 * running;
  for (let i = 0; i < 16; i++)
    for (const id of ["a", "b"]) {
      const only = (w: { id: string }) => w.id === id;
      // i % 4 requests already decoding there (first token out: running, not queued).
      const bg: ReturnType<typeof router.pick>[] = [];
      for (let k = 0; k < i % 4; k++) {
        const r = router.pick(prompt(`bg${id}${i}-${k}`, 4), null, only);
        clock += truth(64, bg.length);
        r.reservation.firstToken();
        bg.push(r);
      }
      const n = 20 + ((i * 7) % 60);
      const pick = router.pick(prompt(`t${id}${i}`, n), null, only);
      clock += truth(n * 16, bg.length);
      pick.reservation.firstToken();
      pick.reservation.finish();
      for (const r of bg) r.reservation.finish();
    }
  /** Sends one request to a worker and lets its first token take the true time. */
  const serve = (f: Features, id: string, running: number) => {
    const p = router.pick(f, null, (w) => w.id === id);
    clock += truth(f.inputTokens, running);
    p.reservation.firstToken();
    return p;
  };
  return { router, serve };
}

test("with x-slo-ttft-ms the best cache fit among workers predicted to meet it wins", () => {
  for (const slo of [0, 150]) {
    const { router, serve } = taught();
    // a holds the document (a request for it decodes there) and 12 other decodes; b is idle.
    const holder = serve(prompt("doc", 60), "a", 0);
    const busy = Array.from({ length: 12 }, (_, k) => serve(prompt(`busy${k}`, 2), "a", k + 1));
    // The question: the document plus 4 blocks of its own. On a: ~5 + 0.035*64 + 20*13 ms = ~270 ms; on b: ~5 + 0.035*1024 = ~41 ms.
    const q = router.pick(prompt("doc", 64, slo ? { sloTtftMs: slo } : {}));
    assert.equal(q.target.id, slo ? "b" : "a", `slo ${slo}`);
    for (const r of [holder, q, ...busy]) r.reservation.finish();
  }
});

test("when no worker is predicted to meet the target, the lowest predicted TTFT wins", () => {
  const { router, serve } = taught();
  const holder = serve(prompt("doc", 60), "a", 0);
  const busy = Array.from({ length: 12 }, (_, k) => serve(prompt(`busy${k}`, 2), "a", k + 1));
  const q = router.pick(prompt("doc", 64, { sloTtftMs: 5 }));
  assert.equal(q.target.id, "b");
  for (const r of [holder, q, ...busy]) r.reservation.finish();
});
