// Where the scheduler replica's TTFT prediction error comes from on a run
// through real simulators: joins the router's INFERA_TIMING_DUMP lines
// (runtime/timing-dump.ts: prediction, measured time, what the replica
// assumed) with the simulators' (sim/timing-dump.ts: arrival, submission to
// the engine, the step's scheduled end, the first token's emission, the cached
// prefix the engine found, its queue) on x-request-id, for the measured part
// of each router's run (after the last cache clear: the bench clears the
// fleet between the warm-up and the measured run), and splits each request's
// time from the router's dispatch to its first token into:
//   in     dispatch -> the simulator's HTTP handler (Envoy, the connection)
//   front  handler -> submitted to the engine (body, JSON, render, tokenize, hash)
//   engine submitted -> the first token's step was scheduled to end
//   lag    the step's scheduled end -> the token emitted (timer and event-loop lag)
//   out    emitted -> the router saw the first body chunk (Envoy, ext_proc)
// Usage: node --import tsx bench/twin-dump.ts <dump prefix> [--rows]
import * as fs from "fs";
import * as path from "path";

interface RouterLine {
  at: number;
  rid: string | null;
  worker: string;
  predicted: number | null;
  ms: number;
  twin: {
    predicted: number | null;
    own: number;
    cached: number;
    sentAt: number;
    ahead: number;
    pendingAhead: number;
    decoding: number;
  } | null;
}
interface SimLine {
  rid: string | null;
  sim: string;
  prompt: number;
  cached: number;
  arrive: number;
  submit: number;
  planned: number;
  first: number;
  waiting: number;
  running: number;
  pending: number;
  drift: number;
}
interface ClearLine {
  clear: number;
  sim: string;
}

const args = process.argv.slice(2);
const prefix = args.find((a) => !a.startsWith("--"));
if (!prefix) throw new Error("usage: bench/twin-dump.ts <dump prefix> [--rows]");
const dir = path.dirname(prefix);
const base = path.basename(prefix);
const files = fs.readdirSync(dir).filter((f) => f.startsWith(base + "."));
const read = (f: string) =>
  fs
    .readFileSync(path.join(dir, f), "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l));

const sims = new Map<string, SimLine>();
const clears: number[] = [];
for (const f of files.filter((f) => f.startsWith(base + ".sim."))) {
  for (const l of read(f) as (SimLine | ClearLine)[]) {
    if ("clear" in l) clears.push(l.clear);
    else if (l.rid) sims.set(l.rid, l);
  }
}
clears.sort((a, b) => a - b);

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "–");
const pc = (x: number) => (Number.isFinite(x) ? (x * 100).toFixed(1) + "%" : "–");

const routers = files
  .filter((f) => /^\d+$/.test(f.slice(base.length + 1)))
  .map((f) => ({ f, lines: read(f) as RouterLine[] }))
  // A router of an older revision (a --baseline row) writes no replica fields: left out.
  .filter((r) => r.lines.length && "twin" in r.lines[0])
  .sort((a, b) => a.lines[0].at - b.lines[0].at);

process.stdout.write(
  "| router run (first line) | n | MAPE | signed | ms | pred | in | front | engine | lag | out | MAPE vs engine+lag | MAPE, overhead = its mean | cached differs (n, share of MAPE) | own tokens under-counted by the replica | replica predicted (n, share of MAPE) | linear fallback (n, share) | not in the replica (n, their MAPE) | sent in the first 300 ms (share of MAPE) | wire alone |\n" +
    "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |\n",
);
for (const r of routers) {
  const first = r.lines[0].at;
  const last = r.lines[r.lines.length - 1].at;
  // The measured run starts at the last cache clear inside this router's life.
  const inLife = clears.filter((c) => c > first && c < last);
  const from = inLife.length ? inLife[inLife.length - 1] : -Infinity;
  // Requests the replica never took in (no entry) still count in the error metric (the linear model predicts them).
  const lost = r.lines.filter((l) => !l.twin && l.at - l.ms >= from - 1);
  const rows = r.lines
    .filter((l) => l.predicted !== null && l.ms > 0 && l.twin && l.twin.sentAt >= from - 1)
    .map((l) => ({ l, s: l.rid ? sims.get(l.rid) : undefined }))
    .filter((x): x is { l: RouterLine; s: SimLine } => !!x.s);
  if (!rows.length) continue;
  const n = rows.length;
  const err = rows.map(({ l }) => Math.abs(l.predicted! - l.ms) / l.ms);
  const signed = rows.map(({ l }) => (l.predicted! - l.ms) / l.ms);
  const inn = rows.map(({ l, s }) => s.arrive - l.twin!.sentAt);
  const front = rows.map(({ s }) => s.submit - s.arrive);
  const engine = rows.map(({ s }) => s.planned - s.submit);
  const lag = rows.map(({ s }) => s.first - s.planned);
  const out = rows.map(({ l, s }) => l.twin!.sentAt + l.ms - s.first);
  // The error left if the replica knew every request's overhead (in, front, out) exactly.
  const vsEngine = rows.map(({ l, s }) => Math.abs(l.predicted! - (s.first - s.submit)) / l.ms);
  // ... or added the run's mean overhead to every prediction.
  const over = rows.map((_, i) => inn[i] + front[i] + out[i]);
  const mo = mean(over);
  const withMean = rows.map(({ l }) => Math.abs(l.predicted! + mo - l.ms) / l.ms);
  const cachedDiff = rows.map(({ l, s }) => l.twin!.cached !== s.cached);
  const diffShare = err.reduce((a, e, i) => a + (cachedDiff[i] ? e : 0), 0) / n;
  const under = rows.filter(({ l, s }) => l.twin!.own < s.prompt - s.cached).length;
  // Predictions the replica made, and those the linear model made while the replica had not learned the worker.
  const byTwin = rows.map(({ l }) => l.twin!.predicted !== null);
  const twinShare = err.reduce((a, e, i) => a + (byTwin[i] ? e : 0), 0) / n;
  // The wire alone: a predictor that knew each request's engine time exactly
  // (submission to its step's end) and added its worker's median wire time.
  const wireOf = rows.map(({ l, s }) => l.ms - (s.planned - s.submit));
  const median = (xs: number[]) => {
    const a = xs.slice().sort((x, y) => x - y);
    return a.length ? (a.length % 2 ? a[(a.length - 1) / 2] : (a[a.length / 2 - 1] + a[a.length / 2]) / 2) : NaN;
  };
  const wireMed = new Map<string, number>();
  for (const w of new Set(rows.map(({ l }) => l.worker)))
    wireMed.set(w, median(wireOf.filter((_, i) => rows[i].l.worker === w)));
  const wireAlone = rows.map(({ l, s }) => Math.abs(s.planned - s.submit + wireMed.get(l.worker)! - l.ms) / l.ms);
  // The closed loop's opening burst: requests sent in the first 300 ms of the run.
  const burstShare = err.reduce((a, e, i) => a + (rows[i].l.twin!.sentAt - from < 300 ? e : 0), 0) / n;
  const lostErr = lost.filter((l) => l.predicted !== null && l.ms > 0).map((l) => Math.abs(l.predicted! - l.ms) / l.ms);
  process.stdout.write(
    `| ${new Date(first).toISOString().slice(11, 19)} (${r.f}) | ${n} | ${pc(mean(err))} | ${pc(mean(signed))} | ${f1(mean(rows.map(({ l }) => l.ms)))} | ${f1(mean(rows.map(({ l }) => l.predicted!)))} | ${f1(mean(inn))} | ${f1(mean(front))} | ${f1(mean(engine))} | ${f1(mean(lag))} | ${f1(mean(out))} | ${pc(mean(vsEngine))} | ${pc(mean(withMean))} | ${cachedDiff.filter(Boolean).length}, ${pc(diffShare)} | ${under} | ${byTwin.filter(Boolean).length}, ${pc(twinShare)} | ${n - byTwin.filter(Boolean).length}, ${pc(mean(err) - twinShare)} | ${lost.length}, ${pc(mean(lostErr))} | ${pc(burstShare)} | ${pc(mean(wireAlone))} |\n`,
  );
  if (args.includes("--rows"))
    for (const { l, s } of rows)
      process.stdout.write(
        `    ${l.twin!.predicted === null ? "L" : "T"} ${l.worker} sent ${f1(l.twin!.sentAt - from)} pred ${f1(l.predicted!)} ms ${f1(l.ms)} | in ${f1(s.arrive - l.twin!.sentAt)} front ${f1(s.submit - s.arrive)} engine ${f1(s.planned - s.submit)} lag ${f1(s.first - s.planned)} out ${f1(l.twin!.sentAt + l.ms - s.first)} | own/cached replica ${l.twin!.own}/${l.twin!.cached} engine ${s.prompt - s.cached}/${s.cached} | ahead replica ${l.twin!.ahead} req ${l.twin!.pendingAhead} tok ${l.twin!.decoding} dec; engine ${s.waiting} waiting ${s.pending} tok ${s.running} running${s.drift ? ` drift ${f1(s.drift)}` : ""}\n`,
      );
}
