// Token ids to engines (--send-token-ids exact) against text, end to end
// through real Envoy: one simulator + router + Envoy per side, started
// together and asked in turn (text, ids, text, ids ...), so both sides see the
// same machine. The workload is the case issue 29 names: a long context the
// engine already caches and a short new turn (an agent turn of ~8k tokens with
// ~500 new; a 100k-token document with ~1k new). Each context is sent once to
// warm the engine's cache, then every turn asks it again with a new question.
//
// The simulator does not spend an engine frontend's render + tokenize on its
// own; --frontend-us-per-token (sim flag) charges it for text prompts, here at
// the Llama-3.1 encode rate measured in docs/benchmarks/2026-12-05-token-ids.md
// (override with --frontend-us; 0 = no charge: what remains is the router's
// own cost of sending ids and the simulator's own tokenize time).
// Usage: node --import tsx bench/token-ids.ts [--turns 8] [--frontend-us 2] [--sizes 8000,100000]
import { startEnvoyFleet, stopAll, envoyBin, sleep, EnvoyFleet } from "../test/harness";
import { meanOrZero, pct } from "./stats";
import { runBench } from "./run-bench";
import { naturalText, numArg, timedChat } from "./transfer-ab";

const TURNS = numArg("turns", 8);
const FRONTEND_US = numArg("frontend-us", 2);
const sArg = process.argv.indexOf("--sizes");
const SIZES = (sArg >= 0 ? process.argv[sArg + 1] : "8000,100000").split(",").map(Number);

/** New tokens per turn for a context of n tokens: an agent turn's ~500 at 8k, 1k at 100k. */
const newTokens = (n: number) => (n >= 50000 ? 1000 : 500);

async function ask(f: EnvoyFleet, system: string, question: string) {
  const r = await timedChat(f.envoy.url, {
    model: "m",
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 4,
    messages: [
      { role: "system", content: system },
      { role: "user", content: question },
    ],
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.text.slice(0, 200)}`);
  const p = /"prompt_tokens":(\d+)/.exec(r.text);
  const c = /"cached_tokens":(\d+)/.exec(r.text);
  return {
    ttft: r.ttft,
    prompt: p ? Number(p[1]) : 0,
    cached: c ? Number(c[1]) : 0,
    input: r.headers.get("x-sim-prompt-input") || "",
    digest: r.headers.get("x-sim-prompt-digest") || "",
    content: r.text.replace(/"(id|created)":("[^"]*"|\d+)/g, ""),
  };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy binary not found");
  const simArgs = ["--frontend-us-per-token", String(FRONTEND_US)];
  const text = await startEnvoyFleet({ ids: ["txt0"], simArgs, routerArgs: ["--log-level", "warn"] });
  const ids = await startEnvoyFleet({
    ids: ["ids0"],
    simArgs,
    routerArgs: ["--log-level", "warn", "--send-token-ids", "exact"],
  });
  // The ids side sends ids only once the probe found the worker exact.
  for (let i = 0; i < 200; i++) {
    const w = (await ids.router.workers()) as unknown as { render_parity: { status: string } }[];
    if (w[0]?.render_parity.status === "exact") break;
    await sleep(100);
  }
  console.log(`turns=${TURNS} frontend_us_per_token=${FRONTEND_US} sizes=${SIZES.join(",")}`);
  console.log(
    "| context tokens | new tokens | side | turns | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | prompt tokens | cached tokens / turn | engine got |",
  );
  console.log("|---:|---:|---|---:|---:|---:|---:|---:|---:|---|");
  const ratios: string[] = [];
  // Turns whose engines ran different prompt tokens, or whose answers (text, usage) differ: 0 expected.
  const differ = { digest: 0, answer: 0 };
  for (const size of SIZES) {
    const context = naturalText(`ctx${size}`, size);
    // Warm both engines' caches with the context (and the router's mirrors).
    await ask(text, context, "Read this.");
    await ask(ids, context, "Read this.");
    await Promise.all([text.settled(), ids.settled()]);
    const res: Record<string, Awaited<ReturnType<typeof ask>>[]> = { text: [], ids: [] };
    for (let t = 0; t < TURNS; t++) {
      const q = naturalText(`q${size}t${t}`, newTokens(size));
      // Alternate which side goes first, so neither always follows the other.
      const order: [string, EnvoyFleet][] =
        t % 2
          ? [
              ["ids", ids],
              ["text", text],
            ]
          : [
              ["text", text],
              ["ids", ids],
            ];
      const got: Record<string, Awaited<ReturnType<typeof ask>>> = {};
      for (const [name, f] of order) got[name] = await ask(f, context, q);
      if (got.text.digest !== got.ids.digest) differ.digest++;
      if (got.text.content !== got.ids.content) differ.answer++;
      res.text.push(got.text);
      res.ids.push(got.ids);
      await Promise.all([text.settled(), ids.settled()]);
    }
    for (const side of ["text", "ids"]) {
      const xs = res[side];
      const tt = xs.map((x) => x.ttft);
      console.log(
        `| ${size} | ${newTokens(size)} | ${side} | ${xs.length} | ${meanOrZero(tt).toFixed(1)} | ${pct(tt, 50).toFixed(1)} | ${pct(tt, 90).toFixed(1)} | ${xs[0].prompt} | ${Math.round(meanOrZero(xs.map((x) => x.cached)))} | ${[...new Set(xs.map((x) => x.input))].join(",")} |`,
      );
    }
    ratios.push(
      `${size}: mean TTFT text/ids = ${(meanOrZero(res.text.map((x) => x.ttft)) / meanOrZero(res.ids.map((x) => x.ttft))).toFixed(2)}x`,
    );
  }
  for (const r of ratios) console.log(r);
  console.log(`turns with different prompt tokens: ${differ.digest}; with different answers: ${differ.answer}`);
  await stopAll();
}

runBench(main);
