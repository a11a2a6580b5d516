// A stand-in Kubernetes API server for the k8s discovery tests (no kube-apiserver
// can be run on this machine, see docs/gateways/inference-pool.md). It speaks the wire format the real
// server does for the four calls discovery makes: list and watch of pods
// (labelSelector), list and watch of one InferencePool (fieldSelector
// metadata.name=...). Watches are newline-delimited JSON events on a held-open
// chunked response, resourceVersions are a global counter, and a watch from a
// resourceVersion older than the kept history gets a 410 ERROR event, as
// etcd compaction makes the real server do. Every request is recorded so the
// tests can assert the conversation (paths, selectors, resourceVersions).
import * as http from "http";

type Obj = {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace: string;
    resourceVersion?: string;
    labels?: Record<string, string>;
    [k: string]: unknown;
  };
  [k: string]: unknown;
};
interface Ev {
  rv: number;
  type: "ADDED" | "MODIFIED" | "DELETED";
  kind: "pods" | "inferencepools";
  obj: Obj;
}

export interface FakeApi {
  url: string;
  requests: { method: string; path: string; query: Record<string, string> }[];
  put(kind: "pods" | "inferencepools", obj: Obj): void;
  del(kind: "pods" | "inferencepools", name: string): void;
  /** Ends every open watch (as an API server restart or a load balancer idle timeout does). */
  dropWatches(): void;
  /** Forgets event history up to now: the next watch from an older resourceVersion gets 410 Gone. */
  compact(): void;
  openWatches(kind: "pods" | "inferencepools"): number;
  close(): Promise<void>;
}

function matches(sel: string | undefined, labels: Record<string, string> | undefined): boolean {
  if (!sel) return true;
  return sel.split(",").every((term) => {
    const [k, v] = term.split("=");
    return (labels ?? {})[k] === v;
  });
}

export async function startFakeApi(namespace: string): Promise<FakeApi> {
  let rv = 100;
  let compactedTo = 0;
  const store: Record<string, Record<string, Obj>> = { pods: {}, inferencepools: {} };
  const history: Ev[] = [];
  const watchers: { kind: string; sel: (o: Obj) => boolean; res: http.ServerResponse }[] = [];
  const requests: FakeApi["requests"] = [];

  const send = (w: (typeof watchers)[number], ev: Ev) => {
    if (w.kind === ev.kind && w.sel(ev.obj)) w.res.write(JSON.stringify({ type: ev.type, object: ev.obj }) + "\n");
  };
  const emit = (ev: Ev) => {
    history.push(ev);
    for (const w of watchers) send(w, ev);
  };

  const server = http.createServer((req, res) => {
    const u = new URL(req.url || "/", "http://x");
    const query = Object.fromEntries(u.searchParams.entries());
    requests.push({ method: req.method || "GET", path: u.pathname, query });
    const podPath = `/api/v1/namespaces/${namespace}/pods`;
    const poolPath = `/apis/inference.networking.k8s.io/v1/namespaces/${namespace}/inferencepools`;
    const kind = u.pathname === podPath ? "pods" : u.pathname === poolPath ? "inferencepools" : null;
    if (!kind || req.method !== "GET") {
      res.writeHead(404, { "content-type": "application/json" });
      return res.end(
        JSON.stringify({ kind: "Status", apiVersion: "v1", status: "Failure", reason: "NotFound", code: 404 }),
      );
    }
    const field = query.fieldSelector?.startsWith("metadata.name=")
      ? query.fieldSelector.slice("metadata.name=".length)
      : null;
    const sel = (o: Obj) => matches(query.labelSelector, o.metadata.labels) && (!field || o.metadata.name === field);
    if (query.watch === "true" || query.watch === "1") {
      res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
      res.flushHeaders();
      const from = Number(query.resourceVersion || "0");
      if (from && from < compactedTo) {
        res.end(
          JSON.stringify({
            type: "ERROR",
            object: {
              kind: "Status",
              apiVersion: "v1",
              status: "Failure",
              message: `too old resource version: ${from} (${compactedTo})`,
              reason: "Expired",
              code: 410,
            },
          }) + "\n",
        );
        return;
      }
      const w = { kind, sel, res };
      for (const ev of history) if (ev.rv > from) send(w, ev);
      watchers.push(w);
      req.on("close", () => {
        const i = watchers.indexOf(w);
        if (i >= 0) watchers.splice(i, 1);
      });
      return;
    }
    const items = Object.values(store[kind]).filter(sel);
    const list =
      kind === "pods"
        ? { kind: "PodList", apiVersion: "v1" }
        : { kind: "InferencePoolList", apiVersion: "inference.networking.k8s.io/v1" };
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ ...list, metadata: { resourceVersion: String(rv) }, items }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as { port: number }).port;

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    put(kind, obj) {
      rv++;
      const o = JSON.parse(JSON.stringify(obj)) as Obj;
      o.metadata.namespace = namespace;
      o.metadata.resourceVersion = String(rv);
      const type = store[kind][o.metadata.name] ? "MODIFIED" : "ADDED";
      store[kind][o.metadata.name] = o;
      emit({ rv, type, kind, obj: o });
    },
    del(kind, name) {
      const o = store[kind][name];
      if (!o) return;
      rv++;
      delete store[kind][name];
      emit({ rv, type: "DELETED", kind, obj: { ...o, metadata: { ...o.metadata, resourceVersion: String(rv) } } });
    },
    dropWatches() {
      for (const w of watchers.splice(0)) w.res.end();
    },
    compact() {
      compactedTo = rv;
      history.length = 0;
    },
    openWatches: (kind) => watchers.filter((w) => w.kind === kind).length,
    async close() {
      for (const w of watchers.splice(0)) w.res.destroy();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** A pod as the API returns it (trimmed to what discovery reads). */
export function pod(
  name: string,
  ip: string,
  opts: { ready?: boolean; labels?: Record<string, string>; annotations?: Record<string, string>; phase?: string } = {},
): Obj {
  const ready = opts.ready ?? true;
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      name,
      namespace: "",
      uid: `uid-${name}`,
      labels: { app: "vllm", ...(opts.labels ?? {}) },
      annotations: opts.annotations ?? {},
    },
    spec: {
      containers: [{ name: "vllm", image: "vllm/vllm-openai", ports: [{ containerPort: 8000, protocol: "TCP" }] }],
    },
    status: {
      phase: opts.phase ?? "Running",
      podIP: ip,
      podIPs: [{ ip }],
      conditions: [
        { type: "Initialized", status: "True" },
        { type: "Ready", status: ready ? "True" : "False" },
        { type: "ContainersReady", status: ready ? "True" : "False" },
        { type: "PodScheduled", status: "True" },
      ],
    },
  };
}
