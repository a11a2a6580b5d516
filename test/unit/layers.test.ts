// The layers, enforced: core <- runtime <- adapters (extproc, njs, sim) <- cli.
// A file imports only its own folder or a lower layer, never a sibling
// adapter; core also imports no Node built-in (njs bundles it), and the njs
// entry imports nothing but core. Import lines are read as text.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { builtinModules } from "module";

const ROOT = path.resolve(__dirname, "../..");
const RANK: Record<string, number> = { core: 0, runtime: 1, extproc: 2, njs: 2, sim: 2, cli: 3 };
/** Build tooling may reach the scripts folder (njs/build.ts compacts the tokenizer with it). */
const TOOLING: Record<string, string[]> = { "njs/build.ts": ["scripts"] };

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...sources(rel));
    else if (e.name.endsWith(".ts") && !e.name.endsWith(".d.ts")) out.push(rel);
  }
  return out;
}

function imports(file: string): string[] {
  const src = fs.readFileSync(path.join(ROOT, file), "utf8");
  const out: string[] = [];
  for (const m of src.matchAll(
    /(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s+"([^"]+)"|(?:^|\n)\s*import\s+"([^"]+)"|\brequire\("([^"]+)"\)/g,
  ))
    out.push(m[1] ?? m[2] ?? m[3]);
  return out;
}

/** Every import of these files that breaks the layering, as "file -> target: why". */
function violations(files: { file: string; specs: string[] }[]): string[] {
  const bad: string[] = [];
  for (const { file, specs } of files) {
    const layer = file.split("/")[0];
    for (const spec of specs) {
      if (!spec.startsWith(".")) {
        const bare = spec.replace(/^node:/, "").split("/")[0];
        if (layer === "core" && builtinModules.includes(bare)) bad.push(`${file} -> ${spec}: core uses no Node API`);
        else if (file === "njs/infera.ts" && spec !== "../core")
          bad.push(`${file} -> ${spec}: the njs entry bundles core only`);
        continue;
      }
      const top = path.normalize(path.join(path.dirname(file), spec)).split(path.sep)[0];
      if (top === layer) continue;
      if ((TOOLING[file] ?? []).includes(top)) continue;
      if (file === "njs/infera.ts" && top !== "core") bad.push(`${file} -> ${spec}: the njs entry bundles core only`);
      else if (!(top in RANK)) bad.push(`${file} -> ${spec}: ${top}/ is not a layer the product may import`);
      else if (RANK[top] >= RANK[layer])
        bad.push(`${file} -> ${spec}: ${layer} (layer ${RANK[layer]}) may not import ${top} (layer ${RANK[top]})`);
    }
  }
  return bad;
}

const tree = () => Object.keys(RANK).flatMap((layer) => sources(layer).map((file) => ({ file, specs: imports(file) })));

test("no import reaches a higher layer or a sibling adapter", () => {
  assert.deepEqual(violations(tree()), []);
});

test("the check sees a violation when one is there", () => {
  const v = violations([
    { file: "runtime/x.ts", specs: ["../cli/main", "../extproc/server", "./app", "../core/router", "prom-client"] },
    { file: "core/y.ts", specs: ["fs", "node:path", "./types"] },
    { file: "extproc/z.ts", specs: ["../njs/infera"] },
    { file: "njs/infera.ts", specs: ["../runtime/app", "fs"] },
  ]);
  assert.deepEqual(
    v.map((l) => l.split(":")[0]),
    [
      "runtime/x.ts -> ../cli/main",
      "runtime/x.ts -> ../extproc/server",
      "core/y.ts -> fs",
      "core/y.ts -> node",
      "extproc/z.ts -> ../njs/infera",
      "njs/infera.ts -> ../runtime/app",
      "njs/infera.ts -> fs",
    ],
  );
  // The import reader finds each form.
  assert.ok(imports("runtime/config.ts").includes("./args"));
});
