// How many mirrored engine blocks nginx's shared-dict zones hold, and what
// happens past that: nginx with the project's config (zones resized per row),
// a fleet of one worker pushed by hand (no bridge), and KV-event pushes of
// fresh chains of 256 blocks (16 tokens each, vLLM-sized engine hashes) until
// nginx answers 507. Each row makes one zone small and the other large, so
// the small one is what fills: its bytes over the blocks held are what a block
// costs there. After the 507, --after more batches are pushed: with the zone
// bound (njs/push.ts) every one should fit, the mirror held at the bound.
//
// --clear N[,N...]: a second table, what an AllBlocksCleared costs the nginx
// worker (its CPU from /proc) for a worker holding N blocks beside another
// holding N (the shipped zones): an engine that restarts, resets its prefix
// cache or loses events has its mirror cleared. Then the pushes after it
// (ceil(N / SWEEP_STEP) + 5 small batches of the other worker, one at a time, as
// the bridge sends them), which sweep a deferred clear's blocks a step each
// (core/state/keyed.ts): their wall times and their CPU in all.
// --dist DIR: run with the njs bundle in DIR (a baseline build) as well, each
// row on both, this checkout's first.
//
// Usage: node --import tsx bench/nginx-zones.ts [--rows str:4m/num:256m,str:256m/num:4m ('': none)] [--after 40]
//   [--clear 20000,40000] [--dist DIR]
import { nginx08, stopAll } from "../test/harness";
import { cpuMs, NginxStack, startNginx1 } from "../test/nginx-stack";
import { runBench } from "./run-bench";
import { optionReader } from "./args";
import { pct } from "./stats";
import { SWEEP_STEP } from "../core/state/keyed";

const opt = optionReader(process.argv.slice(2));
const rows = opt("--rows", "str:4m/num:256m,str:256m/num:4m").split(",").filter(Boolean);
const after = Math.min(400, Math.max(0, Number(opt("--after", "40"))));
const clears = opt("--clear", "").split(",").filter(Boolean).map(Number);
const dist = opt("--dist", "");
const bundles: { name: string; dir?: string }[] = [{ name: "this checkout" }];
if (dist) bundles.push({ name: dist, dir: dist });
const MAX_BATCHES = 4000;
const PER = 256;

const mb = (v: string) => Number(v.replace(/m$/, "")) * 1048576;

runBench(async () => {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up (bash scripts/njs08.sh)");
  const out: string[] = [
    "| bundle | zone_str | zone_num | blocks held at the first 507 | bytes per block (the small zone) | bound learned | further batches of 256 refused |",
    "|---|---|---|---:|---:|---:|---:|",
  ];
  const cleared: string[] = [
    "| bundle | blocks of the cleared worker | blocks of the other | worker CPU ms of the AllBlocksCleared push | its wall ms | pushes after it | their wall ms p50 / p99 / max | their worker CPU ms in all |",
    "|---|---:|---:|---:|---:|---:|---|---:|",
  ];
  const worker = "127.0.0.1:18001";
  const other = "127.0.0.1:18002";
  let n = 0;
  const toks = Array.from({ length: 16 * PER }, (_, i) => i + 1);
  // A fresh chain of PER blocks: vLLM's engine hashes are 64-bit integers, up to 20 decimal digits.
  const stored = () => {
    n++;
    return {
      type: "BlockStored",
      hashes: Array.from({ length: PER }, (_, i) => String(1e19 - (n * PER + i) * 7919)),
      parent: null,
      tokens: toks.map((t) => t + n * 100000),
      blockSize: 16,
    };
  };
  const pusher = (ng: NginxStack) => {
    let pseq = Date.now() * 1000;
    return (body: Record<string, unknown>) =>
      fetch(`${ng.url}/_infera/push`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-infera-push-token": "test-token" },
        body: JSON.stringify({ ...body, pseq: ++pseq }),
      });
  };
  try {
    for (const row of rows)
      for (const bundle of bundles) {
        const [s, z] = row.split("/").map((x) => x.split(":")[1]);
        const ng = await startNginx1(fl, { zone_str: s, zone_num: z }, bundle.dir);
        const push = pusher(ng);
        await push({ type: "workers", workers: [{ id: worker, address: worker, role: "mixed" }] });
        let b = 0;
        let fit = NaN;
        for (; b < MAX_BATCHES; b++) {
          const r = await push({ type: "events", worker, seq: b, events: [stored()] });
          if (r.status === 507) {
            fit = Number(/keeps at most (\d+) blocks/.exec(await r.text())?.[1]);
            break;
          }
          if (r.status !== 200) throw new Error(`push ${b}: ${r.status} ${await r.text()}`);
        }
        const held = b * PER;
        let refused = 0;
        for (let k = 1; k <= after && b + k < MAX_BATCHES; k++)
          if ((await push({ type: "events", worker, seq: b + k, events: [stored()] })).status !== 200) refused++;
        const small = mb(s) < mb(z) ? mb(s) : mb(z);
        out.push(
          `| ${bundle.name} | ${s} | ${z} | ${b < MAX_BATCHES ? held : `> ${held}`} | ${b < MAX_BATCHES ? Math.round(small / held) : "-"} | ${isNaN(fit) ? "-" : fit} | ${refused} of ${after} |`,
        );
        await ng.proc.kill("SIGTERM");
      }
    for (const size of clears)
      for (const bundle of bundles) {
        const ng = await startNginx1(fl, {}, bundle.dir);
        const push = pusher(ng);
        await push({
          type: "workers",
          workers: [worker, other].map((w) => ({ id: w, address: w, role: "mixed" })),
        });
        const seq: Record<string, number> = { [worker]: 0, [other]: 0 };
        for (const w of [other, worker])
          for (let k = 0; k < size / PER; k++) {
            const r = await push({ type: "events", worker: w, seq: seq[w]++, events: [stored()] });
            if (r.status !== 200) throw new Error(`fill: ${r.status} ${await r.text()}`);
          }
        await new Promise((r) => setTimeout(r, 100));
        const c0 = cpuMs(ng.workerPid);
        const t0 = performance.now();
        const r = await push({ type: "events", worker, seq: seq[worker]++, events: [{ type: "AllBlocksCleared" }] });
        const wall = performance.now() - t0;
        if (r.status !== 200) throw new Error(`clear: ${r.status} ${await r.text()}`);
        await new Promise((r) => setTimeout(r, 100));
        const clearCpu = cpuMs(ng.workerPid) - c0;
        // What follows: small batches of the other worker (one block removed that it never had).
        const follow = Math.ceil(size / SWEEP_STEP) + 5;
        const walls: number[] = [];
        const c1 = cpuMs(ng.workerPid);
        for (let k = 0; k < follow; k++) {
          const t1 = performance.now();
          const f = await push({
            type: "events",
            worker: other,
            seq: seq[other]++,
            events: [{ type: "BlockRemoved", hashes: ["1"] }],
          });
          walls.push(performance.now() - t1);
          if (f.status !== 200) throw new Error(`after the clear: ${f.status} ${await f.text()}`);
        }
        await new Promise((r) => setTimeout(r, 100));
        cleared.push(
          `| ${bundle.name} | ${size} | ${size} | ${clearCpu} | ${wall.toFixed(0)} | ${follow} | ${[50, 99, 100].map((q) => pct(walls, q).toFixed(1)).join(" / ")} | ${cpuMs(ng.workerPid) - c1} |`,
        );
        await ng.proc.kill("SIGTERM");
      }
  } finally {
    await stopAll();
  }
  console.log(out.join("\n"));
  if (clears.length) console.log("\n" + cleared.join("\n"));
});
