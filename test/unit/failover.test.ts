// core/failover.ts: the second choice a gateway retries, and moving the load there.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { mk, blocks, cache, feats } from "./helpers";
import { moveGuard, nextBest } from "../../core/failover";

test("nextBest: the lowest-cost other candidate; under PD a decode worker; none with one worker", () => {
  const { st, r } = mk([{ id: "a" }, { id: "b" }, { id: "c" }]);
  const req = blocks("nb", 10);
  cache(st, r, "a", req);
  cache(st, r, "c", req.slice(0, 6));
  const p = r.pick(feats(req));
  assert.equal(p.target.id, "a");
  assert.equal(nextBest(p), "c", "c holds 6 of the 10 blocks, b none");
  p.reservation.finish();

  const pd = mk([
    { id: "p0", role: "prefill" },
    { id: "d0", role: "decode" },
    { id: "d1", role: "decode" },
  ]);
  const q = pd.r.pick(feats(blocks("pd", 4)));
  assert.equal(q.prefill!.id, "p0");
  assert.equal(nextBest(q), q.target.id === "d0" ? "d1" : "d0");
  q.reservation.finish();

  const one = mk([{ id: "solo" }]);
  assert.equal(nextBest(one.r.pick(feats(blocks("s", 2)))), null);
});

test("moveGuard: the load leaves the failed worker and is released once where it went", () => {
  const { r } = mk([{ id: "a" }, { id: "b" }]);
  const p = r.pick(feats(blocks("mv", 8)));
  const from = p.target.id;
  const to = from === "a" ? "b" : "a";
  const g = p.reservation.guards();
  assert.equal(r.activeBlocks(from), 8);
  const moved = [g.queued, g.main].map((x) => (x ? moveGuard(r, x, to) : null));
  assert.equal(r.activeBlocks(from), 0);
  assert.equal(r.activeBlocks(to), 8);
  for (const m of moved) if (m) r.releaseGuard(m);
  assert.equal(r.activeBlocks(to), 0);
  assert.equal(r.openGuards(), 0);

  // An unhealthy or unknown worker takes nothing; the guard stays where it was.
  const p2 = r.pick(feats(blocks("mv2", 4)));
  const other = p2.target.id === "a" ? "b" : "a";
  r.setHealthy(other, false);
  assert.equal(moveGuard(r, p2.reservation.guards().main, other), null);
  assert.equal(moveGuard(r, p2.reservation.guards().main, "nobody"), null);
  assert.equal(r.activeBlocks(p2.target.id), 4);
  p2.reservation.finish();
  assert.equal(r.openGuards(), 0);
});
