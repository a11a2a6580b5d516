// deploy/: the Kustomize bases, the Helm chart and the gateway examples are
// rendered with the real helm and kustomize and schema-validated
// (scripts/validate-deploy.sh); the rendered router command line must parse
// with the router's own flag parser, and the InferencePool must point at the
// Service the router listens behind.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { parseAllDocuments } from "yaml";
import { parseArgs } from "../../runtime/config";
import { needs, findBin, goBinDir, pythonMissing } from "../tools";

const ROOT = path.resolve(__dirname, "../..");
const gobin = goBinDir();
const helm = findBin("helm", gobin ? [gobin] : []);
const kustomize = findBin("kustomize", gobin ? [gobin] : []);
const noPy = pythonMissing(["kubernetes_validate", "jsonschema", "yaml"], "kubernetes-validate");
const missing = [!helm && "helm", !kustomize && "kustomize", noPy && "python kubernetes-validate"].filter(Boolean);
// helm and kustomize are found on PATH or in $(go env GOPATH)/bin, where the set-up's `go install` puts them.
// Under CI=true / INFERA_REQUIRE_TOOLS=1 a missing one fails (test/tools.ts) instead of skipping.
const skip = needs(missing.length > 0 && `deploy validation tools not installed: ${missing.join(", ")}`);

type Doc = {
  kind: string;
  metadata: { name: string };
  spec: any;
  rules?: any[];
  data?: Record<string, string>;
  type?: string;
};
const render = (cmd: string, args: string[]): Doc[] => {
  const r = spawnSync(cmd, args, { cwd: ROOT, encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return parseAllDocuments(r.stdout)
    .map((d) => d.toJS())
    .filter(Boolean);
};

test("every manifest renders and passes schema validation", { skip }, () => {
  // The binaries found above, wherever they are (PATH or GOPATH/bin).
  const r = spawnSync("bash", ["scripts/validate-deploy.sh"], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, HELM: helm!, KUSTOMIZE: kustomize! },
  });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /\b(\d+) documents, 0 invalid/);
});

test("the validator rejects what the API server would", { skip: needs(noPy) }, () => {
  const bad = [
    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicaz: 1\n  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}",
    "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: p}\nspec:\n  selector: {matchLabels: {app: x}}\n  endpointPickerRef: {name: e, port: {number: 9002}}",
    "apiVersion: example.com/v1\nkind: Unknown\nmetadata: {name: u}",
  ].join("\n---\n");
  const r = spawnSync("python3", ["scripts/validate-k8s.py", "-"], { cwd: ROOT, input: bad, encoding: "utf8" });
  assert.equal(r.status, 1);
  assert.match(r.stdout, /FAIL -: Deployment\/x: .*replicaz/);
  assert.match(r.stdout, /FAIL -: InferencePool\/p: .*targetPorts/);
  assert.match(r.stdout, /FAIL -: Unknown\/u: no schema/);
});

for (const [label, cmd, args] of [
  ["kustomize base", "kustomize", ["build", "deploy/kustomize"]],
  [
    "helm chart",
    "helm",
    [
      "template",
      "llm",
      "deploy/helm/infera-gate",
      "--namespace",
      "llm",
      "--set",
      "router.shedActiveBlocks=8",
      "--set",
      "router.sheddableObjectives={batch}",
    ],
  ],
  [
    "helm chart, mTLS",
    "helm",
    [
      "template",
      "llm",
      "deploy/helm/infera-gate",
      "--namespace",
      "llm",
      "--set",
      "extProc.clientIdentities={infera-gateway}",
    ],
  ],
  ["istio example", "kustomize", ["build", "deploy/examples/istio"]],
] as const) {
  test(
    `${label}: the router's flags parse, the pool points at the router's gRPC Service, RBAC covers the watch, the control plane is closed`,
    { skip },
    () => {
      const docs = render(cmd === "helm" ? helm! : kustomize!, [...args]);
      const dep = docs.find((d) => d.kind === "Deployment")!;
      const pod = dep.spec.template.spec;
      const c = pod.containers[0];
      assert.deepEqual(
        c.command,
        ["node", "dist/cli/main.js", "router"],
        "the image runs compiled JavaScript (no tsx at run time)",
      );
      // Files the args name live in the pod's Secret volumes: parse with them mapped to a scratch dir.
      const mounts: { name: string; mountPath: string }[] = c.volumeMounts;
      const secretOf = (file: string) => {
        const m = mounts.find((v) => file.startsWith(v.mountPath + "/"));
        const vol = m && pod.volumes.find((v: { name: string }) => v.name === m.name);
        return vol?.secret
          ? { secret: vol.secret.secretName as string, key: file.slice(m!.mountPath.length + 1) }
          : null;
      };
      const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "infera-deploy-"));
      const o = parseArgs(
        c.args.map((a: string) => {
          const m = /^(--[a-z-]+)=(\/etc\/infera-gate\/.*)$/.exec(a);
          if (!m) return a;
          const f = path.join(scratch, m[2]);
          fs.mkdirSync(path.dirname(f), { recursive: true });
          fs.writeFileSync(f, "x");
          return `${m[1]}=${f}`;
        }),
        {},
      );
      assert.equal(o.discovery, "k8s");
      assert.equal(o.host, "0.0.0.0");
      const svc = docs.find((d) => d.kind === "Service")!;
      const grpcPort = svc.spec.ports.find((p: { appProtocol: string }) => p.appProtocol === "grpc");
      assert.equal(grpcPort.port, o.extProcPort);
      // ext_proc over TLS, the admin token from a Secret, both from mounted Secrets.
      assert.ok(o.extProcTls, "ext_proc serves TLS");
      assert.ok(o.adminToken, "an admin token is set");
      const files = c.args
        .filter((a: string) => /^--(ext-proc-tls-[a-z-]+|admin-token-file)=/.test(a))
        .map((a: string) => a.split("=")[1]);
      assert.ok(files.length >= 3);
      const kustomization = fs.readFileSync(path.join(ROOT, "deploy/kustomize/kustomization.yaml"), "utf8");
      for (const f of files) {
        const s = secretOf(f);
        assert.ok(s, `${f} comes from a Secret volume`);
        const rendered = docs.find((d) => d.kind === "Secret" && d.metadata.name === s!.secret);
        // The chart renders its Secrets; the Kustomize base tells the operator how to make them.
        if (rendered) assert.ok(rendered.data && s!.key in rendered.data, `Secret ${s!.secret} has key ${s!.key}`);
        else
          assert.ok(
            kustomization.includes(s!.secret),
            `Secret ${s!.secret} is neither rendered nor documented in kustomization.yaml`,
          );
      }
      if (o.extProcClientIdentities) assert.ok(o.extProcTls!.clientCa, "identities come with mTLS");
      // Probes on the admin port's open paths (the kubelet's gRPC probe has no TLS).
      const metricsPort = c.ports.find((p: { name: string }) => p.name === "metrics");
      assert.equal(metricsPort.containerPort, o.adminPort);
      assert.deepEqual([c.readinessProbe.httpGet.path, c.livenessProbe.httpGet.path], ["/readyz", "/livez"]);
      assert.ok(
        [c.readinessProbe.httpGet.port, c.livenessProbe.httpGet.port].every(
          (p: string | number) => p === "metrics" || p === o.adminPort,
        ),
      );
      // The NetworkPolicy selects the router's pods and admits only named peers to ext_proc.
      const np = docs.find((d) => d.kind === "NetworkPolicy")!;
      assert.ok(np, "a NetworkPolicy ships");
      const labels = dep.spec.template.metadata.labels;
      assert.ok(
        Object.entries(np.spec.podSelector.matchLabels).every(([k, v]) => labels[k] === v),
        "it selects the router's pods",
      );
      const grpcRules = np.spec.ingress.filter((r: { ports?: { port: string | number }[] }) =>
        (r.ports ?? []).some((p) => p.port === "grpc" || p.port === o.extProcPort),
      );
      assert.ok(grpcRules.length >= 1);
      for (const r of grpcRules)
        assert.ok(Array.isArray(r.from) && r.from.length > 0, "ext_proc admits only named peers");
      assert.ok(
        np.spec.ingress.every(
          (r: { from?: unknown[]; ports?: { port: string | number }[] }) =>
            (r.from && r.from.length) || (r.ports ?? []).every((p) => p.port === "metrics" || p.port === o.adminPort),
        ),
        "only the admin port is open to all",
      );
      const pool = docs.find((d) => d.kind === "InferencePool");
      if (pool) {
        assert.equal(o.inferencePool, pool.metadata.name);
        assert.equal(pool.spec.endpointPickerRef.name, svc.metadata.name);
        assert.equal(pool.spec.endpointPickerRef.port.number, grpcPort.port);
      } else assert.ok(o.k8sSelector, "without a pool, a label selector");
      const role = docs.find((d) => d.kind === "Role")!;
      const can = (res: string) =>
        role.rules!.some(
          (r: { resources: string[]; verbs: string[] }) =>
            r.resources.includes(res) && ["list", "watch"].every((v) => r.verbs.includes(v)),
        );
      assert.ok(can("pods") && can("inferencepools"));
    },
  );
}

test(
  "helm chart with mTLS: the router serves the chart's generated certificate and admits the gateway certificate it issues, nothing else",
  { skip },
  async () => {
    const grpc = await import("@grpc/grpc-js");
    const { App } = await import("../../runtime/app");
    const { startExtProc, ExtProcService } = await import("../../extproc/server");
    const { reqHeaders } = await import("../extproc-client");
    const { makePki } = await import("../pki");
    const docs = render(helm!, [
      "template",
      "llm",
      "deploy/helm/infera-gate",
      "--namespace",
      "llm",
      "--set",
      "extProc.clientIdentities={infera-gateway}",
    ]);
    const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "infera-helm-tls-"));
    const secret = (name: string, key: string) => {
      const d = docs.find((x) => x.kind === "Secret" && x.metadata.name === name)!;
      const f = path.join(scratch, `${name}-${key}`);
      fs.writeFileSync(f, Buffer.from(d.data![key], "base64"));
      return f;
    };
    const c = docs.find((d) => d.kind === "Deployment")!.spec.template.spec.containers[0];
    // The rendered args, with the mounted Secret's files and the test's own ports and fleet.
    const args = c.args
      .filter((a: string) => /^--(ext-proc-tls-|ext-proc-client-identities|ext-proc-max-buffered)/.test(a))
      .map((a: string) =>
        a.replace(
          /^(--ext-proc-tls-[a-z-]+)=\/etc\/infera-gate\/ext-proc-tls\/(.*)$/,
          (_m: string, flag: string, key: string) => `${flag}=${secret("llm-infera-gate-ext-proc-tls", key)}`,
        ),
      );
    const app = new App(
      parseArgs(["--workers", "127.0.0.1:7001", "--health-interval-ms", "0", ...args], {}),
      () => undefined,
      { subscribe: () => ({ close() {} }), close: async () => undefined },
    );
    app.setWorkers(app.opts.workers);
    const s = await startExtProc(app, "127.0.0.1", 0);
    const ca = fs.readFileSync(secret("llm-infera-gate-gateway-tls", "ca.crt"));
    const other = makePki();
    const opts = { "grpc.ssl_target_name_override": "llm-infera-gate.llm.svc", "grpc.use_local_subchannel_pool": 1 };
    const clients = {
      gateway: new grpc.Client(
        `127.0.0.1:${s.port}`,
        grpc.credentials.createSsl(
          ca,
          fs.readFileSync(secret("llm-infera-gate-gateway-tls", "tls.key")),
          fs.readFileSync(secret("llm-infera-gate-gateway-tls", "tls.crt")),
        ),
        opts,
      ),
      anonymous: new grpc.Client(`127.0.0.1:${s.port}`, grpc.credentials.createSsl(ca), opts),
      "another CA": new grpc.Client(
        `127.0.0.1:${s.port}`,
        grpc.credentials.createSsl(ca, fs.readFileSync(other.clientKey), fs.readFileSync(other.clientCert)),
        opts,
      ),
    };
    const def = ExtProcService.Process;
    const first = (cl: InstanceType<typeof grpc.Client>) =>
      new Promise<string>((resolve) => {
        const call = cl.makeBidiStreamRequest(
          def.path,
          def.requestSerialize,
          def.responseDeserialize,
          new grpc.Metadata(),
          { deadline: Date.now() + 5000 },
        );
        call.on("data", (m: { response: { case: string } }) => {
          resolve(m.response.case);
          call.cancel();
        });
        call.on("error", (e: { code: number }) => resolve(grpc.status[e.code]));
        call.write(reqHeaders("/v1/models", "GET", true));
      });
    try {
      const got: Record<string, string> = {};
      for (const [k, cl] of Object.entries(clients)) got[k] = await first(cl);
      assert.deepEqual(got, { gateway: "requestHeaders", anonymous: "UNAVAILABLE", "another CA": "UNAVAILABLE" });
    } finally {
      for (const cl of Object.values(clients)) cl.close();
      s.server.forceShutdown();
      await app.close();
    }
  },
);
