// Fleet comparison shared by the router, the ext_proc app and the nginx bridge:
// one definition of "the same worker", so none of them drifts.
import { WorkerSpec } from "./types";

/** Same address, role, events endpoint and block size: nothing to redo. */
export function sameWorker(a: WorkerSpec, b: WorkerSpec): boolean {
  return (
    a.address === b.address &&
    (a.role || "mixed") === (b.role || "mixed") &&
    a.events === b.events &&
    a.replay === b.replay &&
    a.snapshot === b.snapshot &&
    a.blockSize === b.blockSize &&
    a.dpRank === b.dpRank &&
    a.dpEvents === b.dpEvents &&
    (a.engine || "vllm") === (b.engine || "vllm")
  );
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

/** tcp://host:PORT -> tcp://host:PORT+n (vLLM offsets each DP rank's event and replay ports so). */
export function offsetPort(endpoint: string | undefined, n: number): string | undefined {
  if (!endpoint || n === 0 || !/^tcp:\/\//.test(endpoint)) return endpoint;
  const c = endpoint.lastIndexOf(":");
  const port = Number(endpoint.substr(c + 1));
  if (!(port > 0)) return endpoint;
  return endpoint.substr(0, c + 1) + (port + n);
}

/** The engine a data-parallel rank target belongs to: its id before expandDp's "/dp<rank>" suffix (the id itself otherwise). */
export function engineIdOf(id: string): string {
  return id.replace(/\/dp\d+$/, "");
}

/**
 * One engine with data-parallel size n is n route targets "<id>/dp<r>" with
 * their own mirror, load and demand. Events per rank come from endpoint port
 * + rank (mode "port", vLLM and SGLang) or from one socket whose batches carry
 * data_parallel_rank (mode "tagged").
 */
export function expandDp(base: WorkerSpec, n: number, mode: "port" | "tagged"): WorkerSpec[] {
  if (!(n > 1)) return [base];
  const out: WorkerSpec[] = [];
  for (let r = 0; r < n; r++) {
    const s: WorkerSpec = {
      id: base.id + "/dp" + r,
      address: base.address,
      role: base.role,
      dpRank: r,
      dpEvents: mode,
    };
    if (base.blockSize !== undefined) s.blockSize = base.blockSize;
    if (base.engine !== undefined) s.engine = base.engine;
    const ev = mode === "port" ? offsetPort(base.events, r) : base.events;
    if (ev !== undefined) s.events = ev;
    const rp = mode === "port" ? offsetPort(base.replay, r) : base.replay;
    if (rp !== undefined) s.replay = rp;
    const sp = mode === "port" ? offsetPort(base.snapshot, r) : base.snapshot;
    if (sp !== undefined) s.snapshot = sp;
    out.push(s);
  }
  return out;
}
