// Builds the njs bundle: tsc lowers core + njs/ to ES5 (no class, Map, Set,
// destructuring, spread, for-of, default params, optional chaining), esbuild
// bundles it into one file, and a checker refuses anything njs cannot parse.
import { execFileSync, spawnSync } from "child_process";
import { createHash } from "crypto";
import * as fs from "fs";
import * as path from "path";
import { build } from "esbuild";
import { compact } from "../scripts/compact-tokenizer";
import { defaultTokenizerDir, loadTokenizer } from "../runtime/tokenizer";
import { templateAst } from "../runtime/jinja";
import { detectContentFormat } from "../core/chat";
import { CompactTokenizer } from "../core/bpe";
import { nginxFlagVars } from "../core/flags";

const ROOT = path.resolve(__dirname, "..");
const OUT = path.join(ROOT, "njs", "dist");

// Syntax njs 0.7.9/0.8.x reject, as it would appear in the lowered bundle.
const FORBIDDEN: [RegExp, string][] = [
  [/\bclass\s+[A-Za-z_$]/, "class"],
  [/\bnew (Map|Set|WeakMap|WeakSet)\b/, "Map/Set"],
  [/\bSymbol\.iterator\b/, "iterators"],
  [/\bfunction\s*\*/, "generators"],
  [/\?\.[A-Za-z_$([]/, "optional chaining"],
  [/\.\.\.[A-Za-z_$[(]/, "spread/rest"],
  [/\bfor\s*\([^;)]*\bof\b/, "for-of"],
  [/\b\d+n\b|\bBigInt\b/, "BigInt"],
  [/\/[gimsy]*u[gimsy]*\.test|\/[^/\n]+\/[gimsy]*u[gimsy]*[,;)]/, "regex u flag literal"],
  [/\b(const|let|var)\s*[[{]/, "destructuring"],
];

export function checkNjsSyntax(code: string, file: string): void {
  // Strings and comments can legitimately contain these words.
  const stripped = code
    .replace(/\/\*[\s\S]*?\*\//g, "")
    .replace(/(^|[^:\\])\/\/.*$/gm, "$1")
    .replace(/"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`/g, '""');
  for (const [re, what] of FORBIDDEN) {
    const m = re.exec(stripped);
    if (m) {
      const at = stripped.slice(Math.max(0, m.index - 60), m.index + 60);
      throw new Error(`${file}: njs cannot run ${what}: …${at}…`);
    }
  }
}

/** Loads both bundles in every njs CLI on this machine; njs's own parser is the final word. */
function njsLoadCheck(): void {
  const clis = ["njs", path.join(ROOT, ".njs-0.8", "bin", "njs")].filter((b) => spawnSync(b, ["-v"]).status === 0);
  if (!clis.length) {
    process.stderr.write("njs build: no njs CLI found; only the static syntax check ran\n");
    return;
  }
  const script = path.join(ROOT, "njs", "build", "load-check.mjs");
  fs.writeFileSync(
    script,
    "import a from 'infera.js';\nimport b from 'infera-cli.js';\nimport c from 'infera-phases.js';\n" +
      "import d from 'infera-push.js';\n" +
      "console.log(typeof a.route + ' ' + typeof b.timePick + ' ' + typeof c.release + ' ' + typeof d.push);\n",
  );
  for (const bin of clis) {
    const r = spawnSync(bin, ["-p", OUT, script], { encoding: "utf8" });
    if (r.status !== 0 || r.stdout.trim() !== "function function function function")
      throw new Error(
        `njs (${bin} ${spawnSync(bin, ["-v"], { encoding: "utf8" }).stdout.trim()}) rejects the bundle: ${r.stderr}${r.stdout}`,
      );
  }
}

/** The compact vocabulary plus the chat template (parsed here: njs cannot run the parser) and special-token ids. */
export function compactWithChat(dir: string): CompactTokenizer {
  const c = compact(path.join(dir, "tokenizer.json"));
  const tok = loadTokenizer(dir)!;
  if (tok.template)
    c.chat = {
      ast: templateAst(tok.template),
      special: tok.special,
      format: detectContentFormat(tok.template),
      readsContent: tok.template.indexOf("content") >= 0,
    };
  const plain = tok.encode("a");
  const withSpecial = tok.encodeSpecial!("a");
  let at = -1;
  for (let i = 0; i + plain.length <= withSpecial.length && at < 0; i++)
    if (plain.every((x, k) => withSpecial[i + k] === x)) at = i;
  if (at >= 0) {
    c.specialPrefix = withSpecial.slice(0, at);
    c.specialSuffix = withSpecial.slice(at + plain.length);
  }
  return c;
}

/** The .js files under dir, sorted, for the bundle's hash. */
function listJs(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...listJs(p));
    else if (e.name.endsWith(".js")) out.push(p);
  }
  return out.sort();
}

export async function buildNjs(): Promise<{
  bundle: string;
  cli: string;
  phases: string;
  push: string;
  vocab: string;
}> {
  fs.rmSync(path.join(ROOT, "njs", "build"), { recursive: true, force: true });
  fs.mkdirSync(OUT, { recursive: true });
  execFileSync(
    process.execPath,
    [require.resolve("typescript/bin/tsc"), "-p", path.join(ROOT, "njs", "tsconfig.json")],
    { stdio: "inherit" },
  );
  // tsc emits ES modules, which esbuild hoists into the bundle's one scope: no
  // per-module wrapper, exports object or property call (`(0, m.f)(...)`), and
  // every njs VM runs that top level again (docs/benchmarks/2026-12-07-njs-floor.md).
  // The package is "type": "commonjs", under which esbuild would wrap a module
  // that only imports (core/scheduling/plugins.ts); this marks the build's files as ESM.
  fs.writeFileSync(path.join(ROOT, "njs", "build", "package.json"), '{ "type": "module" }\n');
  // What the bundle's config cache (njs/infera.ts) is keyed on: the sources'
  // hash (a new bundle never reads what an older one parsed) and the variables.
  const hash = createHash("sha256");
  for (const f of listJs(path.join(ROOT, "njs", "build")))
    hash.update(path.relative(ROOT, f) + "\0" + fs.readFileSync(f, "utf8") + "\0");
  const define = {
    INFERA_BUILD: JSON.stringify(hash.digest("hex").slice(0, 16)),
    INFERA_CONFIG_VARS: JSON.stringify(nginxFlagVars().map((v) => v.nginx)),
  };
  const outs: Record<string, string> = {};
  for (const [entry, name, global] of [
    ["infera", "infera.js", "__infera"],
    ["njs-bench", "infera-cli.js", "__infera_cli"],
    // The proxy location's phases alone (njs/phases.ts): the VM after internalRedirect runs only this top level.
    ["phases", "infera-phases.js", "__infera_phases"],
    // The push location's KV-event batches alone (njs/push.ts): no router, parser or tokenizer at its top level.
    ["push", "infera-push.js", "__infera_push"],
  ]) {
    const file = path.join(OUT, name);
    await build({
      entryPoints: [path.join(ROOT, "njs", "build", "njs", `${entry}.js`)],
      bundle: true,
      format: "iife",
      globalName: global,
      target: "es5",
      outfile: file,
      legalComments: "none",
      logLevel: "warning",
      supported: { "const-and-let": true, arrow: true, "template-literal": true },
      define: define,
    });
    // njs modules export with `export default`; esbuild's ESM form (`export {x as default}`) is not njs syntax.
    const code = fs.readFileSync(file, "utf8") + `\nexport default ${global}.default;\n`;
    checkNjsSyntax(code, name);
    fs.writeFileSync(file, code);
    outs[entry] = file;
  }
  njsLoadCheck();
  const vocab = path.join(OUT, "tokenizer.json");
  fs.writeFileSync(vocab, JSON.stringify(compactWithChat(process.env.INFERA_TOKENIZER_PATH || defaultTokenizerDir())));
  return { bundle: outs["infera"], cli: outs["njs-bench"], phases: outs["phases"], push: outs["push"], vocab };
}

if (require.main === module) {
  buildNjs().then(
    (o) =>
      process.stderr.write(
        `njs bundle: ${o.bundle}\nnjs cli bundle: ${o.cli}\nnjs phases bundle: ${o.phases}\nnjs push bundle: ${o.push}\nvocabulary: ${o.vocab}\n`,
      ),
    (e) => {
      process.stderr.write(`njs build failed: ${e.message}\n`);
      process.exit(1);
    },
  );
}
