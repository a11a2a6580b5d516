// Conditional disaggregation on a PD simulator fleet through real Envoy:
// agentic multi-turn sessions (a long private context, then short turns that
// append a tool result and a question), --pd-decider off against prefix,
// and prefix with the ITL guard (--pd-decode-first-max-interference) at each
// budget --max-interference lists, each side on a fresh fleet in the same run.
// Reports mean and p90 TTFT, inter-token latency p90, and the prefill hops
// each side made.
// Usage: node --import tsx bench/conditional-pd.ts [--sessions 16] [--turns 5] [--context-words 400] [--turn-words 20] [--max-interference B1,B2]
import { startSim, startRouter, startEnvoy, workerArg, longText, stopAll, envoyBin, Sim, sleep } from "../test/harness";

function arg(name: string, def: number): number {
  const i = process.argv.indexOf("--" + name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}
const SESSIONS = arg("sessions", 16);
const TURNS = arg("turns", 5);
const CONTEXT_WORDS = arg("context-words", 400);
const TURN_WORDS = arg("turn-words", 20);
const MAX_TOKENS = arg("max-tokens", 24);
const STAGGER_MS = arg("stagger-ms", 150);
// Engine time runs this many times faster than wall time: below 1 the simulated work dwarfs the
// CPU noise of a shared machine (the simulators and the router tokenize for real).
const TIME_SCALE = arg("time-scale", 0.25);
const ROUNDS = arg("rounds", 2);
const MAX_UNCACHED = arg("max-uncached", 512);
// One more side per budget: prefix with --pd-decode-first-max-interference B (none by default).
const iArg = process.argv.indexOf("--max-interference");
const BUDGETS = iArg >= 0 ? process.argv[iArg + 1].split(",").map(Number) : [];
// "off", "prefix", or "guard B".
type Mode = string;
const budgetOf = (m: Mode) => (m.startsWith("guard ") ? Number(m.slice(6)) : 0);
// An 8B-class model: 32 layers x 8 KV heads x 128 dims x K,V x 2 bytes = 128 KiB per token, over 100 Gbit/s.
const SIM = [
  "--prefill-us-per-token",
  "60",
  "--decode-ms-per-token",
  "12",
  "--kv-bytes-per-token",
  "131072",
  "--kv-link-gbps",
  "100",
  "--capacity-blocks",
  "20000",
  "--time-scale",
  String(TIME_SCALE),
];

function pct(xs: number[], p: number): number {
  const s = xs.slice().sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
}
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

async function turn(base: string, messages: unknown[]): Promise<{ ttft: number; gaps: number[]; ok: boolean }> {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, max_tokens: MAX_TOKENS, messages }),
  });
  const reader = r.body!.getReader();
  let ttft = -1;
  let last = 0;
  const gaps: number[] = [];
  for (let i = 0; i < 100000; i++) {
    const c = await reader.read();
    if (c.done) break;
    const now = performance.now();
    if (ttft < 0) ttft = now - t0;
    else gaps.push(now - last);
    last = now;
  }
  return { ttft, gaps, ok: r.status === 200 };
}

async function session(base: string, s: number, ttfts: number[], gaps: number[]): Promise<void> {
  const messages: { role: string; content: string }[] = [
    { role: "system", content: longText(`ctx${s}x`, CONTEXT_WORDS) },
  ];
  for (let t = 0; t < TURNS; t++) {
    messages.push({ role: "user", content: longText(`s${s}t${t}q`, TURN_WORDS) });
    const r = await turn(base, messages);
    if (!r.ok) throw new Error("request failed");
    ttfts.push(r.ttft);
    gaps.push(...r.gaps);
    messages.push({ role: "assistant", content: longText(`s${s}t${t}a`, Math.round(TURN_WORDS / 2)) });
  }
}

async function side(decider: Mode) {
  const tag = decider === "off" ? "o" : decider === "prefix" ? "x" : "g" + budgetOf(decider);
  const pre = await Promise.all([0, 1].map((i) => startSim(`${tag}p${i}`, SIM, "prefill")));
  const dec = await Promise.all([0, 1].map((i) => startSim(`${tag}d${i}`, SIM, "decode")));
  const roles = Object.fromEntries([...pre.map((w) => [w.id, "prefill"]), ...dec.map((w) => [w.id, "decode"])]);
  const router = await startRouter([
    "--workers",
    workerArg([...pre, ...dec], roles),
    "--kv-prefill-overlap-weight",
    "20",
    "--kv-decode-overlap-weight",
    "20",
    "--pd-decider",
    decider === "off" ? "off" : "prefix",
    "--pd-decode-first-max-uncached-tokens",
    String(MAX_UNCACHED),
    "--pd-decode-first-max-interference",
    String(budgetOf(decider)),
    "--log-level",
    "info",
  ]);
  const envoy = await startEnvoy(router.grpcPort);
  const ttfts: number[] = [];
  const gaps: number[] = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: SESSIONS }, async (_, s) => {
      await sleep((s * STAGGER_MS) / TIME_SCALE);
      await session(envoy.url, s, ttfts, gaps);
    }),
  );
  const wall = performance.now() - t0;
  const hops = (await Promise.all(pre.map((p: Sim) => p.stats()))).reduce((a, x) => a + x.requests, 0);
  const m = /infera_router_pd_paths_total\{path="decode-first"\} (\d+)/.exec(await router.metrics());
  const paths = m ? Number(m[1]) : 0;
  await stopAll();
  return { decider, ttfts, gaps, hops, paths, wall, requests: SESSIONS * TURNS };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy binary not found");
  type Side = Awaited<ReturnType<typeof side>>;
  const modes: Mode[] = ["off", "prefix"].concat(BUDGETS.map((b) => "guard " + b));
  const all: { [m: string]: Side[] } = {};
  for (const m of modes) all[m] = [];
  // ABBA order per pair of rounds (ABC CBA with three sides), so a drift in the machine's load hits all sides alike.
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 ? modes.slice().reverse() : modes;
    for (const d of order) all[d].push(await side(d));
  }
  const merge = (xs: Side[]) => ({
    decider: xs[0].decider,
    ttfts: xs.flatMap((x) => x.ttfts),
    gaps: xs.flatMap((x) => x.gaps),
    hops: xs.reduce((a, x) => a + x.hops, 0),
    paths: xs.reduce((a, x) => a + x.paths, 0),
    wall: xs.reduce((a, x) => a + x.wall, 0),
    requests: xs.reduce((a, x) => a + x.requests, 0),
  });
  const off = merge(all.off);
  const on = merge(all.prefix);
  const guards = BUDGETS.map((b) => merge(all["guard " + b]));
  // Times are wall ms at --time-scale; engine ms = wall ms x time scale.
  const row = (x: Side) =>
    `| ${x.decider === "off" || x.decider === "prefix" ? x.decider : "prefix, " + x.decider} | ${x.requests} | ${mean(x.ttfts).toFixed(0)} | ${pct(x.ttfts, 50).toFixed(0)} | ${pct(x.ttfts, 90).toFixed(0)} | ${pct(x.gaps, 90).toFixed(1)} | ${x.hops} | ${x.paths} | ${(x.wall / 1000).toFixed(1)} |`;
  console.log(
    `sessions=${SESSIONS} turns=${TURNS} context_words=${CONTEXT_WORDS} turn_words=${TURN_WORDS} max_uncached=${MAX_UNCACHED} max_interference=${BUDGETS.join(",") || "-"} max_tokens=${MAX_TOKENS} time_scale=${TIME_SCALE} rounds=${ROUNDS}`,
  );
  for (let r = 0; r < ROUNDS; r++)
    console.log(
      `round ${r + 1}: mean TTFT ` + modes.map((d) => `${d} ${mean(all[d][r].ttfts).toFixed(0)} ms`).join(", "),
    );
  console.log(
    "| --pd-decider | requests | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | ITL p90 ms | prefill hops | decode-first | wall s |",
  );
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
  console.log(row(off));
  console.log(row(on));
  for (const g of guards) console.log(row(g));
  console.log(
    `mean TTFT off/prefix = ${(mean(off.ttfts) / mean(on.ttfts)).toFixed(2)}x; ITL p90 prefix/off = ${(pct(on.gaps, 90) / pct(off.gaps, 90)).toFixed(3)}`,
  );
  for (const g of guards)
    console.log(
      `mean TTFT off/${g.decider} = ${(mean(off.ttfts) / mean(g.ttfts)).toFixed(2)}x; ITL p90 ${g.decider}/off = ${(pct(g.gaps, 90) / pct(off.gaps, 90)).toFixed(3)}`,
    );
  console.log(
    "ITL p99 ms: " +
      [off, on]
        .concat(guards)
        .map((x) => `${x.decider} ${pct(x.gaps, 99).toFixed(1)}`)
        .join(", "),
  );
}

main().then(
  () => process.exit(0),
  async (e) => {
    console.error(e);
    await stopAll();
    process.exit(1);
  },
);
