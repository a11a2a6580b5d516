// What the bridge's KV-event pushes cost the requests on the nginx path: the
// same closed-loop conversations (a long system prompt, a turn appended each
// time, concurrency 4) through nginx with the project's config (two worker
// processes, as shipped), in alternating phases with the pushing bridge
// running ("on") and stopped with SIGSTOP ("paused": the engines' events wait
// in its sockets, nothing is applied on nginx's workers). The tokenizer helper
// is a second bridge that pushes nowhere, so pausing the first one does not
// pause tokenizing. After a paused phase the first bridge resumes and catches
// up before the next phase starts. Per phase: mean and p90 TTFT at the client,
// the nginx workers' CPU per request (/proc/<pid>/schedstat), and how many
// pushes nginx answered.
//
// Usage: node --import tsx bench/nginx-pushes.ts [--rounds 3] [--turns 24] [--sims 2] [--system-tokens 3000] [--turn-tokens 300] [--helper-min N] [--concurrency 4]
import * as fs from "fs";
import {
  freePort,
  nginx08,
  startNginx,
  startSim,
  startBridge,
  stopAll,
  waitFor,
  workerArg,
  sleep,
} from "../test/harness";
import { textOfTokens, workerCpuMs } from "../test/nginx-stack";
import { mean, pct } from "./stats";
import { runBench } from "./run-bench";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const opt = optionReader(argv);
const rounds = Math.min(20, Math.max(1, Number(opt("--rounds", "3"))));
const turns = Math.min(200, Math.max(1, Number(opt("--turns", "24"))));
const nSims = Math.min(8, Math.max(1, Number(opt("--sims", "2"))));
const systemTokens = Number(opt("--system-tokens", "3000"));
const turnTokens = Number(opt("--turn-tokens", "300"));
const concurrency = Math.min(16, Math.max(1, Number(opt("--concurrency", "4"))));
// $infera_tokenizer_min_tokens (empty: the shipped default)
const helperMin = opt("--helper-min", "");

function workerPids(master: number): number[] {
  return fs.readFileSync(`/proc/${master}/task/${master}/children`, "utf8").trim().split(/\s+/).map(Number);
}

async function ttftOf(base: string, messages: unknown[]): Promise<number> {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "sim-model", messages, stream: true, max_tokens: 8 }),
  });
  if (r.status !== 200) throw new Error(`${r.status} ${(await r.text()).slice(0, 200)}`);
  const reader = r.body!.getReader();
  let first = -1;
  for (;;) {
    const { done } = await reader.read();
    if (done) break;
    if (first < 0) first = performance.now() - t0;
  }
  return first;
}

/** nginx's mirror block counts stop moving (3 equal reads 200 ms apart, at most 30 s). */
async function settled(base: string, n: number): Promise<void> {
  let last = "";
  let same = 0;
  for (let i = 0; i < 150 && same < 3; i++) {
    await sleep(200);
    const ws = (await (await fetch(`${base}/v1/admin/workers`)).json()) as { block_count: number }[];
    const now = JSON.stringify(ws.slice(0, n).map((w) => w.block_count));
    same = now === last ? same + 1 : 0;
    last = now;
  }
}

async function main(): Promise<void> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up (bash scripts/njs08.sh)");
  const sims = await Promise.all(
    Array.from({ length: nSims }, (_, i) =>
      startSim(`pp${i}`, ["--served-model-name", "sim-model", "--stream-interval", "4"]),
    ),
  );
  const helperPort = await freePort();
  const ng = await startNginx(fl, {
    tokenizer_url: `http://127.0.0.1:${helperPort}/v1/tokenize`,
    ...(helperMin ? { tokenizer_min_tokens: helperMin } : {}),
  });
  const master = Number(fs.readFileSync(`${ng.dir}/nginx.pid`, "utf8").trim());
  const pusher = await startBridge(["--workers", workerArg(sims), "--log-level", "warn"], `${ng.url}/_infera/push`);
  // The helper: a bridge whose pushes go to a closed port (it backs off), so stopping the pusher leaves it answering.
  const dead = await freePort();
  await startBridge(
    ["--workers", workerArg(sims), "--log-level", "error", "--admin-port", String(helperPort)],
    `http://127.0.0.1:${dead}/_infera/push`,
  );
  await waitFor(
    "nginx sees the fleet",
    async () => {
      const r = await fetch(`${ng.url}/v1/admin/workers`).catch(() => null);
      return !!r && r.status === 200 && ((await r.json()) as unknown[]).length === nSims;
    },
    30000,
  );
  await waitFor(
    "the helper answers",
    async () => !!(await fetch(`http://127.0.0.1:${helperPort}/livez`).catch(() => null)),
    30000,
  );
  const pushes = async () => {
    const lines = fs.readFileSync(`${ng.dir}/access.log`, "utf8").split("\n");
    return lines.filter((l) => l.includes('"uri":"/_infera/push"')).length;
  };
  const rows: string[] = [
    "| round | pushes | requests | TTFT mean ms | p50 | p90 | nginx workers' CPU ms / request | pushes applied in the phase |",
    "|---:|---|---:|---:|---:|---:|---:|---:|",
  ];
  const acc: Record<string, { ttft: number[]; cpu: number; n: number }> = {
    on: { ttft: [], cpu: 0, n: 0 },
    paused: { ttft: [], cpu: 0, n: 0 },
  };
  let conv = 0;
  for (let round = 0; round < rounds; round++)
    for (const mode of round % 2 ? ["paused", "on"] : ["on", "paused"]) {
      if (mode === "paused") process.kill(pusher.child.pid!, "SIGSTOP");
      const pids = workerPids(master);
      const cpu0 = pids.reduce((a, p) => a + workerCpuMs(p), 0);
      const p0 = await pushes();
      const ttfts: number[] = [];
      // concurrency conversations, each turns/concurrency turns long, fresh ones every phase
      const per = Math.max(1, Math.round(turns / concurrency));
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          const id = conv++;
          const messages: unknown[] = [{ role: "system", content: textOfTokens(`sys${id}r${round}`, systemTokens) }];
          for (let t = 0; t < per; t++) {
            messages.push({ role: "user", content: textOfTokens(`u${id}t${t}`, turnTokens) });
            ttfts.push(await ttftOf(ng.url, messages));
            messages.push({ role: "assistant", content: `answer ${t} of ${id}` });
          }
        }),
      );
      const cpu = pids.reduce((a, p) => a + workerCpuMs(p), 0) - cpu0;
      const applied = (await pushes()) - p0;
      if (mode === "paused") process.kill(pusher.child.pid!, "SIGCONT");
      await settled(ng.url, nSims);
      const a = acc[mode];
      a.ttft.push(...ttfts);
      a.cpu += cpu;
      a.n += ttfts.length;
      rows.push(
        `| ${round + 1} | ${mode} | ${ttfts.length} | ${mean(ttfts).toFixed(1)} | ${pct(ttfts, 50).toFixed(1)} | ${pct(ttfts, 90).toFixed(1)} | ${(cpu / ttfts.length).toFixed(2)} | ${applied} |`,
      );
      process.stderr.write(rows[rows.length - 1] + "\n");
    }
  for (const mode of ["on", "paused"]) {
    const a = acc[mode];
    rows.push(
      `| all | ${mode} | ${a.n} | ${mean(a.ttft).toFixed(1)} | ${pct(a.ttft, 50).toFixed(1)} | ${pct(a.ttft, 90).toFixed(1)} | ${(a.cpu / a.n).toFixed(2)} | |`,
    );
  }
  await stopAll();
  process.stdout.write(
    `nginx-pushes, ${new Date().toISOString()}; command: node --import tsx bench/nginx-pushes.ts ${argv.join(" ")}\n\n` +
      rows.join("\n") +
      "\n",
  );
}

runBench(main);
