// The README and docs/ as a reader meets them: the README stays short, its
// set-up commands are the ones CI runs, and every relative link (file and
// #anchor) in README.md, CONTRIBUTING.md and docs/ resolves.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { spawnSync } from "child_process";

const ROOT = path.resolve(__dirname, "../..");
const read = (rel: string) => fs.readFileSync(path.join(ROOT, rel), "utf8");

/** The shell commands of the first fenced block under the README's "Set up and test" heading. */
export function readmeSetupCommands(readme: string): string[] {
  const at = readme.search(/^## Set up and test\s*$/m);
  if (at < 0) throw new Error('README has no "## Set up and test" section');
  const rest = readme.slice(at);
  const m = /^```(?:sh|bash|shell)?\n([\s\S]*?)^```/m.exec(rest);
  if (!m) throw new Error('"Set up and test" has no fenced command block');
  return m[1].split("\n").map(stripComment).filter(Boolean);
}

/** The commands .ci/run runs: not comments, shell options, cd or exports; a leading `timeout N` is ignored. */
export function ciCommands(script: string): string[] {
  return script
    .split("\n")
    .map(stripComment)
    .filter((l) => l && !/^(set|cd|export)\s/.test(l))
    .map((l) => l.replace(/^timeout\s+\S+\s+/, ""));
}

function stripComment(line: string): string {
  return line.replace(/(^|\s)#.*$/, "").trim();
}

test("README.md is at most 200 lines", () => {
  const n = read("README.md").split("\n").length;
  assert.ok(n <= 200, `README.md has ${n} lines; move detail to docs/`);
});

test("the README's two set-up commands are exactly what .ci/run runs", () => {
  const readme = readmeSetupCommands(read("README.md"));
  const ci = ciCommands(read(".ci/run"));
  assert.equal(readme.length, 2, `README set-up block: ${JSON.stringify(readme)}`);
  assert.deepEqual(ci, readme);
});

test("the command parsers see a difference between README and .ci/run", () => {
  // Guards the test above against passing vacuously: an extra CI step or another README command is seen.
  const readme = "x\n## Set up and test\n\n```sh\nbash scripts/setup.sh\nnpm test   # all\n```\n";
  assert.deepEqual(readmeSetupCommands(readme), ["bash scripts/setup.sh", "npm test"]);
  assert.deepEqual(ciCommands("#!/bin/sh\nset -e\ncd x\nexport CI=1\nbash scripts/setup.sh\ntimeout 99 npm test\n"), [
    "bash scripts/setup.sh",
    "npm test",
  ]);
  assert.notDeepEqual(ciCommands("bash scripts/setup.sh\npip install x\nnpm test\n"), readmeSetupCommands(readme));
});

test("scripts/setup.sh and .ci/run are valid bash", () => {
  for (const f of ["scripts/setup.sh", ".ci/run"]) {
    const r = spawnSync("bash", ["-n", path.join(ROOT, f)], { encoding: "utf8" });
    assert.equal(r.status, 0, `${f}: ${r.stderr}`);
  }
});

/** GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens. */
export function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

function anchors(md: string): Set<string> {
  const out = new Set<string>();
  const seen = new Map<string, number>();
  let fence = false;
  for (const line of md.split("\n")) {
    if (/^\s*```/.test(line)) fence = !fence;
    if (fence) continue;
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = slug(m[1]);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n ? `${base}-${n}` : base);
  }
  return out;
}

/** Relative links outside code: [text](target) and [text]: target. */
function links(md: string): string[] {
  const out: string[] = [];
  let fence = false;
  for (const raw of md.split("\n")) {
    if (/^\s*```/.test(raw)) fence = !fence;
    if (fence) continue;
    const line = raw.replace(/`[^`]*`/g, "``");
    for (const m of line.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) out.push(m[1]);
    const ref = /^\s*\[[^\]]+\]:\s*(\S+)/.exec(line);
    if (ref) out.push(ref[1]);
  }
  return out.filter((l) => !/^[a-z][a-z0-9+.-]*:/i.test(l));
}

function markdownFiles(): string[] {
  const out = ["README.md", "CONTRIBUTING.md"];
  const walk = (dir: string) => {
    for (const e of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = path.join(dir, e.name);
      // docs/notes/ holds other branches' notes, folded into docs/ when merged.
      if (e.isDirectory() && rel !== path.join("docs", "notes")) walk(rel);
      else if (e.isFile() && e.name.endsWith(".md")) out.push(rel);
    }
  };
  walk("docs");
  return out;
}

test("every relative link in README.md, CONTRIBUTING.md and docs/ points to a file and anchor that exist", () => {
  const bad: string[] = [];
  let checked = 0;
  for (const file of markdownFiles()) {
    for (const link of links(read(file))) {
      checked++;
      const [target, anchor] = link.split("#");
      const abs = target
        ? path.resolve(path.dirname(path.join(ROOT, file)), decodeURIComponent(target))
        : path.join(ROOT, file);
      if (!fs.existsSync(abs)) {
        bad.push(`${file}: ${link} (no such file)`);
        continue;
      }
      if (anchor && abs.endsWith(".md") && !anchors(fs.readFileSync(abs, "utf8")).has(anchor))
        bad.push(`${file}: ${link} (no such heading)`);
    }
  }
  assert.ok(checked >= 20, `only ${checked} links found: the parser is broken`);
  assert.deepEqual(bad, []);
});

test("the link checker catches a missing file and a missing anchor", () => {
  assert.deepEqual(links("see [a](docs/x.md#y) and `[b](not-a-link.md)` and [c](https://example.org)"), [
    "docs/x.md#y",
  ]);
  assert.ok(anchors("# Router replicas\n## Router replicas\n").has("router-replicas-1"));
  assert.equal(
    slug("Kubernetes discovery (`--discovery-backend k8s`)"),
    "kubernetes-discovery---discovery-backend-k8s",
  );
});
