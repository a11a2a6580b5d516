// Fleet comparison shared by the router, the ext_proc app and the nginx bridge:
// one definition of "the same worker", so none of them drifts.
import { WorkerSpec } from "./types";

/** Same address, role, events endpoint and block size: nothing to redo. */
export function sameWorker(a: WorkerSpec, b: WorkerSpec): boolean {
  return a.address === b.address && (a.role || "mixed") === (b.role || "mixed") && a.events === b.events && a.replay === b.replay && a.blockSize === b.blockSize;
}

/** What turns fleet `cur` into fleet `want`: ids to remove, specs to (re)add. */
export function diffFleet(cur: WorkerSpec[], want: WorkerSpec[]): { remove: string[]; add: WorkerSpec[] } {
  const wanted: { [id: string]: WorkerSpec } = {};
  for (let i = 0; i < want.length; i++) wanted[want[i].id] = want[i];
  const have: { [id: string]: WorkerSpec } = {};
  const remove: string[] = [];
  for (let i = 0; i < cur.length; i++) {
    have[cur[i].id] = cur[i];
    if (!wanted[cur[i].id]) remove.push(cur[i].id);
  }
  const add: WorkerSpec[] = [];
  for (let i = 0; i < want.length; i++) {
    const h = have[want[i].id];
    if (!h || !sameWorker(h, want[i])) add.push(want[i]);
  }
  return { remove: remove, add: add };
}
