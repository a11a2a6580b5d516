// Token ids to engines through nginx (--send-token-ids exact on the bridge and
// $infera_send_token_ids exact) against the text path, side by side: each side
// is one simulator + one-worker nginx + its bridge (tokenizer helper), started
// together and asked in turn (text first on even turns, ids first on odd
// ones), the workload of bench/token-ids.ts (a context the engine caches, then
// turns that add a new question). Per turn: TTFT at the client, and the nginx
// worker's CPU time over the request (/proc/<pid>/schedstat, as
// bench/nginx-floor.ts reads it; the previous turn's KV-event pushes are
// applied before the window opens, the turn's own land in it on both sides).
// --frontend-us charges the simulator's text prompts an engine frontend's
// tokenize (bench/token-ids.ts); ids are charged nothing.
// Usage: node --import tsx bench/nginx-token-ids.ts [--turns 8] [--frontend-us 2] [--sizes 8000,100000]
import { freePort, nginx08, Sim, sleep, startSim, stopAll, workerArg, waitFor } from "../test/harness";
import { mirrorSettled, NginxStack, startBridgeAt, startNginx1, workerCpuMs } from "../test/nginx-stack";
import { meanOrZero, pct } from "./stats";
import { runBench } from "./run-bench";
import { naturalText, numArg, timedChat } from "./transfer-ab";

const TURNS = Math.min(64, Math.max(1, numArg("turns", 8)));
const FRONTEND_US = numArg("frontend-us", 2);
const sArg = process.argv.indexOf("--sizes");
const SIZES = (sArg >= 0 ? process.argv[sArg + 1] : "8000,100000").split(",").map(Number);
const newTokens = (n: number) => (n >= 50000 ? 1000 : 500);

interface Side {
  name: string;
  sim: Sim;
  ng: NginxStack;
}

async function side(name: string, ids: boolean): Promise<Side> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up: bash scripts/njs08.sh");
  const sim = await startSim(name + "0", [
    "--frontend-us-per-token",
    String(FRONTEND_US),
    "--capacity-blocks",
    "60000",
  ]);
  const port = await freePort();
  const vars: Record<string, string> = {
    tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize`,
    max_body_bytes: "16000000",
  };
  if (ids) vars.send_token_ids = "exact";
  const ng = await startNginx1(fl, vars);
  // (Not --log-level warn: startBridgeAt waits for the bridge's "bridge started" line.)
  await startBridgeAt(workerArg([sim]), `${ng.url}/_infera/push`, port, ["--send-token-ids", ids ? "exact" : "off"]);
  await waitFor(
    "fleet" + (ids ? " with parity exact" : ""),
    async () => {
      const ws = (await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as {
        render_parity?: { status: string };
      }[];
      return ws.length === 1 && (!ids || (!!ws[0].render_parity && ws[0].render_parity.status === "exact"));
    },
    30000,
  );
  return { name, sim, ng };
}

async function ask(s: Side, system: string, question: string) {
  await sleep(20);
  const c0 = workerCpuMs(s.ng.workerPid);
  const r = await timedChat(s.ng.url, {
    model: "m",
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 4,
    messages: [
      { role: "system", content: system },
      { role: "user", content: question },
    ],
  });
  const cpu = workerCpuMs(s.ng.workerPid) - c0;
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.text.slice(0, 200)}`);
  const p = /"prompt_tokens":(\d+)/.exec(r.text);
  const c = /"cached_tokens":(\d+)/.exec(r.text);
  return {
    ttft: r.ttft,
    cpu,
    prompt: p ? Number(p[1]) : 0,
    cached: c ? Number(c[1]) : 0,
    input: r.headers.get("x-sim-prompt-input") || "",
    digest: r.headers.get("x-sim-prompt-digest") || "",
    content: r.text.replace(/"(id|created)":("[^"]*"|\d+)/g, ""),
  };
}

async function main() {
  const text = await side("text", false);
  const ids = await side("ids", true);
  console.log(`turns=${TURNS} frontend_us_per_token=${FRONTEND_US} sizes=${SIZES.join(",")}`);
  console.log(
    "| context tokens | new tokens | side | turns | mean TTFT ms | p50 TTFT ms | p90 TTFT ms | nginx worker CPU ms / request (mean) | p50 | prompt tokens | cached tokens / turn | engine got |",
  );
  console.log("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
  const ratios: string[] = [];
  const differ = { digest: 0, answer: 0 };
  for (const size of SIZES) {
    const context = naturalText(`ctx${size}`, size);
    await ask(text, context, "Read this.");
    await ask(ids, context, "Read this.");
    await Promise.all([mirrorSettled(text.ng, [text.sim]), mirrorSettled(ids.ng, [ids.sim])]);
    const res: Record<string, Awaited<ReturnType<typeof ask>>[]> = { text: [], ids: [] };
    for (let t = 0; t < TURNS; t++) {
      const q = naturalText(`q${size}t${t}`, newTokens(size));
      const order: Side[] = t % 2 ? [ids, text] : [text, ids];
      const got: Record<string, Awaited<ReturnType<typeof ask>>> = {};
      for (const s of order) got[s.name] = await ask(s, context, q);
      if (got.text.digest !== got.ids.digest) differ.digest++;
      if (got.text.content !== got.ids.content) differ.answer++;
      res.text.push(got.text);
      res.ids.push(got.ids);
      await Promise.all([mirrorSettled(text.ng, [text.sim]), mirrorSettled(ids.ng, [ids.sim])]);
    }
    for (const name of ["text", "ids"]) {
      const xs = res[name];
      const tt = xs.map((x) => x.ttft);
      const cpu = xs.map((x) => x.cpu);
      console.log(
        `| ${size} | ${newTokens(size)} | ${name} | ${xs.length} | ${meanOrZero(tt).toFixed(1)} | ${pct(tt, 50).toFixed(1)} | ${pct(tt, 90).toFixed(1)} | ${meanOrZero(cpu).toFixed(2)} | ${pct(cpu, 50).toFixed(2)} | ${xs[0].prompt} | ${Math.round(meanOrZero(xs.map((x) => x.cached)))} | ${[...new Set(xs.map((x) => x.input))].join(",")} |`,
      );
    }
    const m = (side: string, k: "ttft" | "cpu") => meanOrZero(res[side].map((x) => x[k]));
    ratios.push(
      `${size}: mean TTFT text/ids = ${(m("text", "ttft") / m("ids", "ttft")).toFixed(2)}x; nginx worker CPU ids - text = ${(m("ids", "cpu") - m("text", "cpu")).toFixed(2)} ms/request`,
    );
  }
  for (const r of ratios) console.log(r);
  console.log(`turns with different prompt tokens: ${differ.digest}; with different answers: ${differ.answer}`);
  await stopAll();
}

runBench(main);
