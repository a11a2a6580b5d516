// A pick's second choice and moving its load there, for a gateway that
// retries a worker it could not connect to (nginx: the request never reached
// the worker, so sending it elsewhere cannot run it twice).
import { Pick, Router } from "./router";
import { Guard } from "./types";

/**
 * The next-best target after pick.target: the lowest-cost other candidate of
 * the pool the target came from (decode under PD), ties to fewer active
 * blocks, then candidate order; null when there is none. Candidates were
 * usable (healthy, not excluded) at the pick.
 */
export function nextBest(p: Pick): string | null {
  const cs = p.decodeCandidates || p.candidates;
  let best = -1;
  for (let i = 0; i < cs.length; i++) {
    if (cs[i].id === p.target.id) continue;
    if (best < 0 || cs[i].cost < cs[best].cost || (cs[i].cost === cs[best].cost && cs[i].active < cs[best].active))
      best = i;
  }
  return best < 0 ? null : cs[best].id;
}

/**
 * Holds a guard's load on worker toId instead and gives the original back
 * (queued-prefill blocks stay queued on the new worker until its first
 * token). The caller owns g exactly once (njs: popped from the shared dict);
 * null, with g untouched, when toId is unknown or cannot take a pick now.
 */
export function moveGuard(router: Router, g: Guard, toId: string): Guard | null {
  const w = router.worker(toId);
  if (!w || !router.healthy(toId) || router.excluded(toId) !== null) return null;
  const load = router.state.load;
  const again = load.holdLike
    ? load.holdLike(w.epochKey, g)
    : load.hold(w.epochKey, g.blocks, g.tokens, g.requests, g.pending || undefined);
  router.releaseGuard(g);
  return again;
}
