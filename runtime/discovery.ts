// Fleet membership: the static --workers list, etcd (see etcd.ts) or Kubernetes (k8s.ts).
import { Logger } from "./app";
import { Options } from "./config";
import { WorkerSpec } from "../core/router";

/** What discovery drives: the ext_proc App, or the nginx bridge. */
export interface Fleet {
  opts: Options;
  log: Logger;
  setWorkers(list: WorkerSpec[]): void;
  addWorker(w: WorkerSpec): void;
  removeWorker(id: string): void;
  /** Discovery has applied its first full view of the fleet (gRPC readiness waits for it). */
  setSynced?(v: boolean): void;
  /** Discovery's connection state, for readiness. */
  setDiscoveryState?(ok: boolean, detail: string): void;
  /** How many workers the fleet holds (for logs). */
  listWorkerCount?(): number;
}

export interface Discovery {
  close(): Promise<void>;
}

export async function startDiscovery(app: Fleet): Promise<Discovery> {
  if (app.opts.discovery === "etcd") {
    const { startEtcdDiscovery } = await import("./etcd");
    return startEtcdDiscovery(app);
  }
  if (app.opts.discovery === "k8s") {
    const { startK8sDiscovery } = await import("./k8s");
    return startK8sDiscovery(app);
  }
  app.setWorkers(app.opts.workers);
  app.setSynced?.(true);
  return { close: async () => undefined };
}
