// Real nginx (njs 0.8, one worker process) per prompt size: the nginx
// worker's CPU per request, the latency nginx adds, and what a short request
// on the same worker waits while 4 long prompts route, for prompts tokenized
// in njs and for prompts sent to the tokenizer helper (the bridge's
// /v1/tokenize), side by side in one run. Engines are simulators with no
// prefill or decode cost, so the latencies are nginx's own.
// Usage: npm run bench:nginx-scale -- [--sizes 1k,8k,32k,112k,200k] [--long 112k] [--shorts 120]
//   [--paths njs,helper] [--baseline-dist DIR] [--short-kinds chat,admin] [--nice-others N] [--ext-turns N]
//   [--bridge-args "--flag v"] [--bridge-log DIR] [--idle-shorts N] [--short-gap-ms N] [--sim-capacity-blocks N]
//   [--floor-row]
// --baseline-dist runs each path a second time ("<path> base") with the njs
// bundle in DIR (npm run build:njs in a checkout of the old commit), in the
// same run, alternating with this checkout's bundle.
import { freePort, nginx08, startSim, stopAll, waitFor, workerArg, Sim } from "../test/harness";
import { cpuMs, freeEngineArgs, NginxStack, startBridgeAt, startNginx1, textOfTokens } from "../test/nginx-stack";
import { buildNjs } from "../njs/build";
import { median, pctNearestRank } from "./stats";
import * as fs from "fs";
import * as os from "os";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const opt = optionReader(argv);
const tokensOf = (s: string) => {
  const m = /^(\d+(?:\.\d+)?)(k?)$/.exec(s.trim());
  if (!m) throw new Error(`${s} is not a token count like 8k or 1500`);
  return Math.round(Number(m[1]) * (m[2] ? 1000 : 1));
};
const sizesOpt = opt("--sizes", "1k,8k,32k,112k,200k");
const sizes = sizesOpt === "none" ? [] : sizesOpt.split(",").map(tokensOf);
const longSize = tokensOf(opt("--long", "112k"));
const shorts = Math.min(1000, Math.max(20, Number(opt("--shorts", "120"))));
const paths = opt("--paths", "njs,helper").split(",");
const baseDist = opt("--baseline-dist", "");
// What the short requests are: "chat" (routed to a zero-cost simulator) and/or
// "admin" (GET /v1/admin/reservations, answered by the nginx worker itself).
const shortKinds = opt("--short-kinds", "chat").split(",");
// --nice-others N: renice the bridges (the tokenizer helper) and the simulators
// by N, so the nginx worker wins the 2 cores: what is left of a short's wait is
// the worker's own blocking, not CPU taken by the processes beside it. The
// other stacks' nginx workers too, row by row (they apply the same pushes).
const niceOthers = Number(opt("--nice-others", "0"));
// --ext-turns N: extending turns of each cached conversation measured in one
// CPU window, one after the other, and the worker's CPU divided by N: with
// 10 ms ticks, one turn alone reads 0, 10 or 20 ms; N turns resolve 10/N ms.
const extTurns = Math.min(200, Math.max(1, Number(opt("--ext-turns", "1"))));
// --bridge-args "...": extra flags for every bridge (e.g. --bridge-push-max-blocks 0).
const bridgeArgs = opt("--bridge-args", "").split(" ").filter(Boolean);
// --bridge-log DIR: each stack's bridge and nginx logs written there at the end.
const bridgeLogDir = opt("--bridge-log", "");
// --idle-shorts N: shorts with no long prompt in flight; their p99 over their median is the floor of the tail.
// --short-gap-ms N: a pause between shorts, so that they spread over several rounds of long prompts
// and meet the KV event pushes of the rounds before (published as a prompt finishes).
const shortGapMs = Math.max(0, Number(opt("--short-gap-ms", "0")));
// --sim-capacity-blocks N: each simulator's KV capacity. nginx's mirror of every engine block must fit its
// shared dict zones (the number zone fills first): a zone full refuses pushes and the bridge resyncs.
const simCapacity = Number(opt("--sim-capacity-blocks", "200000"));
const idleShorts = Math.min(1000, Math.max(10, Number(opt("--idle-shorts", "30"))));
// --floor-row: one more shorts row, on the helper path's stack without KV events, where nginx does no
// routing: the 4 long prompts go through a plain proxy location (no njs) to a simulator, and each is
// also sent to the stack's tokenizer helper, as njs would send it. What it leaves is what any
// KV-aware router of those prompts costs this machine (the prompts tokenized somewhere, their bodies
// carried), so the p99 a short sees there is a floor for the routed rows, not a row of the product.
const floorRow = argv.includes("--floor-row");

/** The bridge's push counters (njs/bridge.ts): ok and refused pushes, resyncs. */
async function bridgeCounts(adminPort: number): Promise<{ ok: number; refused: number; resyncs: number }> {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
  const out = { ok: 0, refused: 0, resyncs: 0 };
  for (const line of text.split("\n")) {
    const m = /^infera_bridge_pushes_total\{[^}]*result="([^"]+)"[^}]*\} (\d+)/.exec(line);
    if (m) {
      if (m[1] === "ok") out.ok += Number(m[2]);
      else out.refused += Number(m[2]);
    }
    const r = /^infera_bridge_resyncs_total (\d+)/.exec(line);
    if (r) out.resyncs += Number(r[1]);
  }
  return out;
}
const countsDelta = (a: { ok: number; refused: number; resyncs: number }, b: typeof a) =>
  `${b.ok - a.ok} ok / ${b.refused - a.refused} refused / ${b.resyncs - a.resyncs} resyncs`;
// Prompts of a given token count: textOfTokens calibrates longText's words per
// seed (a word's tokens grow with the seed's length; a fixed 150 words per
// 1,024 tokens made the long prompts of earlier runs 1.7-3x their label).

let seq = 0;
function body(content: string, extra: { role: string; content: string }[] = []): string {
  return JSON.stringify({
    model: "m",
    stream: false,
    max_tokens: 1,
    messages: [{ role: "user", content }, ...extra],
  });
}

async function post(base: string, b: string): Promise<{ ms: number; status: number; worker: string | null }> {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: b,
  });
  const text = await r.text();
  if (r.status !== 200) process.stderr.write(`${base}: HTTP ${r.status}: ${text.slice(0, 300)}\n`);
  return { ms: performance.now() - t0, status: r.status, worker: r.headers.get("x-sim-worker") };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** CPU ms the nginx worker spent on one request (log phase included), and its wall time. */
async function measured(ng: NginxStack, b: string): Promise<{ cpu: number; ms: number }> {
  await sleep(30);
  const c0 = cpuMs(ng.workerPid);
  const r = await post(ng.url, b);
  if (r.status !== 200) throw new Error(`HTTP ${r.status}`);
  await sleep(30);
  return { cpu: cpuMs(ng.workerPid) - c0, ms: r.ms };
}

interface Side {
  name: string;
  ng: NginxStack;
  /** Its bridge's admin port (push counters) and log. */
  bridge: { adminPort: number; log: () => string };
  /** Per cold prompt with events: the bridge's pushes in its window. */
  pushes: string[];
  /** Per prompt size, per round: [cold CPU ms, extending-turn CPU ms, added latency ms, cold + its KV events CPU ms]. */
  res: Record<number, number[][]>;
}

async function main(): Promise<void> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up: bash scripts/njs08.sh");
  process.stderr.write("building the njs bundle\n");
  await buildNjs();
  const sims: Sim[] = await Promise.all(["b0", "b1"].map((id) => startSim(id, freeEngineArgs(simCapacity))));
  // Per path two stacks: one whose bridge follows the engines' KV events (the
  // extending turns need a mirror), one without events, where a cold prompt's
  // CPU is routing alone (a KV event batch of thousands of new blocks lands on
  // the same worker shortly after, and costs what it costs on either path).
  const sides: Side[] = [];
  const quiet: Side[] = [];
  const others: number[] = sims.map((s) => s.proc.child.pid as number);
  const names: string[] = [];
  for (const p of paths) names.push(p, ...(baseDist ? [p + " base"] : []));
  for (const name of names)
    for (const events of [true, false]) {
      const adminPort = await freePort();
      const url = name.startsWith("njs") ? '""' : `http://127.0.0.1:${adminPort}/v1/tokenize`;
      const plain = `    location = /_bench/plain {
      proxy_pass http://127.0.0.1:${sims[0].port}/v1/chat/completions;
      proxy_http_version 1.1;
    }
`;
      const ng = await startNginx1(
        fl,
        { tokenizer_url: url },
        name.endsWith(" base") ? baseDist : undefined,
        floorRow ? plain : "",
      );
      const workers = events ? workerArg(sims) : sims.map((s) => s.address).join(",");
      const br = await startBridgeAt(workers, `${ng.url}/_infera/push`, adminPort, bridgeArgs);
      others.push(br.proc.child.pid as number);
      (events ? sides : quiet).push({
        name,
        ng,
        res: {},
        bridge: { adminPort: br.adminPort, log: () => br.proc.log() },
        pushes: [],
      });
      await waitFor(
        "fleet in nginx",
        async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === sims.length,
      );
      for (let i = 0; i < 3; i++) await post(ng.url, body(textOfTokens(`warm${name}${events}${i}`, 4000)));
    }
  const saveLogs = () => {
    if (!bridgeLogDir) return;
    fs.mkdirSync(bridgeLogDir, { recursive: true });
    for (const [list, kind] of [
      [sides, "events"],
      [quiet, "quiet"],
    ] as [Side[], string][])
      for (const s of list) {
        const stem = `${bridgeLogDir}/${s.name.replace(/ /g, "-")}-${kind}`;
        fs.writeFileSync(`${stem}-bridge.log`, s.bridge.log());
        fs.writeFileSync(`${stem}-nginx.log`, s.ng.proc.log());
      }
  };
  // The KV events of the last request applied: nginx's mirror counts stop moving.
  const synced = async (ng: NginxStack) => {
    let last = "";
    let same = 0;
    for (let i = 0; i < 300 && same < 3; i++) {
      await sleep(100);
      const now = JSON.stringify(
        await Promise.all(
          sims.map(async (s) => (await (await fetch(`${ng.url}/v1/admin/cache-view/${s.address}`)).json()).block_count),
        ),
      );
      same = now === last ? same + 1 : 0;
      last = now;
    }
  };

  console.log(
    "| prompt tokens | path | worker CPU ms / request (cold) | worker CPU ms (extending turn) | added latency ms (median, cold) | worker CPU ms, cold prompt + its KV event pushes |",
  );
  console.log("|---:|---|---:|---:|---:|---:|");
  for (const size of sizes) {
    const reps = size <= 2000 ? 10 : size <= 10000 ? 5 : size <= 40000 ? 3 : 2;
    for (let r = 0; r < 2; r++) {
      // Alternate which side goes first so machine noise hits both alike.
      const order = r % 2 ? sides.slice().reverse() : sides;
      for (let si = 0; si < order.length; si++) {
        const s = order[si];
        const q = quiet[sides.indexOf(s)];
        const cold: number[] = [];
        const ext: number[] = [];
        const added: number[] = [];
        const withEvents: number[] = [];
        for (let k = 0; k < reps; k++) {
          const text = textOfTokens(`s${size}r${r}k${k}${s.name}x${seq++}`, size);
          const b = body(text);
          const m = await measured(q.ng, b);
          cold.push(m.cpu);
          // The same body straight to an engine: what nginx adds is the difference.
          const direct = await post(`http://127.0.0.1:${sims[0].port}`, b);
          added.push(m.ms - direct.ms);
          // The conversation cached on an engine and mirrored in nginx, then one more turn. A text of
          // its own: the prompts above were stored on an engine too, and their KV events reach this stack.
          const conv = textOfTokens(`c${size}r${r}k${k}${s.name}x${seq++}`, size);
          // Its CPU until the mirror settles: the routing and the pushes of the prompt's stored blocks.
          await synced(s.ng);
          const c0 = cpuMs(s.ng.workerPid);
          const p0 = await bridgeCounts(s.bridge.adminPort);
          await post(s.ng.url, body(conv));
          await synced(s.ng);
          withEvents.push(cpuMs(s.ng.workerPid) - c0);
          s.pushes.push(countsDelta(p0, await bridgeCounts(s.bridge.adminPort)));
          await sleep(30);
          const e0 = cpuMs(s.ng.workerPid);
          for (let t = 0; t < extTurns; t++) {
            const turn = await post(
              s.ng.url,
              body(conv, [
                { role: "assistant", content: "Noted." },
                { role: "user", content: "And the next step? " + k + "." + t },
              ]),
            );
            if (turn.status !== 200) throw new Error(`extending turn: HTTP ${turn.status}`);
          }
          await sleep(30);
          ext.push((cpuMs(s.ng.workerPid) - e0) / extTurns);
        }
        (s.res[size] = s.res[size] || []).push([
          cold.reduce((a, x) => a + x, 0) / cold.length,
          ext.reduce((a, x) => a + x, 0) / ext.length,
          median(added),
          withEvents.reduce((a, x) => a + x, 0) / withEvents.length,
        ]);
      }
    }
    for (const s of sides) {
      const res = s.res[size];
      const avg = (i: number) => res.reduce((a, x) => a + x[i], 0) / res.length;
      console.log(
        `| ${size.toLocaleString("en-US")} | ${s.name} | ${avg(0).toFixed(1)} | ${avg(1).toFixed(1)} | ${avg(2).toFixed(1)} | ${avg(3).toFixed(1)} |`,
      );
    }
    for (const s of sides) console.log(`${s.name}: bridge pushes per cold prompt window: ${s.pushes.join("; ")}`);
    for (const s of sides) s.pushes = [];
    saveLogs();
  }

  // Short requests on the same worker while 4 long prompts route.
  console.log(
    `\n| path | short-request p50 added ms | p99 added ms | max added ms | while 4 concurrent ${longSize.toLocaleString("en-US")}-token prompts | idle shorts: p99 - median ms | bridge pushes in the row |`,
  );
  console.log("|---|---:|---:|---:|---|---:|---|");
  if (niceOthers > 0)
    for (const pid of others)
      // Every thread: Linux nices threads one by one (the helper's tokenizer threads are their own).
      for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
        try {
          os.setPriority(Number(tid), niceOthers);
        } catch (e) {
          process.stderr.write(`cannot renice ${pid}/${tid}: ${(e as Error).message}\n`);
        }
      }
  const shortBody = body("What is the capital of France? Answer in one word.");
  const all = quiet
    .map((s) => ({ s, label: s.name + ", no KV events" }))
    .concat(sides.map((s) => ({ s, label: s.name + ", KV events on" })));
  const runs: { s: Side; label: string; kind: string; floor?: boolean }[] = all.flatMap((a) =>
    shortKinds.map((kind) => ({ ...a, kind })),
  );
  const floorSide = quiet.find((q) => q.name === "helper");
  if (floorRow && !floorSide) throw new Error("--floor-row needs the helper path (--paths helper)");
  if (floorRow && floorSide)
    for (const kind of shortKinds)
      runs.unshift({
        s: floorSide,
        label: "floor: plain proxy + the helper tokenizing, no routing",
        kind,
        floor: true,
      });
  // Every stack with events applies every long prompt's pushes (all bridges follow the same simulators):
  // with --nice-others, the nginx workers of the stacks not measured are niced too.
  const workerPids = quiet.concat(sides).map((x) => x.ng.workerPid);
  const workerNice = os.getPriority(workerPids[0]);
  // The floor row's long prompt: the body proxied by nginx without njs, and the same body to the helper.
  const floorLong = async (s: Side, b: string) => {
    const helper = fetch(`http://127.0.0.1:${s.bridge.adminPort}/v1/tokenize`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-infera-endpoint": "chat",
        "x-infera-block-size": "16",
        "x-infera-limits": "16777216,10000,64,64",
        "x-infera-answer": "packed",
      },
      body: b,
    }).then(async (r) => {
      await r.text();
      if (r.status !== 200) throw new Error(`helper: HTTP ${r.status}`);
    });
    const t0 = performance.now();
    const r = await fetch(`${s.ng.url}/_bench/plain`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: b,
    });
    await r.text();
    await helper;
    return { ms: performance.now() - t0, status: r.status, worker: null };
  };
  for (const { s, label: name, kind, floor } of shortKinds[0] === "none" ? [] : runs) {
    if (niceOthers > 0)
      for (const pid of workerPids) os.setPriority(pid, pid === s.ng.workerPid ? workerNice : niceOthers);
    const label = `${name}, short = ${kind === "admin" ? "GET /v1/admin/reservations" : "chat"}${niceOthers ? `, others niced +${niceOthers}` : ""}`;
    const shortOne = async () => {
      if (kind !== "admin") return post(s.ng.url, shortBody);
      const t0 = performance.now();
      const r = await fetch(`${s.ng.url}/v1/admin/reservations`);
      await r.text();
      return { ms: performance.now() - t0, status: r.status, worker: null };
    };
    const idle: number[] = [];
    for (let i = 0; i < idleShorts; i++) idle.push((await shortOne()).ms);
    const base = median(idle);
    const b0 = await bridgeCounts(s.bridge.adminPort);
    const added: number[] = [];
    let round = 0;
    while (added.length < shorts && round < 50) {
      round++;
      let inFlight = 4;
      const longs = [0, 1, 2, 3].map((i) => {
        const b = body(textOfTokens(`conc${s.name}${round}x${i}x${seq++}`, longSize));
        return (floor ? floorLong(s, b) : post(s.ng.url, b)).finally(() => inFlight--);
      });
      await sleep(2);
      while (inFlight > 0 && added.length < shorts) {
        const r = await shortOne();
        if (inFlight > 0) added.push(r.ms - base);
        if (shortGapMs) await sleep(shortGapMs);
      }
      const done = await Promise.all(longs);
      for (const d of done) if (d.status !== 200) throw new Error(`long prompt: HTTP ${d.status}`);
    }
    console.log(
      `| ${label} | ${pctNearestRank(added, 50).toFixed(1)} | ${pctNearestRank(added, 99).toFixed(1)} | ${Math.max(...added).toFixed(1)} | ${added.length} shorts over ${round} rounds (idle short ${base.toFixed(1)} ms) | ${(pctNearestRank(idle, 99) - base).toFixed(1)} | ${countsDelta(b0, await bridgeCounts(s.bridge.adminPort))} |`,
    );
    saveLogs();
  }
  saveLogs();
}

main().then(
  async () => {
    await stopAll();
    process.exit(0);
  },
  async (e) => {
    process.stderr.write(`bench:nginx-scale: ${e.stack || e.message}\n`);
    await stopAll();
    process.exit(1);
  },
);
