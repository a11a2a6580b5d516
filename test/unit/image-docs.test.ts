// docs/operations.md "Building and pushing the image": the image it names is
// the one the manifests use, at package.json's version, and its Kustomize
// overlay and Helm --set lines, rendered with the real kustomize and helm,
// replace that image with the pushed one in every container.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { parse, parseAllDocuments } from "yaml";
import { findBin, goBinDir, needs } from "../tools";

const ROOT = path.resolve(__dirname, "../..");
const gobin = goBinDir();
const helm = findBin("helm", gobin ? [gobin] : []);
const kustomize = findBin("kustomize", gobin ? [gobin] : []);

const doc = fs.readFileSync(path.join(ROOT, "docs/operations.md"), "utf8");
const section = doc.slice(doc.indexOf("## Building and pushing the image"), doc.indexOf("## Security"));
const blocks = (lang: string) =>
  Array.from(section.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))).map((m) => m[1]);
const version = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")).version as string;

type Doc = { kind: string; spec?: { template?: { spec?: { containers?: { image: string }[] } } } };
const images = (yamlText: string) =>
  parseAllDocuments(yamlText)
    .map((d) => d.toJS() as Doc)
    .filter((d) => d && d.kind === "Deployment")
    .flatMap((d) => (d.spec?.template?.spec?.containers ?? []).map((c) => c.image));

test("the image the docs name is the manifests' image, at package.json's version", () => {
  const named = /The manifests name the image `([^`]+)`/.exec(section);
  assert.ok(named, "the section names the image");
  assert.equal(named[1], `infera-gate/infera-gate:${version}`);
  assert.deepEqual(images(fs.readFileSync(path.join(ROOT, "deploy/kustomize/deployment.yaml"), "utf8")), [named[1]]);
  const values = parse(fs.readFileSync(path.join(ROOT, "deploy/helm/infera-gate/values.yaml"), "utf8")) as {
    image: { repository: string; tag: string };
  };
  assert.equal(`${values.image.repository}:${values.image.tag}`, named[1]);
  assert.ok(blocks("sh")[0].includes('docker build -t "$IMAGE:$VERSION" .'));
  assert.ok(fs.existsSync(path.join(ROOT, "Dockerfile")));
});

test(
  "the docs' Kustomize overlay and Helm values put the pushed image in every container",
  { skip: needs(!helm && "helm") || needs(!kustomize && "kustomize") },
  () => {
    const overlay = blocks("yaml").find((b) => /kind: Kustomization/.test(b));
    assert.ok(overlay, "the section has a kustomization");
    const k = parse(overlay) as { resources: string[]; images: { name: string; newName: string; newTag: string }[] };
    const want = `${k.images[0].newName}:${k.images[0].newTag}`;
    // The overlay as a user would place it, one level below the repository root.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-overlay-"));
    try {
      const base = path.relative(dir, path.join(ROOT, "deploy/kustomize"));
      assert.deepEqual(k.resources, ["../deploy/kustomize"]);
      fs.writeFileSync(path.join(dir, "kustomization.yaml"), overlay.replace("../deploy/kustomize", base));
      const r = spawnSync(kustomize as string, ["build", dir], { encoding: "utf8" });
      assert.equal(r.status, 0, r.stderr);
      const got = images(r.stdout);
      assert.ok(got.length > 0);
      assert.deepEqual(new Set(got), new Set([want]), "every container runs the pushed image");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    const helmCmd = blocks("sh").find((b) => b.startsWith("helm upgrade"));
    assert.ok(helmCmd, "the section has a helm command");
    const sets = Array.from(helmCmd.matchAll(/--set (\S+)/g)).flatMap((m) => ["--set", m[1]]);
    const h = spawnSync(helm as string, ["template", "llm", path.join(ROOT, "deploy/helm/infera-gate"), ...sets], {
      encoding: "utf8",
    });
    assert.equal(h.status, 0, h.stderr);
    const hi = images(h.stdout);
    assert.ok(hi.length > 0);
    assert.deepEqual(new Set(hi), new Set([want]), "the chart runs the same image");
  },
);
