// Where a request's time goes on the NGINX path against the Envoy path, on
// one idle simulator: the same chat prompt sent directly, through Envoy + the
// ext_proc router, and through nginx (nginx/nginx.conf rendered by the same
// code as `npm run nginx`) with and without the tokenizer helper, one request
// at a time in rotating order. For nginx, the access log gets nginx's own
// upstream timings, so the route phase (body read, njs parse/tokenize/pick,
// internal redirect) is separated from the upstream part:
//   client headers  client send -> response headers at the client (the
//                   simulator writes its headers with the first token)
//   upstream hdr    $upstream_header_time: nginx starts connecting to the
//                   worker -> the worker's headers (first token) at nginx
//   connect         $upstream_connect_time
//   before upstream client headers - upstream hdr: everything nginx does
//                   before it connects to the worker, plus the loopback hops
// and the nginx workers' CPU per request (/proc, 10 ms ticks).
//
// Usage: node --import tsx bench/nginx-phases.ts [--sizes 2000,4000,8000] [--rounds 6] [--kinds cold,warm] [--helper-min N] [--text dense|prose]
import * as fs from "fs";
import * as path from "path";
import {
  nginx08,
  renderNginx,
  run,
  freePort,
  startSim,
  startRouter,
  startEnvoy,
  startBridge,
  longText,
  stopAll,
  waitFor,
} from "../test/harness";
import * as os from "os";
import { median } from "./stats";
import { runBench } from "./run-bench";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const opt = optionReader(argv);
const sizes = opt("--sizes", "2000,4000,8000").split(",").map(Number);
const rounds = Math.min(50, Math.max(1, Number(opt("--rounds", "6"))));
const kinds = opt("--kinds", "cold,warm").split(",");
// $infera_tokenizer_min_tokens of the helper side (empty: the shipped default)
const helperMin = opt("--helper-min", "");
// --text dense: longText (digit-heavy words, ~1.2 bytes per token); prose: English words (~4-5 bytes per token)
const prose = opt("--text", "dense") === "prose";
const WORDS = (
  "the of and to in is that for it as was with be by on not he this are or his from at which but have an they " +
  "you were her all she there would their we him been has when who will more no if out so said what up its about " +
  "into than them can only other new some could time these two may then do first any my now such like our over"
).split(" ");
/** About `tokens` tokens of English words, seeded so different seeds differ from the first word. */
function proseText(seed: string, tokens: number): string {
  let h = 0;
  for (let i = 0; i < seed.length; i++) h = (Math.imul(h, 31) + seed.charCodeAt(i)) >>> 0;
  const out = [seed];
  for (let i = 0; i < tokens; i++) {
    h = (Math.imul(h, 1103515245) + 12345) >>> 0;
    out.push(WORDS[(h >>> 8) % WORDS.length] + (i % 17 === 16 ? "." : ""));
  }
  return out.join(" ");
}
const textOf = (seed: string, tokens: number) =>
  prose ? proseText(seed, tokens) : longText(seed, Math.round(tokens / 10.8));

function childrenCpuMs(pid: number): number {
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
    if (Number(f[1]) !== pid) continue;
    ms += (Number(f[11]) + Number(f[12])) * 10;
  }
  return ms;
}

interface Ngx {
  url: string;
  log: string;
  pid: () => number;
}

/** nginx with the project's config, its access log extended with the upstream timings. */
async function startTimedNginx(vars: Record<string, string>): Promise<Ngx> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up (bash scripts/njs08.sh)");
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-nginx-phases-"));
  const conf = renderNginx(fl, port, dir, vars);
  const text = fs
    .readFileSync(conf, "utf8")
    .replace(
      /"release":"\$infera_release"\}';/,
      `"release":"$infera_release","rt":"$request_time","uct":"$upstream_connect_time","uht":"$upstream_header_time","conn":"$connection","creq":"$connection_requests"}';`,
    );
  fs.writeFileSync(conf, text);
  run("nginx-phases", fl.bin, ["-p", dir, "-c", conf, "-e", "stderr", "-g", "daemon off;"], {
    INFERA_PUSH_TOKEN: "test-token",
  });
  const url = `http://127.0.0.1:${port}`;
  await waitFor("nginx", async () => !!(await fetch(`${url}/v1/admin/reservations`).catch(() => null)));
  return { url, log: `${dir}/access.log`, pid: () => Number(fs.readFileSync(`${dir}/nginx.pid`, "utf8").trim()) };
}

/** The access log line of request id (nginx writes it at log phase, which can come after the client saw EOF). */
async function logLine(file: string, id: string): Promise<Record<string, string>> {
  for (let i = 0; i < 100; i++) {
    for (const l of fs.readFileSync(file, "utf8").trim().split("\n").reverse()) {
      const j = JSON.parse(l) as Record<string, string>;
      if (j.request_id === id) return j;
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`no access log line for ${id}`);
}

let seq = 0;
async function timed(base: string, content: string): Promise<{ hdr: number; first: number; id: string }> {
  const id = `phase-${process.pid}-${++seq}`;
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": id },
    body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content }], stream: true, max_tokens: 2 }),
  });
  const hdr = performance.now() - t0;
  if (r.status !== 200) throw new Error(`${base}: ${r.status} ${(await r.text()).slice(0, 200)}`);
  const reader = r.body!.getReader();
  let first = -1;
  for (;;) {
    const { done } = await reader.read();
    if (done) break;
    if (first < 0) first = performance.now() - t0;
  }
  return { hdr, first, id };
}

async function main(): Promise<void> {
  const sim = await startSim("p0", ["--served-model-name", "sim-model", "--stream-interval", "4"]);
  const w = `${sim.address}@${sim.events}`;
  const router = await startRouter(["--workers", w, "--log-level", "warn"]);
  const envoy = await startEnvoy(router.grpcPort);
  const njsOnly = await startTimedNginx({ tokenizer_url: '""' });
  await startBridge(["--workers", w, "--log-level", "warn"], `${njsOnly.url}/_infera/push`);
  const helperPort = await freePort();
  const helped = await startTimedNginx({
    tokenizer_url: `http://127.0.0.1:${helperPort}/v1/tokenize`,
    ...(helperMin ? { tokenizer_min_tokens: helperMin } : {}),
  });
  await startBridge(
    ["--workers", w, "--log-level", "warn", "--admin-port", String(helperPort)],
    `${helped.url}/_infera/push`,
  );
  await waitFor("router sees the worker", async () => (await router.workers()).length === 1);
  for (const n of [njsOnly, helped])
    await waitFor("nginx sees the worker", async () => {
      const r = await fetch(`${n.url}/v1/admin/workers`).catch(() => null);
      return !!r && r.status === 200 && ((await r.json()) as unknown[]).length === 1;
    });
  const sides: [string, string, Ngx | null][] = [
    ["direct", `http://${sim.address}`, null],
    ["envoy", envoy.url, null],
    ["nginx (njs tokenizes)", njsOnly.url, njsOnly],
    ["nginx (helper)", helped.url, helped],
  ];
  for (const [, url] of sides) for (let i = 0; i < 3; i++) await timed(url, longText(`warm${i}${url}`, 300));
  const rows = [
    "| prompt | path | client TTFT ms | client headers ms | nginx upstream hdr ms | connect ms | before upstream ms | nginx worker CPU ms | added vs direct |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const kind of kinds)
    for (const tokens of sizes) {
      const acc: Record<string, { first: number[]; hdr: number[]; uht: number[]; uct: number[]; cpu: number[] }> = {};
      for (const [name] of sides) acc[name] = { first: [], hdr: [], uht: [], uct: [], cpu: [] };
      for (let r = 0; r < rounds; r++)
        for (let k = 0; k < sides.length; k++) {
          const [name, url, ng] = sides[(r + k) % sides.length];
          // the same seed length on every side: equal prompt sizes
          const text = textOf(`p${kind[0]}${tokens}r${r}s${(r + k) % sides.length}`, tokens);
          // warm: the same prompt once before, so the worker holds it and the router must find it
          if (kind === "warm") await timed(url, text);
          const c0 = ng ? childrenCpuMs(ng.pid()) : 0;
          const t = await timed(url, text);
          const a = acc[name];
          a.first.push(t.first);
          a.hdr.push(t.hdr);
          if (ng) {
            a.cpu.push(childrenCpuMs(ng.pid()) - c0);
            const l = await logLine(ng.log, t.id);
            a.uht.push(Number(l.uht) * 1000);
            a.uct.push(Number(l.uct) * 1000);
          }
        }
      const d = median(acc.direct.first);
      for (const [name] of sides) {
        const a = acc[name];
        const m = (xs: number[]) => (xs.length ? median(xs).toFixed(1) : "–");
        const before = a.uht.length ? median(a.hdr.map((h, i) => h - a.uht[i])).toFixed(1) : "–";
        rows.push(
          `| ${kind} ${tokens} | ${name} | ${m(a.first)} | ${m(a.hdr)} | ${m(a.uht)} | ${m(a.uct)} | ${before} | ${m(a.cpu)} | ${(median(a.first) - d).toFixed(1)} |`,
        );
        process.stderr.write(rows[rows.length - 1] + "\n");
      }
    }
  await stopAll();
  process.stdout.write(
    `nginx-phases, ${new Date().toISOString()}, ${rounds} rounds, medians; command: node --import tsx bench/nginx-phases.ts ${argv.join(" ")}\n\n` +
      rows.join("\n") +
      "\n",
  );
}

runBench(main);
