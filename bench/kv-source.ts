// KV source hint (--kv-source-hint) against recompute, through real Envoy on
// 4 mixed simulators with the KV transfer modelled: a few long shared
// contexts asked about concurrently, each question with a long prompt of its
// own, so a context's holder fills up and the router spreads its requests to
// workers that lack the context. Without the hint they recompute it; with it
// they pull it from the holder. Sides off/on/on/off (ABBA), fresh fleets.
// --words natural writes English words (~1 token each; contexts of tens of
// thousands of tokens, as agent contexts are) instead of the harness's made-up
// ones (~10 tokens each); --overlap-weight sets the router's
// --kv-overlap-weight on both sides (how much queue a holder may build before
// the router leaves it). Reports how many requests were sent with a hint and
// pulled KV.
// Usage: node --import tsx bench/kv-source.ts [--clients 24] [--requests 4] [--contexts 3] [--words natural] [--overlap-weight 8] [--phased] [--no-pull-side]
import { startEnvoyFleet, longText, stopAll, envoyBin, sleep } from "../test/harness";
import { meanOrZero, pct } from "./stats";
import { runBench } from "./run-bench";
import { abbaRounds, clientsWall, naturalText, numArg as arg, timedChat, transferSim } from "./transfer-ab";

const CLIENTS = arg("clients", 24);
const REQUESTS = arg("requests", 4);
const CONTEXTS = arg("contexts", 3);
const CONTEXT_WORDS = arg("context-words", 500);
const QUESTION_WORDS = arg("question-words", 60);
const TIME_SCALE = arg("time-scale", 0.25);
const ROUNDS = arg("rounds", 2);
const SIM = transferSim(TIME_SCALE);
const wArg = process.argv.indexOf("--words");
const NATURAL = wArg >= 0 && process.argv[wArg + 1] === "natural";
const text = (seed: string, n: number) => (NATURAL ? naturalText(seed, n) : longText(seed, n));
const OVERLAP = arg("overlap-weight", -1);
// --phased: every client's i-th request asks context i (all clients on one context at a time), so that
// context's holder takes the whole burst; otherwise client k's i-th request asks context k + i.
const PHASED = process.argv.includes("--phased");
// --no-pull-side: a third side with the hint on and the kv-pull scorer off (--scorer-weights kv-pull=0),
// the hint alone with blocks priced as compute.
const NO_PULL = process.argv.includes("--no-pull-side");
type Mode = "off" | "on" | "on, kv-pull=0";

async function ask(base: string, content: string) {
  const r = await timedChat(base, { model: "m", stream: true, max_tokens: 16, messages: [{ role: "user", content }] });
  const m = /"cached_tokens":(\d+)/.exec(r.text);
  return {
    ttft: r.ttft,
    cached: m ? Number(m[1]) : 0,
    pulled: Number(r.headers.get("x-sim-kv-pulled-tokens") || 0),
    worker: r.headers.get("x-sim-worker") || "",
  };
}

async function side(hint: Mode) {
  const tag = hint === "off" ? "f" : hint === "on" ? "n" : "z";
  const { envoy } = await startEnvoyFleet({
    ids: [0, 1, 2, 3].map((i) => `${tag}${i}`),
    simArgs: SIM,
    routerArgs: ["--kv-source-hint", hint === "off" ? "off" : "on", "--log-level", "warn"].concat(
      hint === "on, kv-pull=0" ? ["--scorer-weights", "kv-pull=0"] : [],

      OVERLAP >= 0 ? ["--kv-overlap-weight", String(OVERLAP)] : [],
    ),
  });
  const contexts = Array.from({ length: CONTEXTS }, (_, i) => text(`doc${i}x`, CONTEXT_WORDS));
  // Each context computed once first, so every side starts with one holder per context.
  const holders: string[] = [];
  for (const c of contexts) holders.push((await ask(envoy.url, c + " summary")).worker);
  await sleep(200);
  const ttfts: number[] = [];
  let cached = 0;
  let pulled = 0;
  let prompts = 0;
  let pulls = 0;
  let away = 0;
  const wall = await clientsWall(CLIENTS, async (k) => {
    for (let i = 0; i < REQUESTS; i++) {
      const c = ((PHASED ? 0 : k) + i) % CONTEXTS;
      const r = await ask(envoy.url, contexts[c] + " " + text(`q${k}r${i}x`, QUESTION_WORDS));
      ttfts.push(r.ttft);
      if (r.pulled > 0) pulls++;
      if (r.worker !== holders[c]) away++;
      cached += r.cached;
      pulled += r.pulled;
      prompts++;
    }
  });
  await stopAll();
  return { hint, ttfts, cached, pulled, prompts, wall, pulls, away };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy binary not found");
  type Side = Awaited<ReturnType<typeof side>>;
  const modes: Mode[] = NO_PULL ? ["off", "on", "on, kv-pull=0"] : ["off", "on"];
  const all = await abbaRounds<Mode, Side>(modes, ROUNDS, side);
  const merge = (xs: Side[]) => ({
    hint: xs[0].hint,
    ttfts: xs.flatMap((x) => x.ttfts),
    cached: xs.reduce((a, x) => a + x.cached, 0),
    pulled: xs.reduce((a, x) => a + x.pulled, 0),
    prompts: xs.reduce((a, x) => a + x.prompts, 0),
    wall: xs.reduce((a, x) => a + x.wall, 0),
    pulls: xs.reduce((a, x) => a + x.pulls, 0),
    away: xs.reduce((a, x) => a + x.away, 0),
  });
  const off = merge(all.off);
  const on = merge(all.on);
  const row = (x: ReturnType<typeof merge>) =>
    `| ${x.hint} | ${x.prompts} | ${meanOrZero(x.ttfts).toFixed(0)} | ${pct(x.ttfts, 50).toFixed(0)} | ${pct(x.ttfts, 90).toFixed(0)} | ${Math.round(x.cached / x.prompts)} | ${Math.round(x.pulled / x.prompts)} | ${x.away} | ${x.pulls} | ${(x.wall / 1000).toFixed(1)} |`;
  console.log(
    `clients=${CLIENTS} requests=${REQUESTS} contexts=${CONTEXTS} context_words=${CONTEXT_WORDS} question_words=${QUESTION_WORDS} time_scale=${TIME_SCALE} rounds=${ROUNDS} words=${NATURAL ? "natural" : "synthetic"} overlap_weight=${OVERLAP >= 0 ? OVERLAP : "default"} phased=${PHASED}`,
  );
  for (let r = 0; r < ROUNDS; r++)
    console.log(
      `round ${r + 1}: mean TTFT ` + modes.map((m) => `${m} ${meanOrZero(all[m][r].ttfts).toFixed(0)} ms`).join(", "),
    );
  console.log(
    "| --kv-source-hint | requests | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | cached tokens / req | pulled tokens / req | served off the first holder | pulled | wall s |",
  );
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
  console.log(row(off));
  console.log(row(on));
  const np = NO_PULL ? merge(all["on, kv-pull=0"]) : null;
  if (np) console.log(row(np));
  console.log(`mean TTFT off/on = ${(meanOrZero(off.ttfts) / meanOrZero(on.ttfts)).toFixed(2)}x`);
  if (np) console.log(`mean TTFT off/(on, kv-pull=0) = ${(meanOrZero(off.ttfts) / meanOrZero(np.ttfts)).toFixed(2)}x`);
}

runBench(main);
