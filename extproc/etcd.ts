// etcd discovery. Each worker registers, under a lease it keeps alive, the key
//   <prefix><worker-id>  ->  {"address":"host:port","role":"prefill|decode|mixed",
//                             "block_size":16,"kv_events":"tcp://host:5557",
//                             "kv_replay":"tcp://host:5558",   (optional: the replay ROUTER)
//                             "dp_size":2,"dp_events":"port|tagged"}  (optional: DP ranks = targets <id>/dp<r>)
// The router lists the prefix, then watches it: put = join/update, delete or
// lease expiry = leave. On a watch error it re-lists, so an etcd restart heals.
import { Etcd3, Lease } from "etcd3";
import { Fleet } from "./discovery";
import { Role, WorkerSpec } from "../core/router";
import { expandDp } from "../core/fleet";

export interface Registration {
  address: string;
  role?: Role;
  block_size?: number;
  kv_events?: string;
  kv_replay?: string;
  dp_size?: number;
  dp_events?: "port" | "tagged";
}

export function specFromEtcd(id: string, value: string): WorkerSpec {
  const r = JSON.parse(value) as Registration;
  if (typeof r.address !== "string" || !/^[^:\s]+:\d+$/.test(r.address)) throw new Error(`registration ${id}: 'address' must be host:port`);
  const role = r.role ?? "mixed";
  if (role !== "prefill" && role !== "decode" && role !== "mixed") throw new Error(`registration ${id}: unknown role '${role}'`);
  const spec: WorkerSpec = { id, address: r.address, role, blockSize: r.block_size, events: r.kv_events };
  if (typeof r.kv_replay === "string" && r.kv_replay) spec.replay = r.kv_replay;
  return spec;
}

/** A registration's route targets: one, or one per data-parallel rank. */
export function specsFromEtcd(id: string, value: string): WorkerSpec[] {
  const spec = specFromEtcd(id, value);
  const r = JSON.parse(value) as Registration;
  const n = typeof r.dp_size === "number" ? r.dp_size : 1;
  return expandDp(spec, n, r.dp_events === "tagged" ? "tagged" : "port");
}

export async function startEtcdDiscovery(app: Fleet): Promise<{ close(): Promise<void> }> {
  const prefix = app.opts.etcdPrefix;
  const client = new Etcd3({ hosts: app.opts.etcdEndpoint.split(","), dialTimeout: 2000 });
  let closed = false;
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
      app.log("warn", `etcd: ignoring ${key}: ${(e as Error).message}`);
    }
  };
  const resync = async () => {
    const all = await client.getAll().prefix(prefix).strings();
    const specs: WorkerSpec[] = [];
    for (const [k, v] of Object.entries(all)) {
      try {
        const got = specsFromEtcd(k.slice(prefix.length), v);
        targets[k.slice(prefix.length)] = got.map((s) => s.id);
        specs.push(...got);
      } catch (e) {
        app.log("warn", `etcd: ignoring ${k}: ${(e as Error).message}`);
      }
    }
    app.setWorkers(specs);
    app.setSynced?.(true);
    app.log("info", `etcd: ${specs.length} worker(s) under ${prefix}`);
  };
  const watch = async (): Promise<void> => {
    while (!closed) {
      try {
        await resync();
        const w = await client.watch().prefix(prefix).create();
        await new Promise<void>((resolve) => {
          w.on("put", (kv) => apply(kv.key.toString(), kv.value.toString()));
          w.on("delete", (kv) => apply(kv.key.toString(), null));
          w.on("disconnected", () => app.log("warn", "etcd: watch disconnected; keeping the last known fleet"));
          w.on("connected", () => {
            // Events may have been missed while away: list again.
            resync().catch((e) => app.log("warn", `etcd: resync failed: ${(e as Error).message}`));
          });
          w.on("error", (e) => {
            app.log("warn", `etcd: watch error: ${e.message}`);
            w.cancel().catch(() => undefined);
            resolve();
          });
          if (closed) resolve();
        });
      } catch (e) {
        if (closed) return;
        app.log("warn", `etcd: ${(e as Error).message}; retrying`);
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  };
  const loop = watch();
  void loop;
  return {
    async close() {
      closed = true;
      client.close();
    },
  };
}

/** Registers a worker under a kept-alive lease (used by the simulator and `infera-register`). */
export async function registerWorker(endpoint: string, prefix: string, id: string, reg: Registration, ttlSeconds = 5): Promise<{ close(): Promise<void> }> {
  const client = new Etcd3({ hosts: endpoint.split(","), dialTimeout: 2000 });
  let lease: Lease | null = null;
  let closed = false;
  const grant = async () => {
    while (!closed) {
      try {
        lease = client.lease(ttlSeconds, { autoKeepAlive: true });
        lease.on("lost", () => {
          if (!closed) setTimeout(() => void grant(), 200);
        });
        await lease.put(prefix + id).value(JSON.stringify(reg));
        return;
      } catch {
        await new Promise((r) => setTimeout(r, 300));
      }
    }
  };
  await grant();
  return {
    async close() {
      closed = true;
      await lease?.revoke().catch(() => undefined);
      client.close();
    },
  };
}
