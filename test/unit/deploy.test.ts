// deploy/: the Kustomize bases, the Helm chart and the gateway examples are
// rendered with the real helm and kustomize and schema-validated
// (scripts/validate-deploy.sh); the rendered router command line must parse
// with the router's own flag parser, and the InferencePool must point at the
// Service the router listens behind.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
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

type Doc = { kind: string; metadata: { name: string }; spec: any; rules?: any[] };
const render = (cmd: string, args: string[]): Doc[] => {
  const r = spawnSync(cmd, args, { cwd: ROOT, encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return parseAllDocuments(r.stdout).map((d) => d.toJS()).filter(Boolean);
};

test("every manifest renders and passes schema validation", { skip }, () => {
  // The binaries found above, wherever they are (PATH or GOPATH/bin).
  const r = spawnSync("bash", ["scripts/validate-deploy.sh"], { cwd: ROOT, encoding: "utf8", env: { ...process.env, HELM: helm!, KUSTOMIZE: kustomize! } });
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
  ["helm chart", "helm", ["template", "llm", "deploy/helm/infera-gate", "--namespace", "llm", "--set", "router.shedActiveBlocks=8", "--set", "router.sheddableObjectives={batch}"]],
  ["istio example", "kustomize", ["build", "deploy/examples/istio"]],
] as const) {
  test(`${label}: the router's flags parse, the pool points at the router's gRPC Service, RBAC covers the watch`, { skip }, () => {
    const docs = render(cmd === "helm" ? helm! : kustomize!, [...args]);
    const dep = docs.find((d) => d.kind === "Deployment")!;
    const c = dep.spec.template.spec.containers[0];
    assert.deepEqual(c.command, ["node", "dist/cli/main.js", "router"], "the image runs compiled JavaScript (no tsx at run time)");
    const o = parseArgs(c.args, {});
    assert.equal(o.discovery, "k8s");
    assert.equal(o.host, "0.0.0.0");
    const svc = docs.find((d) => d.kind === "Service")!;
    const grpcPort = svc.spec.ports.find((p: { appProtocol: string }) => p.appProtocol === "grpc");
    assert.equal(grpcPort.port, o.extProcPort);
    assert.equal(c.readinessProbe.grpc.service, "readiness");
    assert.equal(c.livenessProbe.grpc.service, "liveness");
    assert.equal(c.readinessProbe.grpc.port, o.extProcPort);
    const pool = docs.find((d) => d.kind === "InferencePool");
    if (pool) {
      assert.equal(o.inferencePool, pool.metadata.name);
      assert.equal(pool.spec.endpointPickerRef.name, svc.metadata.name);
      assert.equal(pool.spec.endpointPickerRef.port.number, grpcPort.port);
    } else assert.ok(o.k8sSelector, "without a pool, a label selector");
    const role = docs.find((d) => d.kind === "Role")!;
    const can = (res: string) => role.rules!.some((r: { resources: string[]; verbs: string[] }) => r.resources.includes(res) && ["list", "watch"].every((v) => r.verbs.includes(v)));
    assert.ok(can("pods") && can("inferencepools"));
  });
}
