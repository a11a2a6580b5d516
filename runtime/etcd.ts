// etcd discovery. Each worker registers, under a lease it keeps alive, the key
//   <prefix><worker-id>  ->  {"address":"host:port","role":"prefill|decode|mixed",
//                             "block_size":16,"kv_events":"tcp://host:5557",
//                             "kv_replay":"tcp://host:5558",   (optional: the replay ROUTER)
//                             "kv_snapshot":"tcp://host:5559", (optional: SGLang's snapshot-v1 ROUTER)
//                             "dp_size":2,"dp_events":"port|tagged",  (optional: DP ranks = targets <id>/dp<r>)
//                             "engine":"vllm|sglang"}  (optional: how a picked rank reaches the engine)
// The router lists the prefix, then watches it: put = join/update, delete or
// lease expiry = leave. On a watch error it backs off and re-lists, keeping
// the last known fleet meanwhile, so an etcd restart heals.
import { etcdClientOptions } from "./transport-security";
import { Etcd3, isRecoverableError, Lease, Watcher } from "etcd3";
import { circuitBreaker, ConsecutiveBreaker, handleWhen } from "cockatiel";
import { backoff, Logger, makeLogger, stateLogger } from "./log";
import { badEventEndpoint } from "./config";
import { Fleet } from "./discovery";
import { Role, WorkerSpec } from "../core/router";
import { expandDp } from "../core/fleet";
import { within } from "./shutdown";

// A watch cancel or lease revoke waits for etcd's answer: a paused or
// partitioned etcd never sends one, so neither may hold up a re-list or a close for longer.
const ETCD_CALL_DEADLINE_MS = 1000;

export interface Registration {
  address: string;
  role?: Role;
  block_size?: number;
  kv_events?: string;
  kv_replay?: string;
  /** SGLang's snapshot_endpoint (snapshot-v1), per rank at port + rank like the others. */
  kv_snapshot?: string;
  dp_size?: number;
  dp_events?: "port" | "tagged";
  /** "sglang": the picked DP rank also goes in the request body (routed_dp_rank). */
  engine?: "vllm" | "sglang";
}

export function specFromEtcd(id: string, value: string): WorkerSpec {
  const r = JSON.parse(value) as Registration;
  if (typeof r.address !== "string" || !/^[^:\s]+:\d+$/.test(r.address))
    throw new Error(`registration ${id}: 'address' must be host:port`);
  const role = r.role ?? "mixed";
  if (role !== "prefill" && role !== "decode" && role !== "mixed")
    throw new Error(`registration ${id}: unknown role '${role}'`);
  if (r.block_size !== undefined && !(Number.isInteger(r.block_size) && r.block_size >= 1))
    throw new Error(`registration ${id}: 'block_size' must be a positive integer`);
  const why =
    r.kv_events === undefined || r.kv_events === null
      ? null
      : typeof r.kv_events !== "string"
        ? "must be a string"
        : badEventEndpoint(r.kv_events);
  if (why) throw new Error(`registration ${id}: 'kv_events' ${why}`);
  const spec: WorkerSpec = { id, address: r.address, role, blockSize: r.block_size, events: r.kv_events };
  if (typeof r.kv_replay === "string" && r.kv_replay) spec.replay = r.kv_replay;
  if (
    r.kv_snapshot !== undefined &&
    r.kv_snapshot !== null &&
    (typeof r.kv_snapshot !== "string" || !/^tcp:\/\/[^\s]+:\d+$/.test(r.kv_snapshot))
  )
    throw new Error(`registration ${id}: 'kv_snapshot' must be tcp://host:port`);
  if (typeof r.kv_snapshot === "string" && r.kv_snapshot) spec.snapshot = r.kv_snapshot;
  if (r.engine !== undefined && r.engine !== "vllm" && r.engine !== "sglang")
    throw new Error(`registration ${id}: unknown engine '${r.engine}' (vllm | sglang)`);
  if (r.engine === "sglang") spec.engine = "sglang";
  return spec;
}

/** A registration's route targets: one, or one per data-parallel rank. */
export function specsFromEtcd(id: string, value: string): WorkerSpec[] {
  const spec = specFromEtcd(id, value);
  const r = JSON.parse(value) as Registration;
  const n = typeof r.dp_size === "number" ? r.dp_size : 1;
  return expandDp(spec, n, r.dp_events === "tagged" ? "tagged" : "port");
}

const sleep = (ms: number, stop: () => boolean) =>
  new Promise<void>((resolve) => {
    const end = Date.now() + ms;
    const tick = () => (stop() || Date.now() >= end ? resolve() : setTimeout(tick, Math.min(100, end - Date.now())));
    tick();
  });

/**
 * List, then watch from the listed revision. Any failure (etcd down, watch
 * broken) keeps the last known fleet, backs off exponentially, logs the
 * outage once and the recovery once, and starts again with a fresh list, so
 * nothing missed while away is lost.
 */
export async function startEtcdDiscovery(app: Fleet): Promise<{ close(): Promise<void> }> {
  const prefix = app.opts.etcdPrefix;
  const client = new Etcd3({ hosts: app.opts.etcdEndpoint.split(","), dialTimeout: 2000, ...etcdClientOptions() });
  const state = stateLogger(app.log, `etcd: discovery at ${app.opts.etcdEndpoint}`);
  const report = (ok: boolean, detail: string) => app.setDiscoveryState?.(ok, detail);
  report(false, "connecting to etcd");
  let closed = false;
  let current: Watcher | null = null;
  // Ends the wait on the live watch: close() must not depend on the watcher ever emitting again.
  let wake: () => void = () => undefined;
  // Registration id -> the target ids it expanded to (DP ranks), to remove them together.
  const targets: Record<string, string[]> = {};
  const apply = (key: string, value: string | null) => {
    const id = key.slice(prefix.length);
    if (value === null) {
      for (const t of targets[id] ?? [id]) app.removeWorker(t);
      delete targets[id];
      return;
    }
    try {
      const specs = specsFromEtcd(id, value);
      const now = specs.map((s) => s.id);
      for (const t of targets[id] ?? []) if (!now.includes(t)) app.removeWorker(t);
      targets[id] = now;
      for (const s of specs) app.addWorker(s);
    } catch (e) {
      app.log("warn", "etcd: ignoring a registration", { key, error: (e as Error).message });
    }
  };
  const list = async (): Promise<string> => {
    const res = await client.getAll().prefix(prefix).exec();
    const specs: WorkerSpec[] = [];
    for (const kv of res.kvs) {
      const k = kv.key.toString();
      try {
        const got = specsFromEtcd(k.slice(prefix.length), kv.value.toString());
        targets[k.slice(prefix.length)] = got.map((s) => s.id);
        specs.push(...got);
      } catch (e) {
        app.log("warn", "etcd: ignoring a registration", { key: k, error: (e as Error).message });
      }
    }
    app.setWorkers(specs);
    app.setSynced?.(true);
    return res.header.revision;
  };
  const loop = async (): Promise<void> => {
    let attempt = 0;
    while (!closed) {
      try {
        const rev = await list();
        const w = await client
          .watch()
          .prefix(prefix)
          .startRevision(String(BigInt(rev) + BigInt(1)))
          .create();
        current = w;
        if (closed) break;
        const n = app.listWorkerCount?.();
        state.ok({ workers: n });
        app.log("info", "etcd: watching", { prefix, workers: n, revision: rev });
        report(true, `watching ${prefix} at ${app.opts.etcdEndpoint}`);
        attempt = 0;
        await new Promise<void>((resolve) => {
          wake = resolve;
          w.on("put", (kv) => apply(kv.key.toString(), kv.value.toString()));
          w.on("delete", (kv) => apply(kv.key.toString(), null));
          // The client would resume by itself, but we re-list on return instead:
          // leases may have expired and keys changed while we were away.
          w.on("disconnected", () => resolve());
          w.on("error", () => resolve());
          w.on("end", () => resolve());
        });
        current = null;
        w.removeAllListeners("put");
        w.removeAllListeners("delete");
        if (closed) break; // close() cancels it, bounded
        await within(w.cancel(), ETCD_CALL_DEADLINE_MS);
        state.fail("watch lost; keeping the last known fleet");
        report(false, "etcd unreachable; keeping the last known fleet");
      } catch (e) {
        if (closed) break;
        state.fail(`${(e as Error).message.split("\n")[0]}; keeping the last known fleet`);
        report(false, "etcd unreachable; keeping the last known fleet");
      }
      await sleep(backoff(attempt++, 5000, 200), () => closed);
    }
  };
  const running = loop();
  return {
    async close() {
      closed = true;
      wake();
      // The cancel is a courtesy to etcd (it frees the watch at once); it
      // never settles while etcd is paused, and the client's close ends the stream anyway.
      const w = current;
      current = null;
      if (w) await within(w.cancel(), ETCD_CALL_DEADLINE_MS);
      client.close();
      await within(running, ETCD_CALL_DEADLINE_MS);
    },
  };
}

/**
 * Registers a worker under a kept-alive lease (the simulator and
 * `infera-register`). One lease at a time: a lost or failed lease is released
 * (its keep-alive timers stopped) before the next grant, after an exponential
 * backoff, so an etcd outage costs neither memory nor log lines per attempt.
 */
export async function registerWorker(
  endpoint: string,
  prefix: string,
  id: string,
  reg: Registration,
  ttlSeconds = 5,
  log?: Logger,
): Promise<{ close(): Promise<void> }> {
  // etcd restores leases with their TTL when it comes back: a registrant that
  // waits longer than that to re-register lets its old key expire first, and
  // the router sees the worker leave. So it retries at least three times per TTL.
  const retryMs = Math.max(200, Math.min(5000, (ttlSeconds * 1000) / 3));
  // The etcd3 client's own per-host circuit breaker (open 5 s after three
  // failures) would refuse those retries for longer than a short TTL after etcd
  // returns (etcd-outage.test.ts saw the fleet empty so): it reopens as often as we retry.
  const host = () =>
    circuitBreaker(handleWhen(isRecoverableError), { halfOpenAfter: retryMs, breaker: new ConsecutiveBreaker(3) });
  const client = new Etcd3({
    hosts: endpoint.split(","),
    dialTimeout: 2000,
    faultHandling: { host },
    ...etcdClientOptions(),
  });
  const logger: Logger = log ?? makeLogger("warn", "text", { component: "register" });
  const state = stateLogger(logger, `etcd: registration of ${id} at ${endpoint}`);
  let lease: Lease | null = null;
  let closed = false;
  const hooks: { wake: () => void; first: (ok: boolean) => void } = { wake: () => undefined, first: () => undefined };
  const firstDone = new Promise<boolean>((r) => (hooks.first = r));
  const loop = async () => {
    let attempt = 0;
    while (!closed) {
      const l = client.lease(ttlSeconds, { autoKeepAlive: true });
      let lostWhy = "";
      const lost = new Promise<void>((resolve) => {
        l.on("lost", (e: Error) => {
          lostWhy = e.message;
          resolve();
        });
        hooks.wake = resolve;
      });
      try {
        await l.put(prefix + id).value(JSON.stringify(reg));
        lease = l;
        state.ok();
        attempt = 0;
        hooks.first(true);
        await lost;
        if (!closed) state.fail(`lease lost (${lostWhy.split("\n")[0]})`);
      } catch (e) {
        if (!closed) state.fail((e as Error).message.split("\n")[0]);
      }
      if (lease === l && closed) break;
      l.release();
      if (lease === l) lease = null;
      if (closed) break;
      await sleep(backoff(attempt++, retryMs, 200), () => closed);
    }
  };
  const running = loop();
  // Callers wait for the first registration, but not forever: the loop keeps trying.
  await Promise.race([firstDone, sleep(10000, () => false)]);
  return {
    async close() {
      closed = true;
      hooks.wake();
      const l = lease;
      lease = null;
      if (l) await within(l.revoke(), ETCD_CALL_DEADLINE_MS);
      await within(running, ETCD_CALL_DEADLINE_MS);
      client.close();
    },
  };
}
