// Fleet membership: the static --workers list, or etcd (see etcd.ts).
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
}

export interface Discovery {
  close(): Promise<void>;
}

export async function startDiscovery(app: Fleet): Promise<Discovery> {
  if (app.opts.discovery === "etcd") {
    const { startEtcdDiscovery } = await import("./etcd");
    return startEtcdDiscovery(app);
  }
  app.setWorkers(app.opts.workers);
  return { close: async () => undefined };
}
