// Time per pick (tokenize + hash + pick, cold BPE cache as in a fresh nginx
// request VM) on the native njs engines, per prompt size, for this checkout's
// bundle and optionally another revision's: does the in-njs path scale
// linearly? Each pick runs in its own njs process (njs has no garbage
// collector: a VM keeps every allocation), and the sides alternate so machine
// noise hits both alike. The table reports, per side, the median over --rounds
// processes of the CPU time per pick (the process's own, so the wait for a core
// on a busy machine does not count) and of the wall time per pick.
// Usage: npm run bench:njs-scale -- [--baseline REV] [--sizes 1k,8k,25k,32k,100k,112k,200k] [--rounds 3]
import { execFileSync, spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { buildNjs } from "../njs/build";
import { median } from "./stats";
import { optionReader } from "./args";

const ROOT = path.resolve(__dirname, "..");
const argv = process.argv.slice(2);
const opt = optionReader(argv);
const baseRev = opt("--baseline", "");
const rounds = Math.min(20, Math.max(1, Number(opt("--rounds", "3"))));
const sizes = opt("--sizes", "1k,8k,25k,32k,100k,112k,200k")
  .split(",")
  .map((s) => {
    const m = /^(\d+(?:\.\d+)?)(k?)$/.exec(s.trim());
    if (!m) throw new Error(`--sizes: ${s} is not a token count like 8k or 1500`);
    return Math.round(Number(m[1]) * (m[2] ? 1000 : 1));
  });

// bench/njs-ab.ts and test/harness.ts longText's generator: 1,024 tokens for 150 words on the bundled Qwen3 tokenizer.
const TOKENS_PER_WORD = 1024 / 150;
const SCRIPT = `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync('tokenizer.json'));
const words = Number(process.argv[process.argv.length - 1]);
const o = [];
for (let i = 0; i < words; i++) o.push('bench' + (i % 97) + 'w' + ((i * 7919) % 1009));
const text = o.join(' ');
// Process CPU (utime + stime, 10 ms ticks) over enough picks to read it well;
// wall ms is timePick's own, per pick.
function cpuMs() { const f = fs.readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' '); return 10 * (Number(f[11]) + Number(f[12])); }
const c0 = cpuMs();
const walls = [];
let tokens = 0;
while (walls.length < 1 || (walls.length < 40 && cpuMs() - c0 < 300)) {
  const r = cli.timePick(vocab, text, 1);
  walls.push(r.ms);
  tokens = r.tokens;
}
walls.sort(function (a, b) { return a - b; });
console.log(JSON.stringify([tokens, walls[Math.floor(walls.length / 2)], (cpuMs() - c0) / walls.length]));
`;

/** That revision's source, unpacked without registering a worktree, with its njs bundle built. */
function baselineDist(rev: string): { dist: string; cleanup: () => void } {
  const sha = execFileSync("git", ["rev-parse", "--short", rev], { cwd: ROOT }).toString().trim();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `infera-njs-${sha}-`));
  const cleanup = () => fs.rmSync(dir, { recursive: true, force: true });
  process.on("exit", cleanup);
  execFileSync("sh", ["-c", `git archive --format=tar ${sha} | tar -x -C '${dir}'`], { cwd: ROOT });
  const lock = (d: string) => fs.readFileSync(path.join(d, "package-lock.json"), "utf8");
  if (lock(dir) !== lock(ROOT))
    throw new Error(
      `${rev}: its package-lock.json differs from this checkout's; build its bundle there and use bench/njs-ab.ts`,
    );
  fs.symlinkSync(path.join(ROOT, "node_modules"), path.join(dir, "node_modules"));
  execFileSync(process.execPath, ["--import", "tsx", "njs/build.ts"], {
    cwd: dir,
    stdio: ["ignore", "ignore", "inherit"],
    timeout: 300_000,
  });
  return { dist: path.join(dir, "njs", "dist"), cleanup };
}

function fmt(ms: number): string {
  return ms >= 100 ? ms.toFixed(0) : ms.toFixed(1);
}

async function main(): Promise<void> {
  const clis = ["njs", path.join(ROOT, ".njs-0.8", "bin", "njs")].filter((b) => spawnSync(b, ["-v"]).status === 0);
  if (!clis.length) throw new Error("no njs CLI: apt-get install njs, and bash scripts/njs08.sh for njs 0.8");
  process.stderr.write("building this checkout's njs bundle\n");
  await buildNjs();
  const sides: [string, string][] = [];
  if (baseRev) {
    process.stderr.write(`building ${baseRev}'s njs bundle\n`);
    sides.push(["before", baselineDist(baseRev).dist]);
  }
  sides.push(["after", path.join(ROOT, "njs", "dist")]);
  const script = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "njs-scale-")), "scale.mjs");
  fs.writeFileSync(script, SCRIPT);

  const before = baseRev ? `before (${baseRev}) CPU ms | ` : "";
  const beforeWall = baseRev ? `before wall ms | ` : "";
  console.log(
    `| njs | prompt tokens | ${before}after CPU ms | ${baseRev ? "after/before | " : ""}after CPU µs/token | ${beforeWall}after wall ms |`,
  );
  console.log(`|---|---:|${baseRev ? "---:|---:|" : ""}---:|---:|${baseRev ? "---:|" : ""}---:|`);
  const ratios: string[] = [];
  for (const bin of clis) {
    const version = spawnSync(bin, ["-v"], { encoding: "utf8" }).stdout.trim();
    const at: { [side: string]: { [size: number]: number } } = {};
    for (const size of sizes) {
      const words = Math.max(1, Math.round(size / TOKENS_PER_WORD));
      const ms: { [side: string]: number[] } = {};
      const wall: { [side: string]: number[] } = {};
      let tokens = 0;
      for (let r = 0; r < rounds; r++) {
        const order = r % 2 ? sides.slice().reverse() : sides;
        for (const [name, dist] of order) {
          const out = spawnSync(bin, ["-p", dist, script, String(words)], {
            cwd: dist,
            encoding: "utf8",
            timeout: 600_000,
          });
          if (out.status !== 0) throw new Error(`${name} on njs ${version}: ${out.stderr}${out.stdout}`);
          const [t, w, cpu] = JSON.parse(out.stdout.trim().split("\n").pop()!);
          (ms[name] = ms[name] || []).push(cpu);
          (wall[name] = wall[name] || []).push(w);
          tokens = t;
        }
      }
      const cells: string[] = [];
      const walls: string[] = [];
      for (const [name] of sides) {
        (at[name] = at[name] || {})[size] = median(ms[name]);
        cells.push(fmt(median(ms[name])));
        walls.push(fmt(median(wall[name])));
      }
      const a = median(ms.after);
      const ab = baseRev ? ` ${(a / median(ms.before)).toFixed(2)} |` : "";
      console.log(
        `| ${version} | ${tokens.toLocaleString("en-US")} | ${cells.join(" | ")} |${ab} ${((1000 * a) / tokens).toFixed(2)} | ${walls.join(" | ")} |`,
      );
    }
    // The bar: 4x the prompt (25k -> 100k tokens) may cost at most 4.5x the time.
    if (sizes.indexOf(25000) >= 0 && sizes.indexOf(100000) >= 0)
      for (const [name] of sides)
        ratios.push(
          `njs ${version} ${name}: 100k/25k CPU time ratio ${(at[name][100000] / at[name][25000]).toFixed(2)}`,
        );
  }
  if (ratios.length) console.log("\n" + ratios.join("\n"));
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`bench:njs-scale: ${e.message}\n`);
    process.exit(1);
  },
);
