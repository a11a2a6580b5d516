// Conditional disaggregation on a PD simulator fleet through real Envoy:
// agentic multi-turn sessions (a long private context, then short turns that
// append a tool result and a question), --pd-decider off against prefix,
// and prefix with the ITL guard (--pd-decode-first-max-interference) at each
// budget --max-interference lists, each side on a fresh fleet in the same run.
// Reports mean and p90 TTFT, inter-token latency p90, and the prefill hops
// each side made.
// --words natural writes English words (~1 token each) instead of the
// harness's made-up ones (~10 tokens each); --answer real sends back the text
// the engine generated as the assistant turn (as an agent does) instead of a
// made-up one; --shared-words N puts a system prompt all sessions share before
// each session's own context; --step-model sets the simulators' step pricing.
// Also reports the prompt tokens a warm turn (not a session's first) found
// uncached where it was prefilled, and how many warm turns were served by the
// decode worker of the turn before.
// Usage: node --import tsx bench/conditional-pd.ts [--sessions 16] [--turns 5] [--context-words 400] [--turn-words 20] [--max-interference B1,B2]
//   [--words natural] [--answer real] [--shared-words 0] [--step-model knee|additive|roofline]
import { startEnvoyFleet, longText, stopAll, envoyBin, sleep } from "../test/harness";
import { meanOrZero, pct } from "./stats";
import { runBench } from "./run-bench";
import {
  abbaRounds,
  clientsWall,
  naturalText,
  numArg as arg,
  streamedAnswer,
  timedChat,
  transferSim,
} from "./transfer-ab";

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
const strArg = (name: string, def: string) => {
  const i = process.argv.indexOf("--" + name);
  return i >= 0 ? process.argv[i + 1] : def;
};
const WORDS = strArg("words", "synthetic");
const ANSWER = strArg("answer", "synthetic");
const STEP_MODEL = strArg("step-model", "knee");
const SHARED_WORDS = arg("shared-words", 0);
const text = (seed: string, n: number) => (WORDS === "natural" ? naturalText(seed, n) : longText(seed, n));
const SIM = transferSim(TIME_SCALE, ["--capacity-blocks", "20000", "--step-model", STEP_MODEL]);

interface Warm {
  /** Prompt tokens of warm turns, and those not cached where they were prefilled. */
  prompt: number;
  uncached: number;
  turns: number;
  /** Warm turns served by the same decode worker as the turn before. */
  sticky: number;
}

async function session(base: string, s: number, ttfts: number[], gaps: number[], warm: Warm): Promise<void> {
  const system = (SHARED_WORDS ? text("shared-system", SHARED_WORDS) + "\n" : "") + text(`ctx${s}x`, CONTEXT_WORDS);
  const messages: { role: string; content: string }[] = [{ role: "system", content: system }];
  let last = "";
  for (let t = 0; t < TURNS; t++) {
    messages.push({ role: "user", content: text(`s${s}t${t}q`, TURN_WORDS) });
    const r = await timedChat(base, { model: "m", stream: true, max_tokens: MAX_TOKENS, messages });
    if (r.status !== 200) throw new Error("request failed");
    ttfts.push(r.ttft);
    gaps.push(...r.gaps);
    const a = streamedAnswer(r.text);
    const worker = r.headers.get("x-sim-worker") || "";
    if (t > 0) {
      warm.turns++;
      warm.prompt += a.prompt;
      warm.uncached += a.prompt - a.cached;
      if (worker === last) warm.sticky++;
    }
    last = worker;
    messages.push({
      role: "assistant",
      content: ANSWER === "real" ? a.content : text(`s${s}t${t}a`, Math.round(TURN_WORDS / 2)),
    });
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
  const warm: Warm = { prompt: 0, uncached: 0, turns: 0, sticky: 0 };
  const wall = await clientsWall(SESSIONS, async (s) => {
    await sleep((s * STAGGER_MS) / TIME_SCALE);
    await session(envoy.url, s, ttfts, gaps, warm);
  });
  const hops = (await Promise.all(pre.map((p) => p.stats()))).reduce((a, x) => a + x.requests, 0);
  const m = /infera_router_pd_paths_total\{path="decode-first"\} (\d+)/.exec(await router.metrics());
  const paths = m ? Number(m[1]) : 0;
  await stopAll();
  return { decider, ttfts, gaps, hops, paths, wall, requests: SESSIONS * TURNS, warm };
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
    warm: {
      prompt: xs.reduce((a, x) => a + x.warm.prompt, 0),
      uncached: xs.reduce((a, x) => a + x.warm.uncached, 0),
      turns: xs.reduce((a, x) => a + x.warm.turns, 0),
      sticky: xs.reduce((a, x) => a + x.warm.sticky, 0),
    },
  });
  const off = merge(all.off);
  const on = merge(all.prefix);
  const guards = BUDGETS.map((b) => merge(all["guard " + b]));
  // Times are wall ms at --time-scale; engine ms = wall ms x time scale.
  const row = (x: Side) =>
    `| ${x.decider === "off" || x.decider === "prefix" ? x.decider : "prefix, " + x.decider} | ${x.requests} | ${meanOrZero(x.ttfts).toFixed(0)} | ${pct(x.ttfts, 50).toFixed(0)} | ${pct(x.ttfts, 90).toFixed(0)} | ${pct(x.gaps, 90).toFixed(1)} | ${x.hops} | ${x.paths} | ${(x.wall / 1000).toFixed(1)} |`;
  console.log(
    `sessions=${SESSIONS} turns=${TURNS} context_words=${CONTEXT_WORDS} turn_words=${TURN_WORDS} max_uncached=${MAX_UNCACHED} max_interference=${BUDGETS.join(",") || "-"} max_tokens=${MAX_TOKENS} time_scale=${TIME_SCALE} rounds=${ROUNDS} words=${WORDS} answer=${ANSWER} shared_words=${SHARED_WORDS} step_model=${STEP_MODEL}`,
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
  console.log(
    "warm turns (prompt tokens, uncached where prefilled, same decode worker as the turn before): " +
      [off, on]
        .concat(guards)
        .map(
          (x) =>
            `${x.decider} ${Math.round(x.warm.prompt / x.warm.turns)} / ${Math.round(x.warm.uncached / x.warm.turns)} / ${((100 * x.warm.sticky) / x.warm.turns).toFixed(0)}%`,
        )
        .join(", "),
  );
}

runBench(main);
