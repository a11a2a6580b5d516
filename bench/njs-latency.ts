// The njs steps of issue #28's remaining long ones, timed in the njs 0.8 CLI
// (the engine nginx runs; no nginx, no other process, so no bench lock is
// needed) for this checkout and another one side by side:
// - parseRequest of a 112k-token extending turn (a 125 KB body);
// - applyBatch of the KV events of a 112k-token prompt (7,000 stored blocks)
//   into the key-encoded state njs keeps (on an in-memory store here, not
//   nginx's shared dicts), as the bridge sends them: plain, and with the
//   bridge's own block hashes (njs/kv-annotate.ts), which an older bundle
//   ignores.
// Usage: npm run bench:njs-latency -- [--baseline DIR] [--reps 5]
//   DIR: a checkout of the other commit (git worktree add --detach DIR <rev>).
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { execFileSync } from "child_process";
import { build } from "esbuild";
import { KvEvent } from "../core/kvevents";
import { KvAnnotator } from "../njs/kv-annotate";
import { median } from "./stats";
import { optionReader } from "./args";

const ROOT = path.join(__dirname, "..");
const argv = process.argv.slice(2);
const opt = optionReader(argv);
const baseline = opt("--baseline", "");
const reps = Math.max(1, Math.min(50, Number(opt("--reps", "5"))));
const NJS = path.join(ROOT, ".njs-0.8", "bin", "njs");
const BLOCKS = 7000;

function kvBodies(dir: string): void {
  // One engine batch of a 112k-token prompt as vLLM publishes it: stores of up to 256 blocks, each chaining on.
  const events: KvEvent[] = [];
  let parent: string | null = null;
  for (let b = 0; b < BLOCKS; b += 256) {
    const n = Math.min(256, BLOCKS - b);
    const hashes = Array.from({ length: n }, (_, i) => "e" + (b + i));
    const tokens = Array.from({ length: n * 16 }, (_, i) => (b * 16 + i * 7919) % 50000);
    events.push({ type: "BlockStored", hashes, parent, tokens, blockSize: 16 });
    parent = hashes[n - 1];
  }
  fs.writeFileSync(path.join(dir, "plain.json"), JSON.stringify({ type: "events", worker: "w", seq: 0, events }));
  new KvAnnotator().annotate("w", 0, events);
  fs.writeFileSync(path.join(dir, "ours.json"), JSON.stringify({ type: "events", worker: "w", seq: 0, events }));
}

function entry(checkout: string, dir: string): string {
  const imp = (m: string) => JSON.stringify(path.join(checkout, m));
  return `
import { parseRequest } from ${imp("core/request")};
import { applyBatch } from ${imp("core/kvevents")};
import { keyedMirror } from ${imp("core/state/keyed")};
import { memStore } from ${imp("core/store")};
declare const require: any;
const fs = require("fs");
const words: string[] = [];
for (let i = 0; i < 20000; i++) words.push("lorem" + ((i * 7919) % 1000) + " ipsum,");
const body = JSON.stringify({ model: "m", max_tokens: 1, messages: [
  { role: "user", content: words.join(" ").slice(0, 125000) },
  { role: "assistant", content: "Noted." },
  { role: "user", content: "And the next step?" }] });
const out: { [k: string]: number[] } = { parse: [], "kv plain": [], "kv ours": [] };
for (let k = 0; k < ${reps}; k++) {
  let t0 = Date.now();
  parseRequest("chat", body, body.length, { maxBodyBytes: 1 << 26, maxMessages: 4096, maxMedia: 512, maxJsonDepth: 64 });
  out.parse.push(Date.now() - t0);
  const kinds = ["plain", "ours"];
  for (let j = 0; j < kinds.length; j++) {
    const text = fs.readFileSync(${JSON.stringify(dir)} + "/" + kinds[j] + ".json", "utf8");
    t0 = Date.now();
    const b = JSON.parse(text);
    const r = applyBatch(keyedMirror(memStore()), "w#1" as any, 0, b.events, 16);
    out["kv " + kinds[j]].push(Date.now() - t0);
    if (r.stored !== ${BLOCKS}) throw new Error("stored " + r.stored);
  }
}
console.log(JSON.stringify(out));
`;
}

async function timeSide(checkout: string, dir: string, name: string): Promise<Record<string, number[]>> {
  const src = path.join(dir, name + ".ts");
  const js = path.join(dir, name + ".js");
  fs.writeFileSync(src, entry(checkout, dir));
  await build({
    entryPoints: [src],
    bundle: true,
    format: "iife",
    target: "es5",
    outfile: js,
    external: ["fs"],
    logLevel: "warning",
    supported: { "const-and-let": true, arrow: true, "template-literal": true, "object-extensions": true },
  });
  return JSON.parse(execFileSync(NJS, [js], { encoding: "utf8" }).trim().split("\n").pop() as string);
}

async function main(): Promise<void> {
  if (!fs.existsSync(NJS)) throw new Error("njs 0.8 not set up: bash scripts/njs08.sh");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "njs-latency-"));
  kvBodies(dir);
  const sides: [string, string][] = [["this checkout", ROOT]];
  if (baseline) sides.push(["baseline " + baseline, path.resolve(baseline)]);
  const res: [string, Record<string, number[]>][] = [];
  // Alternate the sides twice so machine noise hits both alike.
  for (let round = 0; round < 2; round++)
    for (const [label, co] of round % 2 ? sides.slice().reverse() : sides) {
      const r = await timeSide(co, dir, "side" + sides.findIndex((s) => s[1] === co));
      const had = res.find((x) => x[0] === label);
      if (had) for (const k in r) had[1][k].push(...r[k]);
      else res.push([label, r]);
    }
  console.log(
    `njs ${execFileSync(NJS, ["-v"], { encoding: "utf8" }).trim()}, ms per call (median, min-max of ${2 * reps})\n`,
  );
  console.log(
    "| checkout | parseRequest, 125 KB extending turn | KV events of 7,000 blocks, plain | with the bridge's hashes |",
  );
  console.log("|---|---:|---:|---:|");
  const cell = (xs: number[]) => `${median(xs)} (${Math.min(...xs)}-${Math.max(...xs)})`;
  for (const [label, r] of res)
    console.log(`| ${label} | ${cell(r.parse)} | ${cell(r["kv plain"])} | ${cell(r["kv ours"])} |`);
  fs.rmSync(dir, { recursive: true, force: true });
}

main().catch((e) => {
  process.stderr.write(`bench:njs-latency: ${e.stack || e.message}\n`);
  process.exit(1);
});
