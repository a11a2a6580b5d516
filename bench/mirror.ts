// Mirror index at scale (issue 13 item 2): the typed index (core/state/typed-mirror.ts,
// the router's default) against the Map one it replaced (memoryMirror), side by
// side in one run. Each case runs in its own Node process so RSS belongs to it.
//
// Per case: ingest N engine blocks spread over W workers (8 chained 64-block
// stores per worker = one 8k-token prompt, repeated), then memory per block
// (RSS and heap+external growth after a full GC), 2,000 picks of an 8k-token
// prompt resident on worker 0 (p50/p99 of router.pick + release), and the time
// to drop worker 0 (router.removeWorker: every tier of its mirror). The typed
// index frees a dropped worker's entries later, a few per store; that deferred
// work is timed separately ("deferred reclaim").
//
// Two ingest paths:
//   index: mirror.store only, on pre-built strings (the index's own rate);
//   wire:  msgpack EventBatch payloads as vLLM publishes them -> decodeBatch ->
//          applyBatch with native XXH3 (what the router does per ZMQ frame,
//          minus the socket).
// The Map index is bounded per case (ingest time and RSS); where it stops is reported.
//
// npm run bench:mirror                      (full grid, ~5 min; wire path at 64 workers, 1M and 10M)
// npm run bench:mirror -- --sizes 1 --workers 64 --paths index --impls typed
import { spawn } from "child_process";
import { encode } from "@msgpack/msgpack";
import { memoryMirror, memoryState } from "../core/state/memory";
import { TypedMirror, typedMirror } from "../core/state/typed-mirror";
import { createRouter, defaultConfig } from "../core/router";
import { applyBatch } from "../core/kvevents";
import { blockHashes } from "../core/hash";
import { BlockHash, EpochKey } from "../core/types";
import { MirrorIndex } from "../core/state/types";
import { decodeBatch } from "../runtime/events";
import { nativeHasher } from "../runtime/hasher";
import { pct } from "./stats";

interface Case {
  impl: "typed" | "map";
  path: "index" | "wire";
  blocks: number;
  workers: number;
  /** Ingest stops here (seconds of wall time) or past rssLimit bytes. */
  timeLimit: number;
  rssLimit: number;
}

interface Result {
  c: Case;
  stored: number;
  stopped: string | null;
  ingestS: number;
  rate: number;
  /** blocks per CPU second (the process's CPU, so GC helper threads count too) */
  rateCpu: number;
  rssMB: number;
  bytesPerBlock: number;
  heapPerBlock: number;
  pickP50: number;
  pickP99: number;
  picks: number;
  dropMs: number;
  /** Slowest of the next three drops. */
  dropLater: number;
  /** pick p99 on an empty mirror (the machine's noise floor). */
  emptyP99: number;
  /** CPU time (process.cpuUsage, all threads): what the code costs, without time spent descheduled. */
  dropCpuMax: number;
  pickCpuP99: number;
  emptyCpuP99: number;
  dropped: number;
  reclaimMs: number;
}

const PER_STORE = 64; // blocks per BlockStored (one 1k-token chunk)
const PER_CHAIN = 8; // stores per chain: 512 blocks = an 8k-token prompt

function hex8(v: number): string {
  const s = (v >>> 0).toString(16);
  return s.length === 8 ? s : "00000000".substr(s.length) + s;
}
function mix(a: number, b: number): number {
  let h = Math.imul(a ^ Math.imul(b, 0x9e3779b1), 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}
/** Synthetic (index path) block hash and engine hash (decimal u64, as runtime/events.ts spells them) of global block i. */
const synthBlock = (i: number) => (hex8(mix(i, 0x1234567)) + hex8(mix(i, 0x7654321))) as BlockHash;
const synthEngine = (w: number, i: number) => String(10000000000 + w) + String(i).padStart(9, "0");

/** CPU ms of this process since c0 (user + system, every thread). */
function cpuMs(c0: NodeJS.CpuUsage): number {
  const d = process.cpuUsage(c0);
  return (d.user + d.system) / 1000;
}

async function runCase(c: Case): Promise<Result> {
  const gc = (global as unknown as { gc: () => void }).gc;
  const mirror: MirrorIndex = c.impl === "typed" ? typedMirror() : memoryMirror();
  const state = memoryState(mirror);
  const router = createRouter(state, defaultConfig());
  const eks: EpochKey[] = [];
  const ids: string[] = [];
  for (let w = 0; w < c.workers; w++) {
    // host:port ids, as real fleets have (the colon once cost a full scan per drop)
    const id = `10.0.${w >> 8}.${w & 255}:8000`;
    ids.push(id);
    eks.push(router.addWorker({ id, address: id, role: "mixed" }).epochKey);
  }
  // Control: the same picks on an empty mirror, so pick tails from a busy
  // machine (scheduler preemption, GC of the picks' own garbage) are visible apart from the index.
  const emptyTimes: number[] = [];
  const emptyCpu: number[] = [];
  {
    const f0 = {
      blocks: Array.from({ length: 512 }, (_, i) => synthBlock(-1 - i)),
      inputTokens: 8192,
      exact: true,
      mediaHashes: [] as string[],
      n: 1,
    };
    for (let i = 0; i < 2000; i++) {
      const c0 = process.cpuUsage();
      const a = process.hrtime.bigint();
      router.pick(f0).reservation.finish();
      emptyTimes.push(Number(process.hrtime.bigint() - a) / 1e6);
      emptyCpu.push(cpuMs(c0));
    }
  }
  gc();
  const base = process.memoryUsage();
  const stores = Math.ceil(c.blocks / PER_STORE);
  const seqs = new Array(c.workers).fill(-1);
  let stored = 0;
  let busy = 0; // seconds inside the measured path
  let busyCpu = 0; // CPU ms inside it
  let stopped: string | null = null;
  const t0 = Date.now();
  let prompt: BlockHash[] = [];
  // wire path: worker w's store k continues chain floor(k/8); tokens are unique per store
  const lastEngine: (bigint | null)[] = new Array(c.workers).fill(null);
  for (let s = 0; s < stores; s++) {
    const w = s % c.workers;
    const k = Math.floor(s / c.workers); // store index on this worker
    if (c.path === "index") {
      const bh: BlockHash[] = new Array(PER_STORE);
      const eh: string[] = new Array(PER_STORE);
      for (let j = 0; j < PER_STORE; j++) {
        bh[j] = synthBlock(s * PER_STORE + j);
        eh[j] = synthEngine(w, k * PER_STORE + j);
      }
      if (w === 0 && k < PER_CHAIN) prompt = prompt.concat(bh);
      const c0 = process.cpuUsage();
      const a = process.hrtime.bigint();
      for (let j = 0; j < PER_STORE; j++) mirror.store(eks[w], eh[j], bh[j]);
      busy += Number(process.hrtime.bigint() - a) / 1e9;
      busyCpu += cpuMs(c0);
    } else {
      const tokens = new Array(PER_STORE * 16);
      for (let j = 0; j < tokens.length; j++) tokens[j] = (s * tokens.length + j) % 2147483647;
      const hashes: bigint[] = new Array(PER_STORE);
      for (let j = 0; j < PER_STORE; j++) hashes[j] = (BigInt(w + 1) << 40n) | BigInt(k * PER_STORE + j) | (1n << 63n);
      const parent = k % PER_CHAIN === 0 ? null : lastEngine[w];
      lastEngine[w] = hashes[PER_STORE - 1];
      if (w === 0 && k < PER_CHAIN) prompt = prompt.concat(tokens);
      const payload = encode(
        [
          Date.now() / 1000,
          [
            {
              type: "BlockStored",
              block_hashes: hashes,
              parent_block_hash: parent,
              token_ids: tokens,
              block_size: 16,
              lora_id: null,
              medium: null,
              lora_name: null,
            },
          ],
          null,
        ],
        { useBigInt64: true },
      );
      const c0 = process.cpuUsage();
      const a = process.hrtime.bigint();
      const batch = decodeBatch(payload);
      applyBatch(mirror, eks[w], ++seqs[w], batch.events, 16, { hasher: nativeHasher, maxBlocks: 0 });
      busy += Number(process.hrtime.bigint() - a) / 1e9;
      busyCpu += cpuMs(c0);
    }
    stored += PER_STORE;
    if ((s & 255) === 255) {
      if ((Date.now() - t0) / 1000 > c.timeLimit) {
        stopped = `time bound ${c.timeLimit}s`;
        break;
      }
      if (process.memoryUsage.rss() > c.rssLimit) {
        stopped = `RSS bound ${(c.rssLimit / 2 ** 30).toFixed(0)} GiB`;
        break;
      }
    }
  }
  if (c.path === "wire") prompt = blockHashes(prompt as unknown as number[], 16, nativeHasher);
  gc();
  gc();
  const after = process.memoryUsage();
  const n = eks.reduce((x, ek) => x + mirror.entries(ek), 0);
  // An 8k-token prompt resident on worker 0 (the first 512 blocks it stored).
  const feats = { blocks: prompt.slice(0, 512), inputTokens: 8192, exact: true, mediaHashes: [] as string[], n: 1 };
  const times: number[] = [];
  const cpu: number[] = [];
  const pickStart = Date.now();
  for (let i = 0; i < 2000 && Date.now() - pickStart < 20000; i++) {
    const c0 = process.cpuUsage();
    const a = process.hrtime.bigint();
    const p = router.pick(feats);
    p.reservation.finish();
    times.push(Number(process.hrtime.bigint() - a) / 1e6);
    cpu.push(cpuMs(c0));
    if (p.target.id !== ids[0] && stored >= PER_STORE * PER_CHAIN * c.workers)
      throw new Error(`picked ${p.target.id}, expected ${ids[0]}`);
  }
  const held = mirror.entries(eks[0]);
  // Four workers leave one after another: the first runs cold code, the rest show the steady cost.
  const drops: number[] = [];
  const dropCpu: number[] = [];
  let reclaimMs = 0;
  for (let w = 0; w < Math.min(4, c.workers); w++) {
    const c0 = process.cpuUsage();
    const d = process.hrtime.bigint();
    router.removeWorker(ids[w]);
    drops.push(Number(process.hrtime.bigint() - d) / 1e6);
    dropCpu.push(cpuMs(c0));
    if (mirror.entries(eks[w]) !== 0) throw new Error("drop left entries behind");
    // The typed index defers freeing a dropped worker's entries to later
    // stores; time that work too (the first drop's).
    if (w === 0 && c.impl === "typed") {
      const r = process.hrtime.bigint();
      (mirror as TypedMirror).sweep(Infinity);
      reclaimMs = Number(process.hrtime.bigint() - r) / 1e6;
    }
  }
  const dropMs = drops[0];
  const dropLater = Math.max(...drops.slice(1));
  return {
    c,
    stored: n,
    stopped,
    ingestS: busy,
    rate: n / busy,
    rateCpu: n / (busyCpu / 1000),
    rssMB: after.rss / 2 ** 20,
    bytesPerBlock: (after.rss - base.rss) / n,
    // external already counts ArrayBuffers (the typed index's tables)
    heapPerBlock: (after.heapUsed + after.external - base.heapUsed - base.external) / n,
    pickP50: pct(times, 50),
    pickP99: pct(times, 99),
    picks: times.length,
    dropMs,
    dropLater,
    dropCpuMax: Math.max(...dropCpu),
    pickCpuP99: pct(cpu, 99),
    emptyCpuP99: pct(emptyCpu, 99),
    emptyP99: pct(emptyTimes, 99),
    dropped: held,
    reclaimMs,
  };
}

function child(c: Case, hardS: number): Promise<Result | { c: Case; error: string }> {
  return new Promise((resolve) => {
    const p = spawn(
      process.execPath,
      ["--expose-gc", "--max-old-space-size=8192", "--import", "tsx", __filename, "--child", JSON.stringify(c)],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let out = "";
    let err = "";
    p.stdout.on("data", (b) => (out += b));
    p.stderr.on("data", (b) => (err += b));
    const timer = setTimeout(() => p.kill("SIGKILL"), hardS * 1000);
    p.on("exit", (code, sig) => {
      clearTimeout(timer);
      const line = out.trim().split("\n").pop() || "";
      try {
        resolve(JSON.parse(line) as Result);
      } catch {
        resolve({
          c,
          error: sig
            ? `killed (${sig}) after ${hardS}s`
            : `exit ${code}: ${err.trim().split("\n").slice(-2).join(" ")}`,
        });
      }
    });
  });
}

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

async function main(): Promise<void> {
  const ci = process.argv.indexOf("--child");
  if (ci >= 0) {
    const r = await runCase(JSON.parse(process.argv[ci + 1]) as Case);
    process.stdout.write(JSON.stringify(r) + "\n");
    return;
  }
  const sizes = arg("--sizes", "1,4,10")
    .split(",")
    .map((x) => Math.round(Number(x) * 1e6));
  const workers = arg("--workers", "8,64,256").split(",").map(Number);
  const paths = arg("--paths", "index,wire").split(",") as Case["path"][];
  const impls = arg("--impls", "map,typed").split(",") as Case["impl"][];
  const mapTime = Number(arg("--map-time-s", "12"));
  const wireSizes = arg("--wire-sizes", "1,10")
    .split(",")
    .map((x) => Math.round(Number(x) * 1e6));
  const rssLimit = Number(arg("--map-rss-gib", "4")) * 2 ** 30;
  const cases: Case[] = [];
  for (const path of paths)
    for (const w of path === "wire" ? [64] : workers)
      for (const b of path === "wire" ? wireSizes : sizes) {
        for (const impl of impls)
          cases.push({
            impl,
            path,
            blocks: b,
            workers: w,
            timeLimit: impl === "map" ? mapTime : 240,
            rssLimit: impl === "map" ? rssLimit : 16 * 2 ** 30,
          });
      }
  const rows: string[] = [
    "| path | workers | blocks asked | index | blocks held | ingest blocks/s wall (CPU) | RSS MB | B/block (RSS) | B/block (heap+ext) | pick p50 ms | pick p99 ms wall (empty mirror) | pick p99 ms CPU (empty mirror) | drop worker ms: first / max of next 3 (blocks each) | drop CPU ms max | deferred reclaim ms (first drop) | stopped |",
    "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
  ];
  const mapStopped = new Set<string>();
  const started = Date.now();
  for (const c of cases) {
    const key = `${c.path}/${c.workers}`;
    if (c.impl === "map" && mapStopped.has(key)) {
      rows.push(
        `| ${c.path} | ${c.workers} | ${c.blocks / 1e6}M | Map | — | — | — | — | — | — | — | — | — | — | — | not run: stopped at a smaller size |`,
      );
      continue;
    }
    const r = await child(c, c.impl === "map" ? mapTime + 60 : 300);
    if ("error" in r) {
      if (c.impl === "map") mapStopped.add(key);
      rows.push(
        `| ${c.path} | ${c.workers} | ${c.blocks / 1e6}M | ${c.impl === "map" ? "Map" : "typed"} | — | — | — | — | — | — | — | — | — | — | — | ${r.error} |`,
      );
    } else {
      if (r.stopped && c.impl === "map") mapStopped.add(key);
      rows.push(
        `| ${c.path} | ${c.workers} | ${c.blocks / 1e6}M | ${c.impl === "map" ? "Map" : "typed"} | ${(r.stored / 1e6).toFixed(2)}M | ${Math.round(r.rate / 1000)}k (${Math.round(r.rateCpu / 1000)}k) | ${Math.round(r.rssMB)} | ${Math.round(r.bytesPerBlock)} | ${Math.round(r.heapPerBlock)} | ${r.pickP50.toFixed(2)} | ${r.pickP99.toFixed(2)} (${r.emptyP99.toFixed(2)}) | ${r.pickCpuP99.toFixed(2)} (${r.emptyCpuP99.toFixed(2)}) | ${r.dropMs.toFixed(1)} / ${r.dropLater.toFixed(1)} (${Math.round(r.dropped / 1000)}k) | ${r.dropCpuMax.toFixed(1)} | ${c.impl === "typed" ? r.reclaimMs.toFixed(0) : "—"} | ${r.stopped ?? ""} |`,
      );
    }
    process.stderr.write(rows[rows.length - 1] + "\n");
  }
  process.stdout.write(
    `\n${rows.join("\n")}\n\nnode ${process.version}, ${((Date.now() - started) / 1000).toFixed(0)} s\n`,
  );
}

void main().catch((e) => {
  process.stderr.write(String((e as Error).stack || e) + "\n");
  process.exit(1);
});
