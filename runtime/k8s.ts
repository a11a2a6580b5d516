// Kubernetes discovery (--discovery-backend k8s): the fleet is the set of
// ready pods behind an InferencePool (inference.networking.k8s.io/v1: its
// spec.selector.matchLabels and spec.targetPorts), or behind a plain label
// selector (--k8s-selector, --k8s-target-port). Pods are listed, then watched;
// after every change the whole fleet is recomputed from the informer cache and
// handed to setWorkers, so a missed or duplicated event cannot leave a stale
// worker behind (the same list-then-watch shape as etcd.ts). A watch that
// breaks is re-listed after a short pause; a 410 Gone re-lists at once.
//
// What a pod says about itself (labels or annotations; annotations win):
//   infera-gate.io/role        prefill | decode | mixed (llm-d's label llm-d.ai/role with
//                              prefill | decode | both is read too; both = mixed)
//   infera-gate.io/dp-size     data-parallel ranks per pod when the pool has a single
//                              target port: rank r serves on targetPort + r
//   infera-gate.io/kv-events   KV-event endpoint, "{ip}" and "{rank}" substituted
//                              (e.g. tcp://{ip}:5557); for ZMQ and several ranks prefer
//   infera-gate.io/kv-events-port  N: rank r publishes on tcp://<pod-ip>:N+r (vLLM's
//                              per-rank publisher port offset)
//   infera-gate.io/block-size  the engine's KV block size (a mismatch excludes the pod)
// A pod counts only while it is Running, has a pod IP, is not terminating, and
// its Ready condition is True; turning unready takes it out like an etcd
// lease expiry (in-flight reservations drain on their own).
import * as k8s from "@kubernetes/client-node";
import { Fleet } from "./discovery";
import { Role, WorkerSpec } from "../core/router";

export const POOL_GROUP = "inference.networking.k8s.io";
export const POOL_VERSION = "v1";

export interface PoolTarget {
  selector: string;
  ports: number[];
}

/** matchLabels -> "k=v,k2=v2" (what the API's labelSelector parameter takes). */
export function selectorString(matchLabels: Record<string, string>): string {
  return Object.keys(matchLabels)
    .sort()
    .map((k) => `${k}=${matchLabels[k]}`)
    .join(",");
}

export function poolTarget(
  pool: { spec?: { selector?: { matchLabels?: Record<string, string> }; targetPorts?: { number?: number }[] } },
  name: string,
): PoolTarget {
  const ml = pool.spec?.selector?.matchLabels;
  if (!ml || !Object.keys(ml).length) throw new Error(`InferencePool ${name}: spec.selector.matchLabels is empty`);
  const ports = (pool.spec?.targetPorts ?? [])
    .map((p) => Number(p.number))
    .filter((n) => Number.isInteger(n) && n > 0 && n < 65536);
  if (!ports.length) throw new Error(`InferencePool ${name}: spec.targetPorts has no valid port`);
  return { selector: selectorString(ml), ports };
}

function meta(pod: k8s.V1Pod, key: string): string | undefined {
  return pod.metadata?.annotations?.[key] ?? pod.metadata?.labels?.[key];
}

export function podReady(pod: k8s.V1Pod): boolean {
  if (pod.metadata?.deletionTimestamp) return false;
  if (pod.status?.phase !== "Running" || !pod.status?.podIP) return false;
  return (pod.status.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");
}

function roleOf(pod: k8s.V1Pod): Role {
  const r = meta(pod, "infera-gate.io/role") ?? meta(pod, "llm-d.ai/role") ?? "mixed";
  if (r === "prefill" || r === "decode" || r === "mixed") return r;
  if (r === "both") return "mixed";
  throw new Error(`unknown role '${r}'`);
}

/** One WorkerSpec per data-parallel rank of a ready pod; [] for a pod that should get no traffic. */
export function specsFromPod(pod: k8s.V1Pod, ports: number[]): WorkerSpec[] {
  if (!podReady(pod)) return [];
  const ip = pod.status!.podIP as string;
  const host = ip.includes(":") ? `[${ip}]` : ip;
  const name = pod.metadata?.name ?? ip;
  const role = roleOf(pod);
  const dp = Number(meta(pod, "infera-gate.io/dp-size") ?? "1");
  if (!Number.isInteger(dp) || dp < 1 || dp > 64)
    throw new Error(`infera-gate.io/dp-size '${meta(pod, "infera-gate.io/dp-size")}' is not 1..64`);
  const rankPorts = ports.length > 1 ? ports : Array.from({ length: dp }, (_, r) => ports[0] + r);
  const bsRaw = meta(pod, "infera-gate.io/block-size");
  const blockSize = bsRaw === undefined ? undefined : Number(bsRaw);
  if (blockSize !== undefined && !(Number.isInteger(blockSize) && blockSize > 0))
    throw new Error(`infera-gate.io/block-size '${bsRaw}' is not a positive integer`);
  const evTpl = meta(pod, "infera-gate.io/kv-events");
  const evPort = meta(pod, "infera-gate.io/kv-events-port");
  return rankPorts.map((port, r) => {
    let events: string | undefined;
    if (evTpl) events = evTpl.split("{ip}").join(host).split("{rank}").join(String(r));
    else if (evPort) events = `tcp://${host}:${Number(evPort) + r}`;
    return { id: rankPorts.length > 1 ? `${name}-dp${r}` : name, address: `${host}:${port}`, role, blockSize, events };
  });
}

export interface K8sDiscovery {
  close(): Promise<void>;
  /** True once the first pod list has been applied. */
  synced(): boolean;
}

export async function startK8sDiscovery(app: Fleet & { setSynced?(v: boolean): void }): Promise<K8sDiscovery> {
  const o = app.opts;
  const kc = new k8s.KubeConfig();
  if (o.kubeconfig) kc.loadFromFile(o.kubeconfig);
  else kc.loadFromDefault();
  const ns = o.k8sNamespace || kc.getContextObject(kc.getCurrentContext())?.namespace || "default";
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const custom = kc.makeApiClient(k8s.CustomObjectsApi);
  const watch = new k8s.Watch(kc);
  let closed = false;
  let isSynced = false;
  let pods: k8s.ListWatch<k8s.V1Pod> | null = null;
  let poolInformer: k8s.ListWatch<k8s.KubernetesObject> | null = null;
  let target: PoolTarget | null = null;
  let retry: NodeJS.Timeout | null = null;
  let applied = "";

  const recompute = () => {
    if (!pods || !target) return;
    const specs: WorkerSpec[] = [];
    for (const pod of pods.list(ns)) {
      try {
        specs.push(...specsFromPod(pod, target.ports));
      } catch (e) {
        app.log("warn", "k8s: ignoring a pod", { pod: pod.metadata?.name ?? "", error: (e as Error).message });
      }
    }
    // Pod status churns (conditions, timestamps) far more often than the fleet does.
    const key = JSON.stringify(specs.map((w) => [w.id, w.address, w.role, w.blockSize, w.events]).sort());
    if (key === applied) return;
    applied = key;
    app.setWorkers(specs);
  };

  const startPods = async (t: PoolTarget) => {
    const old = pods;
    pods = null; // its abort error must not schedule a retry
    if (old) await old.stop();
    target = t;
    const inf = new k8s.ListWatch<k8s.V1Pod>(
      `/api/v1/namespaces/${ns}/pods`,
      watch,
      async () => {
        const list = await core.listNamespacedPod({ namespace: ns, labelSelector: t.selector });
        // Applied after the informer has folded the list in (it calls us back per object first).
        setImmediate(() => {
          if (pods !== inf) return;
          recompute();
          if (!isSynced)
            app.log("info", "k8s: pods listed", { pods: inf.list(ns).length, selector: t.selector, namespace: ns });
          isSynced = true;
          app.setSynced?.(true);
        });
        return list;
      },
      false,
      t.selector,
    );
    pods = inf;
    const onChange = () => {
      if (pods === inf && isSynced) recompute();
    };
    inf.on("add", onChange);
    inf.on("update", onChange);
    inf.on("delete", onChange);
    inf.on("error", (err: unknown) => {
      if (closed || pods !== inf) return;
      app.log("warn", "k8s: pod watch failed; keeping the last known fleet, re-listing", {
        error: String((err as Error)?.message ?? err),
      });
      retry = setTimeout(() => {
        retry = null;
        if (!closed && pods === inf) inf.start().catch(() => undefined);
      }, 500);
    });
    await inf.start();
  };

  if (o.inferencePool) {
    const name = o.inferencePool;
    const plural = "inferencepools";
    const path = `/apis/${POOL_GROUP}/${POOL_VERSION}/namespaces/${ns}/${plural}`;
    const onPool = (obj: k8s.KubernetesObject) => {
      if (obj.metadata?.name !== name) return;
      let t: PoolTarget;
      try {
        t = poolTarget(obj as Parameters<typeof poolTarget>[0], name);
      } catch (e) {
        app.log("warn", "k8s: keeping the last known fleet", { error: (e as Error).message });
        return;
      }
      if (target && t.selector === target.selector && t.ports.join() === target.ports.join()) return;
      app.log("info", "k8s: InferencePool selects pods", {
        pool: `${ns}/${name}`,
        selector: t.selector,
        ports: t.ports.join(","),
      });
      startPods(t).catch((e) => app.log("warn", "k8s: pod watch start failed", { error: (e as Error).message }));
    };
    const inf = new k8s.ListWatch<k8s.KubernetesObject>(
      path,
      watch,
      () =>
        custom.listNamespacedCustomObject({
          group: POOL_GROUP,
          version: POOL_VERSION,
          namespace: ns,
          plural,
          fieldSelector: `metadata.name=${name}`,
        }) as Promise<k8s.KubernetesListObject<k8s.KubernetesObject>>,
      false,
      undefined,
      `metadata.name=${name}`,
    );
    poolInformer = inf;
    inf.on("add", onPool);
    inf.on("update", onPool);
    inf.on("delete", (obj) => {
      if (obj.metadata?.name === name)
        app.log("warn", "k8s: InferencePool was deleted; keeping the last known fleet", { pool: `${ns}/${name}` });
    });
    inf.on("error", (err: unknown) => {
      if (closed) return;
      app.log("warn", "k8s: InferencePool watch failed; retrying", { error: String((err as Error)?.message ?? err) });
      setTimeout(() => !closed && inf.start().catch(() => undefined), 1000).unref();
    });
    await inf.start();
  } else {
    if (!o.k8sSelector) throw new Error("--discovery-backend k8s needs --inference-pool NAME or --k8s-selector LABELS");
    await startPods({ selector: o.k8sSelector, ports: o.k8sTargetPorts });
  }

  return {
    synced: () => isSynced,
    async close() {
      closed = true;
      if (retry) clearTimeout(retry);
      await poolInformer?.stop();
      await pods?.stop();
    },
  };
}
