// What admin endpoints show about a worker, for the ext_proc admin server and
// the njs admin location alike.
import { Router } from "./router";
import { Worker } from "./types";

export interface WorkerRow {
  id: string;
  address: string;
  role: string;
  events: string | null;
  block_count: number;
  active_blocks: number;
  demand: { tokens: number; requests: number };
  excluded: string | null;
  healthy: boolean;
  /** The engine's KV capacity in blocks, from its /metrics (or an override); null = not known. */
  kv_capacity_blocks: number | null;
}

export function workerRow(router: Router, w: Worker): WorkerRow {
  const v = router.cacheView(w.id);
  const reading = router.state.engine ? router.state.engine.get(w.epochKey) : null;
  return {
    id: w.id,
    address: w.address,
    role: w.role,
    events: w.events === undefined ? null : w.events,
    block_count: v ? v.block_count : 0,
    active_blocks: router.activeBlocks(w.id),
    demand: router.demand(w.id),
    excluded: router.excluded(w.id),
    healthy: router.healthy(w.id),
    kv_capacity_blocks: reading ? reading.capacityBlocks : null,
  };
}

/** A cache-view 404's message: the id asked for, and the ids the router knows (the first 20). */
export function unknownWorker(router: Router, id: string): string {
  const ws = router.workers();
  const ids: string[] = [];
  for (let i = 0; i < ws.length && i < 20; i++) ids.push(ws[i].id);
  const more = ws.length > 20 ? ", ... " + (ws.length - 20) + " more" : "";
  return "unknown worker '" + id + "' (known: " + (ids.length ? ids.join(", ") + more : "none") + ")";
}
