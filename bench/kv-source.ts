// KV source hint (--kv-source-hint) against recompute, through real Envoy on
// 4 mixed simulators with the KV transfer modelled: a few long shared
// contexts asked about concurrently, each question with a long prompt of its
// own, so a context's holder fills up and the router spreads its requests to
// workers that lack the context. Without the hint they recompute it; with it
// they pull it from the holder. Sides off/on/on/off (ABBA), fresh fleets.
// Usage: node --import tsx bench/kv-source.ts [--clients 24] [--requests 4] [--contexts 3]
import { startSim, startRouter, startEnvoy, workerArg, longText, stopAll, envoyBin, sleep } from "../test/harness";

function arg(name: string, def: number): number {
  const i = process.argv.indexOf("--" + name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}
const CLIENTS = arg("clients", 24);
const REQUESTS = arg("requests", 4);
const CONTEXTS = arg("contexts", 3);
const CONTEXT_WORDS = arg("context-words", 500);
const QUESTION_WORDS = arg("question-words", 60);
const TIME_SCALE = arg("time-scale", 0.25);
const ROUNDS = arg("rounds", 2);
// 128 KiB of KV per token (8B-class model) over 100 Gbit/s; see docs/simulator.md.
const SIM = [
  "--prefill-us-per-token",
  "60",
  "--decode-ms-per-token",
  "12",
  "--kv-bytes-per-token",
  "131072",
  "--kv-link-gbps",
  "100",
  "--time-scale",
  String(TIME_SCALE),
];

function pct(xs: number[], p: number): number {
  const s = xs.slice().sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
}
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

async function ask(base: string, content: string) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, max_tokens: 16, messages: [{ role: "user", content }] }),
  });
  const reader = r.body!.getReader();
  let ttft = -1;
  let text = "";
  const dec = new TextDecoder();
  for (let i = 0; i < 100000; i++) {
    const c = await reader.read();
    if (c.done) break;
    if (ttft < 0) ttft = performance.now() - t0;
    text += dec.decode(c.value);
  }
  const m = /"cached_tokens":(\d+)/.exec(text);
  return { ttft, cached: m ? Number(m[1]) : 0, pulled: Number(r.headers.get("x-sim-kv-pulled-tokens") || 0) };
}

async function side(hint: "off" | "on") {
  const tag = hint === "off" ? "f" : "n";
  const sims = await Promise.all([0, 1, 2, 3].map((i) => startSim(`${tag}${i}`, SIM)));
  const router = await startRouter(["--workers", workerArg(sims), "--kv-source-hint", hint, "--log-level", "warn"]);
  const envoy = await startEnvoy(router.grpcPort);
  const contexts = Array.from({ length: CONTEXTS }, (_, i) => longText(`doc${i}x`, CONTEXT_WORDS));
  // Each context computed once first, so every side starts with one holder per context.
  for (const c of contexts) await ask(envoy.url, c + " summary");
  await sleep(200);
  const ttfts: number[] = [];
  let cached = 0;
  let pulled = 0;
  let prompts = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CLIENTS }, async (_, k) => {
      for (let i = 0; i < REQUESTS; i++) {
        const r = await ask(envoy.url, contexts[(k + i) % CONTEXTS] + " " + longText(`q${k}r${i}x`, QUESTION_WORDS));
        ttfts.push(r.ttft);
        cached += r.cached;
        pulled += r.pulled;
        prompts++;
      }
    }),
  );
  const wall = performance.now() - t0;
  await stopAll();
  return { hint, ttfts, cached, pulled, prompts, wall };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy binary not found");
  type Side = Awaited<ReturnType<typeof side>>;
  const all: { off: Side[]; on: Side[] } = { off: [], on: [] };
  for (let r = 0; r < ROUNDS; r++) {
    const order: ("off" | "on")[] = r % 2 ? ["on", "off"] : ["off", "on"];
    for (const h of order) all[h].push(await side(h));
  }
  const merge = (xs: Side[]) => ({
    hint: xs[0].hint,
    ttfts: xs.flatMap((x) => x.ttfts),
    cached: xs.reduce((a, x) => a + x.cached, 0),
    pulled: xs.reduce((a, x) => a + x.pulled, 0),
    prompts: xs.reduce((a, x) => a + x.prompts, 0),
    wall: xs.reduce((a, x) => a + x.wall, 0),
  });
  const off = merge(all.off);
  const on = merge(all.on);
  const row = (x: ReturnType<typeof merge>) =>
    `| ${x.hint} | ${x.prompts} | ${mean(x.ttfts).toFixed(0)} | ${pct(x.ttfts, 50).toFixed(0)} | ${pct(x.ttfts, 90).toFixed(0)} | ${Math.round(x.cached / x.prompts)} | ${Math.round(x.pulled / x.prompts)} | ${(x.wall / 1000).toFixed(1)} |`;
  console.log(
    `clients=${CLIENTS} requests=${REQUESTS} contexts=${CONTEXTS} context_words=${CONTEXT_WORDS} question_words=${QUESTION_WORDS} time_scale=${TIME_SCALE} rounds=${ROUNDS}`,
  );
  for (let r = 0; r < ROUNDS; r++)
    console.log(
      `round ${r + 1}: mean TTFT off ${mean(all.off[r].ttfts).toFixed(0)} ms, on ${mean(all.on[r].ttfts).toFixed(0)} ms`,
    );
  console.log(
    "| --kv-source-hint | requests | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | cached tokens / req | pulled tokens / req | wall s |",
  );
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|");
  console.log(row(off));
  console.log(row(on));
  console.log(`mean TTFT off/on = ${(mean(off.ttfts) / mean(on.ttfts)).toFixed(2)}x`);
}

main().then(
  () => process.exit(0),
  async (e) => {
    console.error(e);
    await stopAll();
    process.exit(1);
  },
);
