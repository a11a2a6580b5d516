// k8s discovery through @kubernetes/client-node against test/k8s-api.ts, a
// local HTTP server speaking the API server's list/watch wire format (no
// kube-apiserver can run here; docs/gateways/inference-pool.md says so). Drives joins, leaves, pods
// turning unready, a dropped watch, a 410 Gone relist, InferencePool changes
// and DP ranks, and checks gRPC readiness follows discovery.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { startDiscovery, Discovery } from "../../runtime/discovery";
import { startExtProc } from "../../extproc/server";
import { specsFromPod } from "../../runtime/k8s";
import { FakeApi, pod, startFakeApi } from "../k8s-api";

const NS = "llm";
let api: FakeApi;
let kubeconfig: string;

before(async () => {
  api = await startFakeApi(NS);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-k8s-"));
  kubeconfig = path.join(dir, "kubeconfig");
  fs.writeFileSync(
    kubeconfig,
    [
      "apiVersion: v1",
      "kind: Config",
      "clusters: [{name: t, cluster: {server: '" + api.url + "', insecure-skip-tls-verify: true}}]",
      "users: [{name: t, user: {token: test-token}}]",
      "contexts: [{name: t, context: {cluster: t, user: t, namespace: " + NS + "}}]",
      "current-context: t",
      "",
    ].join("\n"),
  );
});
after(async () => api.close());

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const until = async (what: string, f: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (Date.now() < end && !f()) await new Promise((r) => setTimeout(r, 20));
  assert.ok(f(), `timed out waiting for ${what}`);
};
const fleet = (app: App) =>
  app.router
    .workers()
    .map((w) => `${w.id}=${w.role}@${w.address}${w.events ? "|" + w.events : ""}`)
    .sort();

function makeApp(extra: string[]): App {
  return new App(
    parseArgs(["--discovery-backend", "k8s", "--kubeconfig", kubeconfig, "--health-interval-ms", "0", ...extra], {}),
    (l, s) => process.env.K8S_DEBUG && console.error(l, s),
    noEvents,
  );
}

function healthCheck(port: number, service: string): Promise<number> {
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  // grpc.health.v1.HealthCheckRequest{service=1} / HealthCheckResponse{status=1}, encoded by hand.
  const enc = (s: string) => Buffer.concat([Buffer.from([0x0a, Buffer.byteLength(s)]), Buffer.from(s)]);
  return new Promise((resolve, reject) =>
    c.makeUnaryRequest(
      "/grpc.health.v1.Health/Check",
      enc,
      (b: Buffer) => (b.length >= 2 && b[0] === 0x08 ? b[1] : 0),
      service,
      (err, v) => {
        c.close();
        if (err) reject(err);
        else resolve(v as number);
      },
    ),
  );
}

test("InferencePool: selector + targetPorts pick ready pods; joins, leaves, unready, drops and 410 relists converge", async () => {
  api.put("inferencepools", {
    apiVersion: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    metadata: { name: "qwen", namespace: NS },
    spec: {
      selector: { matchLabels: { app: "vllm" } },
      targetPorts: [{ number: 8000 }],
      endpointPickerRef: { name: "infera-gate", port: { number: 9002 } },
    },
  });
  api.put(
    "pods",
    pod("p0", "10.0.0.10", {
      labels: { "llm-d.ai/role": "prefill" },
      annotations: { "infera-gate.io/kv-events-port": "5557" },
    }),
  );
  api.put(
    "pods",
    pod("d0", "10.0.0.20", {
      labels: { "llm-d.ai/role": "decode" },
      annotations: { "infera-gate.io/kv-events": "tcp://{ip}:5557" },
    }),
  );
  api.put("pods", pod("starting", "10.0.0.30", { ready: false }));
  api.put("pods", pod("other", "10.0.0.40", { labels: { app: "something-else" } }));

  const app = makeApp(["--inference-pool", "qwen"]);
  const g = await startExtProc(app, "127.0.0.1", 0);
  assert.equal(await healthCheck(g.port, "liveness"), 1, "liveness SERVING from the start");
  assert.equal(await healthCheck(g.port, "readiness"), 2, "readiness NOT_SERVING before discovery synced");
  let d: Discovery | null = null;
  try {
    d = await startDiscovery(app);
    await until("first sync", () => app.router.workers().length === 2);
    assert.deepEqual(fleet(app), [
      "d0=decode@10.0.0.20:8000|tcp://10.0.0.20:5557",
      "p0=prefill@10.0.0.10:8000|tcp://10.0.0.10:5557",
    ]);
    const podLists = api.requests.filter((r) => r.path.endsWith("/pods") && r.query.watch !== "true");
    assert.equal(podLists[0].query.labelSelector, "app=vllm", "the pool's matchLabels become the labelSelector");
    const poolReq = api.requests.find((r) => r.path.endsWith("/inferencepools"));
    assert.equal(poolReq?.query.fieldSelector, "metadata.name=qwen");
    await until("readiness SERVING", () => app.readiness().ready);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(await healthCheck(g.port, "readiness"), 1);
    assert.equal(await healthCheck(g.port, "envoy.service.ext_proc.v3.ExternalProcessor"), 1);

    // Join (becomes ready), turn unready, leave.
    api.put("pods", pod("starting", "10.0.0.30", { ready: true }));
    await until("starting joins", () => fleet(app).includes("starting=mixed@10.0.0.30:8000"));
    api.put("pods", pod("p0", "10.0.0.10", { ready: false, labels: { "llm-d.ai/role": "prefill" } }));
    await until("p0 unready leaves", () => !fleet(app).some((w) => w.startsWith("p0=")));
    api.del("pods", "d0");
    await until("d0 deleted", () => !fleet(app).some((w) => w.startsWith("d0=")));
    assert.deepEqual(fleet(app), ["starting=mixed@10.0.0.30:8000"]);

    // Dropped watch: a change made while disconnected arrives via the resumed watch.
    await until("pod watch open", () => api.openWatches("pods") === 1);
    api.dropWatches();
    api.put("pods", pod("d1", "10.0.0.21", { labels: { "llm-d.ai/role": "decode" } }));
    await until("d1 seen after reconnect", () => fleet(app).includes("d1=decode@10.0.0.21:8000"));

    // 410 Gone: history compacted while away -> full relist, deletions included.
    await until("pod watch open", () => api.openWatches("pods") === 1);
    const listsBefore = api.requests.filter((r) => r.path.endsWith("/pods") && r.query.watch !== "true").length;
    api.dropWatches();
    api.del("pods", "starting");
    api.put("pods", pod("m2", "10.0.0.50"));
    api.compact();
    await until(
      "relist after 410",
      () => fleet(app).join() === ["d1=decode@10.0.0.21:8000", "m2=mixed@10.0.0.50:8000"].join(),
      8000,
    );
    assert.ok(
      api.requests.filter((r) => r.path.endsWith("/pods") && r.query.watch !== "true").length > listsBefore,
      "a new list was made",
    );

    // The pool changes its target port: every worker moves.
    api.put("inferencepools", {
      apiVersion: "inference.networking.k8s.io/v1",
      kind: "InferencePool",
      metadata: { name: "qwen", namespace: NS },
      spec: {
        selector: { matchLabels: { app: "vllm" } },
        targetPorts: [{ number: 8200 }],
        endpointPickerRef: { name: "infera-gate", port: { number: 9002 } },
      },
    });
    await until(
      "ports follow the pool",
      () => fleet(app).join() === ["d1=decode@10.0.0.21:8200", "m2=mixed@10.0.0.50:8200"].join(),
    );

    // Everything leaves: readiness drops.
    api.del("pods", "d1");
    api.del("pods", "m2");
    await until("empty", () => app.router.workers().length === 0);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(await healthCheck(g.port, "readiness"), 2, "no workers -> NOT_SERVING");
  } finally {
    await d?.close();
    g.server.forceShutdown();
    await app.close();
  }
});

test("plain label selector, several target ports, and DP ranks from annotations", async () => {
  api.put(
    "pods",
    pod("dp", "10.0.1.1", {
      labels: { tier: "dp" },
      annotations: {
        "infera-gate.io/dp-size": "2",
        "infera-gate.io/kv-events-port": "5557",
        "infera-gate.io/block-size": "16",
      },
    }),
  );
  const app = makeApp(["--k8s-selector", "app=vllm,tier=dp", "--k8s-target-port", "9000"]);
  const d = await startDiscovery(app);
  try {
    await until("dp ranks", () => app.router.workers().length === 2);
    assert.deepEqual(fleet(app), [
      "dp-dp0=mixed@10.0.1.1:9000|tcp://10.0.1.1:5557",
      "dp-dp1=mixed@10.0.1.1:9001|tcp://10.0.1.1:5558",
    ]);
    assert.equal(app.router.worker("dp-dp0")?.blockSize, 16);
  } finally {
    await d.close();
    await app.close();
  }
  // Several pool target ports = one worker per port (ranks), regardless of dp-size.
  const specs = specsFromPod(pod("x", "10.0.2.2") as never, [8000, 8001, 8002]);
  assert.deepEqual(
    specs.map((s) => s.address),
    ["10.0.2.2:8000", "10.0.2.2:8001", "10.0.2.2:8002"],
  );
  assert.deepEqual(
    specsFromPod(pod("y", "10.0.2.3", { phase: "Pending" }) as never, [8000]),
    [],
    "not Running -> no worker",
  );
  assert.throws(
    () => specsFromPod(pod("z", "10.0.2.4", { labels: { "infera-gate.io/role": "router" } }) as never, [8000]),
    /unknown role/,
  );
});
