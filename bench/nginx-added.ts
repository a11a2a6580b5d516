// What each gateway adds to one request's first token, on an idle fleet: the
// same cold prompt (unique words, so no cache decides anything) sent to one
// simulator directly, through Envoy + the ext_proc router, and through NGINX
// (njs + bridge), one request at a time, the three in rotating order. Also
// the nginx workers' CPU time per request (utime + stime of the master's
// children from /proc), which is the njs route's cost: parse, chat template,
// tokenize, hash, pick, on the nginx worker's event loop.
//
// Usage: node --import tsx bench/nginx-added.ts [--sizes 1000,4000,8000,16000] [--rounds 8]
import * as fs from "fs";
import {
  nginx08,
  startSim,
  startRouter,
  startEnvoy,
  startNginx,
  startBridge,
  chat,
  longText,
  stopAll,
  waitFor,
} from "../test/harness";
import { median } from "./stats";
import { runBench } from "./run-bench";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const opt = optionReader(argv);
const sizes = opt("--sizes", "1000,4000,8000,16000").split(",").map(Number);
const rounds = Math.min(50, Math.max(1, Number(opt("--rounds", "8"))));

/** CPU ms used so far by the children of pid (nginx's workers). */
function childrenCpuMs(pid: number): number {
  const tick = 100; // USER_HZ on Linux
  let ms = 0;
  for (const d of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${d}/stat`, "utf8");
    } catch {
      continue;
    }
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(f[1]) !== pid) continue; // field 4: ppid
    ms += ((Number(f[11]) + Number(f[12])) * 1000) / tick; // fields 14, 15: utime, stime
  }
  return ms;
}

async function main(): Promise<void> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up (bash scripts/njs08.sh)");
  const sim = await startSim("a0", ["--served-model-name", "sim-model"]);
  const router = await startRouter(["--workers", `${sim.address}@${sim.events}`, "--log-level", "warn"]);
  const envoy = await startEnvoy(router.grpcPort);
  const ng = await startNginx(fl);
  await startBridge(["--workers", `${sim.address}@${sim.events}`, "--log-level", "warn"], `${ng.url}/_infera/push`);
  await waitFor("router sees the worker", async () => (await router.workers()).length === 1);
  await waitFor("nginx sees the worker", async () => {
    const r = await fetch(`${ng.url}/v1/admin/workers`).catch(() => null);
    return !!r && r.status === 200 && ((await r.json()) as unknown[]).length === 1;
  });
  const pid = Number(fs.readFileSync(`${ng.dir}/nginx.pid`, "utf8").trim());
  const sides: [string, string][] = [
    ["direct", `http://${sim.address}`],
    ["envoy", envoy.url],
    ["nginx", ng.url],
  ];
  // warm every path (JIT, first connections)
  for (const [, url] of sides)
    for (let i = 0; i < 3; i++) await chat(url, longText(`warm${i}`, 300), { stream: true, maxTokens: 1 });
  const rows: string[] = [
    "| prompt tokens (approx.) | direct TTFT ms | Envoy TTFT ms | NGINX TTFT ms | Envoy added | NGINX added | nginx worker CPU ms / request |",
    "|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const tokens of sizes) {
    const t: Record<string, number[]> = { direct: [], envoy: [], nginx: [] };
    const cpu: number[] = [];
    for (let r = 0; r < rounds; r++)
      for (let k = 0; k < sides.length; k++) {
        const [name, url] = sides[(r + k) % sides.length];
        const text = longText(`n${tokens}r${r}${name}`, Math.round(tokens / 10.8));
        const c0 = name === "nginx" ? childrenCpuMs(pid) : 0;
        const res = await chat(url, text, { stream: true, maxTokens: 1 });
        if (res.status !== 200) throw new Error(`${name}: ${res.status} ${res.body.slice(0, 200)}`);
        t[name].push(res.ttftMs);
        if (name === "nginx") cpu.push(childrenCpuMs(pid) - c0);
      }
    const d = median(t.direct);
    const e = median(t.envoy);
    const n = median(t.nginx);
    rows.push(
      `| ${tokens} | ${d.toFixed(1)} | ${e.toFixed(1)} | ${n.toFixed(1)} | ${(e - d).toFixed(1)} | ${(n - d).toFixed(1)} | ${median(cpu).toFixed(0)} |`,
    );
    process.stderr.write(rows[rows.length - 1] + "\n");
  }
  await stopAll();
  process.stdout.write(
    `nginx-added, ${new Date().toISOString()}, ${rounds} rounds, medians; command: node --import tsx bench/nginx-added.ts ${argv.join(" ")}\n\n` +
      rows.join("\n") +
      "\n",
  );
}

runBench(main);
