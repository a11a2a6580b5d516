// Fleet membership: the static --workers list, or etcd (see etcd.ts).
import { App } from "./app";

export interface Discovery {
  close(): Promise<void>;
}

export async function startDiscovery(app: App): Promise<Discovery> {
  if (app.opts.discovery === "etcd") {
    const { startEtcdDiscovery } = await import("./etcd");
    return startEtcdDiscovery(app);
  }
  app.setWorkers(app.opts.workers);
  return { close: async () => undefined };
}
