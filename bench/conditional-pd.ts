// Conditional disaggregation on a PD simulator fleet through real Envoy:
// agentic multi-turn sessions (a long private context, then short turns that
// append a tool result and a question), --pd-decider off against prefix,
// and prefix with the ITL guard (--pd-decode-first-max-interference) at each
// budget --max-interference lists, each side on a fresh fleet in the same run.
// Reports mean and p90 TTFT, inter-token latency p90, and the prefill hops
// each side made.
// Usage: node --import tsx bench/conditional-pd.ts [--sessions 16] [--turns 5] [--context-words 400] [--turn-words 20] [--max-interference B1,B2]
import { startEnvoyFleet, longText, stopAll, envoyBin, sleep } from "../test/harness";
import { meanOrZero, pct } from "./stats";
import { runBench } from "./run-bench";
import { abbaRounds, clientsWall, numArg as arg, timedChat, transferSim } from "./transfer-ab";

const SESSIONS = arg("sessions", 16);
const TURNS = arg("turns", 5);
const CONTEXT_WORDS = arg("context-words", 400);
const TURN_WORDS = arg("turn-words", 20);
const MAX_TOKENS = arg("max-tokens", 24);
const STAGGER_MS = arg("stagger-ms", 150);
// Engine time runs this many times faster than wall time (the simulators and the router tokenize for real).
const TIME_SCALE = arg("time-scale", 0.25);
const ROUNDS = arg("rounds", 2);
const MAX_UNCACHED = arg("max-uncached", 512);
// One more side per budget: prefix with --pd-decode-first-max-interference B (none by default).
const iArg = process.argv.indexOf("--max-interference");
const BUDGETS = iArg >= 0 ? process.argv[iArg + 1].split(",").map(Number) : [];
// "off", "prefix", or "guard B".
type Mode = string;
const budgetOf = (m: Mode) => (m.startsWith("guard ") ? Number(m.slice(6)) : 0);
const SIM = transferSim(TIME_SCALE, ["--capacity-blocks", "20000"]);

async function session(base: string, s: number, ttfts: number[], gaps: number[]): Promise<void> {
  const messages: { role: string; content: string }[] = [
    { role: "system", content: longText(`ctx${s}x`, CONTEXT_WORDS) },
  ];
  for (let t = 0; t < TURNS; t++) {
    messages.push({ role: "user", content: longText(`s${s}t${t}q`, TURN_WORDS) });
    const r = await timedChat(base, { model: "m", stream: true, max_tokens: MAX_TOKENS, messages });
    if (r.status !== 200) throw new Error("request failed");
    ttfts.push(r.ttft);
    gaps.push(...r.gaps);
    messages.push({ role: "assistant", content: longText(`s${s}t${t}a`, Math.round(TURN_WORDS / 2)) });
  }
}

async function side(decider: Mode) {
  const tag = decider === "off" ? "o" : decider === "prefix" ? "x" : "g" + budgetOf(decider);
  const roles = { [`${tag}p0`]: "prefill", [`${tag}p1`]: "prefill", [`${tag}d0`]: "decode", [`${tag}d1`]: "decode" };
  const { sims, router, envoy } = await startEnvoyFleet({
    ids: Object.keys(roles),
    simArgs: SIM,
    roles,
    routerArgs: [
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
    ],
  });
  const pre = sims.filter((w) => roles[w.id] === "prefill");
  const ttfts: number[] = [];
  const gaps: number[] = [];
  const wall = await clientsWall(SESSIONS, async (s) => {
    await sleep((s * STAGGER_MS) / TIME_SCALE);
    await session(envoy.url, s, ttfts, gaps);
  });
  const hops = (await Promise.all(pre.map((p) => p.stats()))).reduce((a, x) => a + x.requests, 0);
  const m = /infera_router_pd_paths_total\{path="decode-first"\} (\d+)/.exec(await router.metrics());
  const paths = m ? Number(m[1]) : 0;
  await stopAll();
  return { decider, ttfts, gaps, hops, paths, wall, requests: SESSIONS * TURNS };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy binary not found");
  type Side = Awaited<ReturnType<typeof side>>;
  const modes: Mode[] = ["off", "prefix"].concat(BUDGETS.map((b) => "guard " + b));
  const all = await abbaRounds(modes, ROUNDS, side);
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
    `| ${x.decider === "off" || x.decider === "prefix" ? x.decider : "prefix, " + x.decider} | ${x.requests} | ${meanOrZero(x.ttfts).toFixed(0)} | ${pct(x.ttfts, 50).toFixed(0)} | ${pct(x.ttfts, 90).toFixed(0)} | ${pct(x.gaps, 90).toFixed(1)} | ${x.hops} | ${x.paths} | ${(x.wall / 1000).toFixed(1)} |`;
  console.log(
    `sessions=${SESSIONS} turns=${TURNS} context_words=${CONTEXT_WORDS} turn_words=${TURN_WORDS} max_uncached=${MAX_UNCACHED} max_interference=${BUDGETS.join(",") || "-"} max_tokens=${MAX_TOKENS} time_scale=${TIME_SCALE} rounds=${ROUNDS}`,
  );
  for (let r = 0; r < ROUNDS; r++)
    console.log(
      `round ${r + 1}: mean TTFT ` + modes.map((d) => `${d} ${meanOrZero(all[d][r].ttfts).toFixed(0)} ms`).join(", "),
    );
  console.log(
    "| --pd-decider | requests | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | ITL p90 ms | prefill hops | decode-first | wall s |",
  );
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
  console.log(row(off));
  console.log(row(on));
  for (const g of guards) console.log(row(g));
  console.log(
    `mean TTFT off/prefix = ${(meanOrZero(off.ttfts) / meanOrZero(on.ttfts)).toFixed(2)}x; ITL p90 prefix/off = ${(pct(on.gaps, 90) / pct(off.gaps, 90)).toFixed(3)}`,
  );
  for (const g of guards)
    console.log(
      `mean TTFT off/${g.decider} = ${(meanOrZero(off.ttfts) / meanOrZero(g.ttfts)).toFixed(2)}x; ITL p90 ${g.decider}/off = ${(pct(g.gaps, 90) / pct(off.gaps, 90)).toFixed(3)}`,
    );
  console.log(
    "ITL p99 ms: " +
      [off, on]
        .concat(guards)
        .map((x) => `${x.decider} ${pct(x.gaps, 99).toFixed(1)}`)
        .join(", "),
  );
}

runBench(main);
