// A/B of njs tokenize + hash + pick between this checkout's bundle and another
// checkout's (an earlier commit, built with `npm run build:njs` there), on the
// native njs engines, runs alternating so machine noise hits both alike.
// Usage: node --import tsx bench/njs-ab.ts /path/to/other/checkout [rounds]
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { spawnSync } from "child_process";
import { median } from "./stats";

const ROOT = path.resolve(__dirname, "..");
const other = process.argv[2];
const rounds = Math.min(50, Math.max(1, Number(process.argv[3] || 6)));
if (!other) throw new Error("usage: bench/njs-ab.ts /path/to/other/checkout [rounds]");
const dists: [string, string][] = [
  ["before", path.join(path.resolve(other), "njs", "dist")],
  ["after", path.join(ROOT, "njs", "dist")],
];
for (const [name, d] of dists)
  if (!fs.existsSync(path.join(d, "infera-cli.js")))
    throw new Error(`${name}: no ${d}/infera-cli.js (run npm run build:njs there)`);

const clis = ["njs", path.join(ROOT, ".njs-0.8", "bin", "njs")].filter((b) => spawnSync(b, ["-v"]).status === 0);
const script = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "njs-ab-")), "ab.mjs");
// Same prompt shape as test/e2e/njs.test.ts (harness longText): ~1k and ~8k tokens.
fs.writeFileSync(
  script,
  `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync('tokenizer.json'));
function text(seed, words) { const o = []; for (let i = 0; i < words; i++) o.push(seed + (i % 97) + 'w' + ((i * 7919) % 1009)); return o.join(' '); }
const a = cli.timePick(vocab, text('bench', 150), 7);
const b = cli.timePick(vocab, text('bench', 1180), 5);
console.log(JSON.stringify([a.tokens, a.ms, b.tokens, b.ms]));
`,
);

console.log(`| njs | tokens | before ms | after ms | after/before |\n|---|---:|---:|---:|---:|`);
for (const bin of clis) {
  const version = spawnSync(bin, ["-v"], { encoding: "utf8" }).stdout.trim();
  const ms: { [side: string]: number[][] } = { before: [[], []], after: [[], []] };
  let tokens = [0, 0];
  for (let r = 0; r < rounds; r++) {
    for (const [name, d] of r % 2 ? [...dists].reverse() : dists) {
      const out = spawnSync(bin, ["-p", d, script], { cwd: d, encoding: "utf8", timeout: 120000 });
      if (out.status !== 0) throw new Error(`${name} on njs ${version}: ${out.stderr}`);
      const [t1, m1, t8, m8] = JSON.parse(out.stdout.trim().split("\n").pop()!);
      ms[name][0].push(m1);
      ms[name][1].push(m8);
      tokens = [t1, t8];
    }
  }
  for (const k of [0, 1]) {
    const b = median(ms.before[k]);
    const a = median(ms.after[k]);
    console.log(`| ${version} | ${tokens[k]} | ${b} | ${a} | ${(a / b).toFixed(2)} |`);
  }
}
