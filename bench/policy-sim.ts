// Policy exploration in virtual time: the router's own pick pipeline (core/,
// in-process, memory state) in front of 4 engine models (sim/model.ts, the
// same vLLM-like model the simulator serves), on token-id versions of
// bench:trace's workloads (the trace's ids replay and the four synthetic ones,
// with its closed loop). No HTTP, no tokenizer, no wall clock: a whole
// workload runs in well under a second, so a policy idea can be tried
// across every workload before it earns a real bench:trace run (which remains
// the measure: this leaves out network, streaming and event latency).
//
// Usage: npm run bench:policy-sim -- [--variant 'label|--flag v ...;...'] [--seeds 3] [--workloads trace,shared-prefix,...] [--jitter 3]
//   [--speeds 1,0.333,0.333,0.333] (each engine's speed as a share of the calibrated one; adds the oracle row)
//   [--capacity-blocks 2000] (each engine's KV capacity, vLLM's num_gpu_blocks; the router reads it and the
//   engines' usage and queue every --scrape-ms 250 of virtual time, as runtime/engine-metrics.ts does;
//   adds the floor with the fleet's caches pooled and the KV oracle as rows)
//   [--warmup] (bench:trace's warm-up before each closed-loop run, so speeds are learned before it starts)
//   [--show-slowness] (each run's learned slowness at its end, on stderr)
//   [--max-num-batched-tokens N] (every engine's step token budget, 8192 by default)
//   [--requests FILE] (per measured request, JSON lines: key, worker, waits, the steps it sat in, evictions)
//   [--oracle-predictor] (a TTFT MAPE column for a predictor that sees the engine's exact state at dispatch)
//   [--step-model knee|additive|roofline] [--step-knee-exp 1.4] (the engines' step pricing, sim/model.ts; default the model's)
//   [--split-prefill N] [--split-min M] [--split-rtt 1] [--split-warm F --split-win 32] [--split-mode 0|1|2] (an experiment: cold prompts
//   sent as prefill-only pieces of N tokens first; see SPLIT below)
// Deterministic: the same command prints the same table, and a row's figures
// do not depend on which other rows the command asks for.
import { createRouter } from "../core/router";
import { sampleTrace, traceFile, traceIds } from "./mooncake";
import { memoryState } from "../core/state/memory";
import { blockHashes } from "../core/hash";
import { Options, parseArgs } from "../runtime/config";
import { atSpeed, EngineModel, llama8bH100, StepPlan } from "../sim/model";
import { BlockHash, RouterConfig } from "../core/types";
import { prefillAdmission, Ticket } from "../core/admission";
import { mean, pct } from "./stats";
import * as fs from "node:fs";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const opt = optionReader(argv);

/** key: what the oracle pins (the document, the conversation). */
type Turn = { tokens: number[]; maxTokens: number; at?: number; key: string };
type Conv = Turn[];

function rng(seed: number) {
  let s = seed >>> 0;
  return (n: number) => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return (s >>> 8) % n;
  };
}
let nextTok = 1000;
const text = (n: number) => Array.from({ length: n }, () => nextTok++);
function shuffle<T>(xs: T[], seed: number): T[] {
  const r = rng(seed);
  const a = xs.slice();
  for (let i = a.length - 1; i > 0; i--) {
    const j = r(i + 1);
    const t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
  return a;
}
// Token counts follow bench/trace.ts's text (about 10 tokens of chat template per message).
const HEAD = 10;
function sharedPrefix(seed: number): Conv[] {
  const docs = Array.from({ length: 8 }, () => text(4000 + HEAD));
  const out: Conv[] = [];
  for (let q = 0; q < 6; q++)
    for (let d = 0; d < 8; d++) out.push([{ tokens: docs[d].concat(text(14)), maxTokens: 32, key: `d${d}` }]);
  return shuffle(out, seed);
}
/**
 * count conversations of turns turns: each opens with first() and every turn
 * adds a reply of reply tokens and the next input of next tokens (the shape of
 * bench:trace's multi-turn and agentic workloads).
 */
function conversations(
  seed: number,
  count: number,
  turns: number,
  first: () => number[],
  reply: number,
  next: number,
  maxTokens: number,
): Conv[] {
  const out: Conv[] = [];
  for (let c = 0; c < count; c++) {
    let msgs = first();
    const conv: Conv = [];
    for (let t = 0; t < turns; t++) {
      conv.push({ tokens: msgs.slice(), maxTokens, key: `c${c}` });
      msgs = msgs.concat(text(reply + HEAD), text(next + HEAD));
    }
    out.push(conv);
  }
  return shuffle(out, seed);
}
const multiTurn = (seed: number) => conversations(seed, 24, 5, () => text(3000 + 2 * HEAD), 100, 200, 48);
function agentic(seed: number): Conv[] {
  const tools = text(2500 + HEAD);
  return conversations(seed, 8, 8, () => tools.concat(text(300 + HEAD)), 60, 600, 24);
}
// bench:trace's "trace (ids)" workload: one in 60 Mooncake conversations, the
// hour compressed into 45 s, open loop (each request a conversation of one
// turn with its arrival time).
function trace(): Conv[] {
  // The key is the trace's own conversation grouping (its first two block ids, as sampleTrace groups them).
  return sampleTrace(traceFile(), 60, 45).map(({ at, row }, i) => [
    {
      tokens: traceIds(row),
      maxTokens: Math.max(1, Math.min(256, row.output_length)),
      at,
      key: row.hash_ids.length > 1 ? row.hash_ids.slice(0, 2).join(",") : `single${i}`,
    },
  ]);
}

/**
 * KV pressure: 32 documents of 4,000 tokens (8,000 blocks in all, four times
 * a 2,000-block cache), asked about with Zipf popularity (document k gets
 * weight 1/(k+1)), 192 questions. The hot set fits the fleet's caches
 * together, not one worker's.
 */
function kvDocs(seed: number): Conv[] {
  const docs = Array.from({ length: 32 }, () => text(4000 + HEAD));
  const weights = docs.map((_, k) => 1 / (k + 1));
  const total = weights.reduce((a, b) => a + b, 0);
  const r = rng(seed * 31 + 5);
  const out: Conv[] = [];
  for (let q = 0; q < 192; q++) {
    let x = (r(1000000) / 1000000) * total;
    let d = 0;
    while (d < docs.length - 1 && x >= weights[d]) x -= weights[d++];
    out.push([{ tokens: docs[d].concat(text(14)), maxTokens: 32, key: `d${d}` }]);
  }
  return out;
}

function unique(): Conv[] {
  return Array.from({ length: 48 }, (_, i) => [{ tokens: text(2000 + HEAD), maxTokens: 32, key: `u${i}` }]);
}

interface Result {
  ttft: number[];
  hits: number;
  prompt: number;
  spread: number[];
  forced: number;
  /** |predicted - observed| / observed per measured first token that had a prediction. */
  ape: number[];
  /** The same for --oracle-predictor's foresight, over every measured first token. */
  oracleApe: number[];
}

// Client and network time before a request reaches the router, uniform in
// [0, JITTER) ms: without it the closed loop runs in lockstep and round-robin
// keeps every conversation on one worker by accident.
const JITTER = Number(opt("--jitter", "3"));
// Tokens per streamed chunk after the first, as bench:trace's simulators
// stream (--stream-interval 4): each chunk reaches the router's lifecycle
// hooks as Envoy passes it on (reservation.chunk()).
const STREAM_INTERVAL = 4;

/**
 * A model of smg's cache_aware policy (its --help, v1.13): a request goes to
 * the worker whose routing history shares the longest prefix with it when
 * that covers at least 30% of the prompt (--cache-threshold), unless that
 * worker's in-flight count exceeds both 1.5x the fleet mean and the mean plus
 * max(4, 2 standard deviations) (the spill gate); otherwise to the fewest
 * requests in flight, then the smallest history. The history is what the
 * router itself routed, not KV events. For reading bench:trace's smg rows in
 * virtual time, not a copy of smg.
 */
function smgModel(n: number) {
  const seen: Set<string>[] = Array.from({ length: n }, () => new Set());
  return (blocks: string[], inflight: number[]): number => {
    const mean = inflight.reduce((a, b) => a + b, 0) / n;
    const sd = Math.sqrt(inflight.reduce((a, b) => a + (b - mean) ** 2, 0) / n);
    let best = -1;
    let match = 0;
    for (let i = 0; i < n; i++) {
      let k = 0;
      while (k < blocks.length && seen[i].has(blocks[k])) k++;
      if (k > match) {
        match = k;
        best = i;
      }
    }
    const over = (i: number) => inflight[i] > 1.5 * mean && inflight[i] > mean + Math.max(4, 2 * sd);
    let t = best;
    if (best < 0 || match < 0.3 * blocks.length || over(best)) {
      t = 0;
      for (let i = 1; i < n; i++)
        if (inflight[i] < inflight[t] || (inflight[i] === inflight[t] && seen[i].size < seen[t].size)) t = i;
    }
    for (const b of blocks) seen[t].add(b);
    return t;
  };
}

/**
 * The oracle of a mixed-speed fleet: no router, every document or
 * conversation (Turn.key) pinned to one worker, new keys going to the worker
 * with the fewest keys per unit of speed, so each worker gets a share of the
 * work in proportion to its speed and never computes another's prefix.
 */
function oracleModel(speeds: number[]) {
  const owner = new Map<string, number>();
  const keys = speeds.map(() => 0);
  return (key: string): number => {
    let w = owner.get(key);
    if (w === undefined) {
      w = 0;
      for (let i = 1; i < speeds.length; i++) if ((keys[i] + 1) / speeds[i] < (keys[w] + 1) / speeds[w]) w = i;
      keys[w]++;
      owner.set(key, w);
    }
    return w;
  };
}

/**
 * The KV-pressure oracle: no router, placement by the workload's popularity
 * known in advance (omniscient). Each key (document, conversation) weighs its
 * request count and takes its largest prompt's blocks of room; keys are dealt
 * hottest first, a key weighing more than one worker's share of the requests
 * getting ceil(weight / share) copies on distinct workers, each copy to the
 * worker with room for it (assigned blocks + the key's <= capacity) that has
 * the least weight so far, else to the least weighted worker (it will not fit
 * anywhere: the overflow evicts). A request goes to its key's copy with the
 * fewest requests in flight. So the hot set is spread to fill the fleet's
 * caches once, the hottest replicated, with no learning and no eviction
 * surprises: what a placement that knew the popularity could reach.
 */
function kvOracleModel(convs: Conv[], n: number, capacity: number) {
  const weight = new Map<string, number>();
  const size = new Map<string, number>();
  for (const c of convs)
    for (const t of c) {
      weight.set(t.key, (weight.get(t.key) || 0) + 1);
      size.set(t.key, Math.max(size.get(t.key) || 0, Math.ceil(t.tokens.length / 16)));
    }
  let total = 0;
  for (const w of weight.values()) total += w;
  const share = total / n;
  const keys = [...weight.keys()].sort((a, b) => weight.get(b)! - weight.get(a)! || (a < b ? -1 : 1));
  const load: number[] = new Array(n).fill(0);
  const used: number[] = new Array(n).fill(0);
  const owners = new Map<string, number[]>();
  for (const k of keys) {
    const w = weight.get(k)!;
    const s = size.get(k)!;
    const copies = Math.min(n, Math.max(1, Math.ceil(w / share)));
    const mine: number[] = [];
    for (let r = 0; r < copies; r++) {
      let best = -1;
      for (let i = 0; i < n; i++) {
        if (mine.includes(i)) continue;
        const fits = used[i] + s <= capacity;
        const bestFits = best >= 0 && used[best] + s <= capacity;
        if (best < 0 || (fits && !bestFits) || (fits === bestFits && load[i] < load[best])) best = i;
      }
      mine.push(best);
      load[best] += w / copies;
      used[best] += s;
    }
    owners.set(k, mine);
  }
  return (key: string, inflight: number[]): number => {
    const mine = owners.get(key)!;
    let t = mine[0];
    for (const i of mine) if (inflight[i] < inflight[t]) t = i;
    return t;
  };
}

const STEP_MODEL = opt("--step-model", llama8bH100().stepModel || "knee");
if (["knee", "additive", "roofline"].indexOf(STEP_MODEL) < 0)
  throw new Error("--step-model: knee, additive or roofline");
const STEP_KNEE_EXP = Number(opt("--step-knee-exp", String(llama8bH100().stepKneeExp)));
// --max-num-batched-tokens N: every engine's (and the floor's) step token budget, vLLM's
// max_num_batched_tokens (8192 in the calibrated model): how much of a KV-pressure gap is the engine's
// chunking, which decides how long a cold prefill holds the steps of requests behind it.
const MAX_BATCHED = Number(opt("--max-num-batched-tokens", "0"));
/** The calibrated engine, priced by --step-model, with --max-num-batched-tokens. */
function engineModel() {
  const c = { ...llama8bH100(), stepModel: STEP_MODEL as "knee" | "additive" | "roofline", stepKneeExp: STEP_KNEE_EXP };
  return MAX_BATCHED > 0 ? { ...c, maxNumBatchedTokens: MAX_BATCHED } : c;
}
/** The calibrated engine at a share of its speed: every cost term takes 1/speed as long. */
function engineAt(speed: number) {
  return atSpeed(engineModel(), speed);
}
const SPEEDS = opt("--speeds", "1,1,1,1").split(",").map(Number);
if (SPEEDS.length !== 4 || SPEEDS.some((x) => !(x > 0))) throw new Error("--speeds: four positive numbers");
const MIXED = SPEEDS.some((x) => x !== SPEEDS[0]);
const CAPACITY = Number(opt("--capacity-blocks", "0"));
const SCRAPE_MS = Number(opt("--scrape-ms", "250"));
// --warmup: before a closed-loop run, bench:trace's warm-up (16 prompts of
// 500 to 8,000 tokens that share nothing, at the run's concurrency), so speed
// learning starts the measured run with the workers' speeds known, as it does
// in bench:trace. Their times and placements are not counted.
const WARMUP = argv.includes("--warmup");
// --dump FILE: per measured first token (JSON lines), the speed model's inputs, its prediction and the
// engine's state at dispatch (time left in the step in flight, running and waiting requests).
const DUMP_FILE = opt("--dump", "");
const DUMP: Record<string, unknown>[] | null = DUMP_FILE ? [] : null;
// --requests FILE: per measured request (JSON lines), where it went and why it waited: its key (document,
// conversation), worker, arrival, dispatch and first-token times, cached and prompt tokens, the duration and
// prefill tokens of the step that gave its first token, the steps it sat in and the prefill tokens of other
// requests in them, and the blocks its engine had evicted by then (the KV-pressure diagnosis).
const REQ_FILE = opt("--requests", "");
const REQS: Record<string, unknown>[] | null = REQ_FILE ? [] : null;
const ORACLE_PREDICTOR = argv.includes("--oracle-predictor");
// --split-prefill N: an experiment, not a router feature. The router sends a
// cold prompt's uncached part as prefill-only pieces of about N tokens (each
// a request for the prompt up to a block-aligned cut, one output token), one
// after the other, --split-rtt ms apart, then the request itself, which finds
// them cached. A warm request that reaches the worker meanwhile waits for one
// piece's step, not the whole prefill's. Only for prompts with more than
// --split-min uncached tokens (default N), only for the kv-aware policy, and
// with --split-warm F only on a worker where at least F of the last
// --split-win picks were warm (under 512 uncached tokens). --split-mode 1:
// at a piece's end the rest goes whole when another request for the same
// key waits at the worker; 2: also when no warm request reached the worker
// during the piece.
const SPLIT = Number(opt("--split-prefill", "0"));
const SPLIT_RTT = Number(opt("--split-rtt", "1"));
const SPLIT_MIN = Number(opt("--split-min", String(SPLIT)));
const SPLIT_WARM = Number(opt("--split-warm", "0"));
const SPLIT_WIN = Number(opt("--split-win", "32"));
const SPLIT_MODE = Number(opt("--split-mode", "0"));
function warmConvs(): Conv[] {
  const sizes = [500, 2000, 4000, 8000];
  return Array.from({ length: 16 }, (_, i) => [{ tokens: text(sizes[i % 4] + HEAD), maxTokens: 8, key: `warm${i}` }]);
}

function run(
  convs: Conv[],
  concurrency: number,
  cfg: RouterConfig,
  admission: Options["admission"],
  seed: number,
  peer: "smg" | "oracle" | "kv-oracle" | null = null,
): Result {
  const W = WARMUP && concurrency && !peer ? 16 : 0;
  if (W) convs = warmConvs().concat(convs);
  let warmDone = 0;
  const rand = rng(seed * 7919 + 1);
  const arrivals: { at: number; conv: number; turn: number }[] = [];
  const arrive = (conv: number, turn: number) => arrivals.push({ at: now + (rand(1000) / 1000) * JITTER, conv, turn });
  const N = 4;
  const state = memoryState();
  // Virtual time for the router too: speed learning times first tokens on this clock.
  // TTFT prediction error as runtime/app.ts exports it (|predicted - observed| / observed), measured requests only.
  let measuring = false;
  let curId = "";
  const oracleAt = new Map<string, number>();
  const router = createRouter(state, cfg, {
    now: () => now,
    onTiming: (_w, p, ms) => {
      if (measuring && !peer && p !== null && ms > 0) {
        res.ape.push(Math.abs(p - ms) / ms);
        // The oracle predictor on the same first tokens, against the same observed time.
        const f = oracleAt.get(curId);
        if (f !== undefined && Number.isFinite(f)) res.oracleApe.push(Math.abs(f - ms) / ms);
      }
    },
  });
  // --dump FILE: one JSON line per measured first token, the model's inputs and the engine's truth at dispatch.
  const dumpAt = new Map<string, Record<string, number>>();
  if (DUMP && router.latency) {
    const lm = router.latency;
    const orig = lm.observe.bind(lm);
    lm.observe = (wk, tokens, running, ms, attention, queued, predicted) => {
      const w = eks0.indexOf(wk);
      // The prediction the error metric reads: the scheduler replica's at dispatch, else the speed model's.
      const linear = lm.predict(wk, tokens, running, attention, queued);
      const p = predicted !== undefined ? predicted : linear;
      if (curDump)
        DUMP.push({
          ...curDump,
          measured: measuring ? 1 : 0,
          w,
          speed: SPEEDS[w],
          tokens,
          running,
          ms,
          attention: attention || 0,
          queued: queued || 0,
          p: p ?? -1,
          linear: linear ?? -1,
          factor: lm.twin ? (lm.twin.factor(wk) ?? -1) : -1,
        });
      orig(wk, tokens, running, ms, attention, queued, predicted);
    };
  }
  let curDump: Record<string, number> | null = null;
  const engines: EngineModel[] = [];
  const ids: string[] = [];
  for (let i = 0; i < N; i++) {
    engines.push(new EngineModel(CAPACITY ? { ...engineAt(SPEEDS[i]), numBlocks: CAPACITY } : engineAt(SPEEDS[i])));
    ids.push(`w${i}`);
    router.addWorker({ id: ids[i], address: `127.0.0.1:${9000 + i}`, role: "mixed" });
  }
  const ek = (i: number) => router.worker(ids[i])!.epochKey;
  const eks0 = ids.map((x) => router.worker(x)!.epochKey);
  // What runtime/engine-metrics.ts reads from each engine's /metrics, every SCRAPE_MS of virtual time.
  let scraped = -Infinity;
  const scrape = () => {
    if (now - scraped < SCRAPE_MS) return;
    scraped = now;
    for (let i = 0; i < N; i++)
      state.engine!.set(ek(i), {
        capacityBlocks: engines[i].cfg.numBlocks,
        kvUsage: engines[i].usage(),
        waitingRequests: engines[i].numWaiting(),
        runningRequests: engines[i].numRunning(),
        at: now,
      });
  };
  const plans: (StepPlan | null)[] = new Array(N).fill(null);
  const ends: number[] = new Array(N).fill(Infinity);
  const res: Result = { ttft: [], hits: 0, prompt: 0, spread: new Array(N).fill(0), forced: 0, ape: [], oracleApe: [] };
  const live = new Map<
    string,
    {
      start: number;
      conv: number;
      turn: number;
      w: number;
      /** Dispatch time, steps sat in before the first token, other requests' prefill tokens in them. */
      dispatchedAt: number;
      first: boolean;
      steps: number;
      otherPrefill: number;
      r: ReturnType<typeof router.pick>["reservation"];
      ticket: Ticket;
    }
  >();
  let now = 0;
  let reqNo = 0;
  // bench:trace's closed loop: a free client takes a random ready conversation
  // (one with turns left and none in flight), so conversations interleave.
  const nextTurn: number[] = convs.map(() => 0);
  const busy: boolean[] = convs.map((_, c) => c >= W && W > 0);
  const pickRng = rng(424242 + seed);
  let freeClients = concurrency;
  const dispatch = () => {
    if (!concurrency) return;
    while (freeClients > 0) {
      const ready: number[] = [];
      for (let c = 0; c < convs.length; c++) if (!busy[c] && nextTurn[c] < convs[c].length) ready.push(c);
      if (!ready.length) return;
      const c = ready[pickRng(ready.length)];
      busy[c] = true;
      freeClients--;
      arrive(c, nextTurn[c]++);
    }
  };

  const evicted: number[] = new Array(N).fill(0);
  const applyEvents = (i: number) => {
    for (const e of engines[i].drainEvents()) {
      if (e.type === "removed") evicted[i] += e.hashes.length;
      for (const h of e.hashes) {
        const eh = h.toString(16).padStart(16, "0");
        if (e.type === "stored") state.mirror.store(ek(i), eh, eh as BlockHash);
        else state.mirror.remove(ek(i), eh);
      }
    }
  };
  const kick = (i: number) => {
    if (plans[i]) return;
    const p = engines[i].schedule();
    applyEvents(i);
    plans[i] = p;
    ends[i] = p ? now + p.ms : Infinity;
  };
  const smg = peer === "smg" ? smgModel(N) : null;
  const oracle = peer === "oracle" ? oracleModel(SPEEDS) : null;
  const kvOracle = peer === "kv-oracle" ? kvOracleModel(convs.slice(W), N, CAPACITY || llama8bH100().numBlocks) : null;
  const inflight: number[] = new Array(N).fill(0);
  // The router's prefill admission (core/admission.ts) as the Envoy path runs
  // it, with its wait bound as a deadline checked in virtual time.
  const gate = prefillAdmission(
    cfg.policy === "kv-aware" && !smg && !oracle && !kvOracle ? admission : { slots: 0, warmTokens: 0 },
  );
  const deadlines: { at: number; ticket: Ticket }[] = [];
  const later: { at: number; fn: () => void }[] = [];
  const pieces = new Map<string, (cachedTokens: number) => void>();
  const pieceCached = new Map<string, number>();
  const warmHist: boolean[][] = [[], [], [], []];
  const warmArrivals: number[] = [0, 0, 0, 0];
  // (oracleAt is declared above, with the router.)
  // --oracle-predictor: each measured request's time to first token foreseen
  // at dispatch from its engine's exact state (a copy of the engine model,
  // the step in flight included, run forward with no later arrivals): what a
  // predictor that saw inside the engine would say. Its error is left only by
  // requests that arrive later and share its steps.
  const foresee = (i: number, id: string): number => {
    const copy = structuredClone({ e: { ...engines[i] }, p: plans[i] });
    const e = Object.assign(Object.create(Object.getPrototypeOf(engines[i])), copy.e) as EngineModel;
    let plan = copy.p;
    let ms = plan ? ends[i] - now : 0;
    if (!plan) {
      plan = e.schedule();
      if (plan) ms += plan.ms;
    }
    for (let guard = 0; guard < 100000 && plan; guard++) {
      const out = e.complete(plan);
      if (out.some((o) => o.id === id && o.index === 0)) return ms;
      plan = e.schedule();
      if (plan) ms += plan.ms;
    }
    return NaN;
  };
  const start = (conv: number, turn: number) => {
    const t = convs[conv][turn];
    const blocks = blockHashes(t.tokens, 16);
    scrape();
    const pick = router.pick({ blocks, inputTokens: t.tokens.length, exact: true, mediaHashes: [], n: 1 });
    const i = smg
      ? smg(blocks, inflight)
      : oracle
        ? oracle(t.key)
        : kvOracle
          ? kvOracle(t.key, inflight)
          : ids.indexOf(pick.target.id);
    const at = now;
    const id = `r${reqNo++}`;
    const ticket = gate.enter(ids[i], pick.uncachedTokens, () => {
      pick.reservation.dispatched();
      inflight[i]++;
      const l = live.get(id);
      if (l) l.dispatchedAt = now;
      const tv = DUMP && router.latency && router.latency.twin ? router.latency.twin.view(ek(i)) : null;
      if (DUMP)
        dumpAt.set(id, {
          twinWaiting: tv ? tv.waiting : -1,
          twinPending: tv ? tv.pending : -1,
          twinDecodes: tv ? tv.decodes : -1,
          twinAnchorAge: tv ? now - tv.anchor : -1,
          engPending: engines[i].pendingPrefill(),
          residual: plans[i] ? ends[i] - now : 0,
          engRunning: engines[i].numRunning(),
          engWaiting: engines[i].numWaiting(),
          waited: now - at,
          dispatchAt: now,
        });
      const addMain = () => {
        engines[i].add({ id, tokens: t.tokens, hashes: blocks.map((b) => BigInt("0x" + b)), maxTokens: t.maxTokens });
        if (ORACLE_PREDICTOR && conv >= W && !peer) oracleAt.set(id, foresee(i, id));
        kick(i);
      };
      if (conv >= W) res.spread[i]++;
      let split = false;
      if (SPLIT && !peer && cfg.policy === "kv-aware") {
        // The worker's recent picks, for --split-warm and --split-mode 2.
        const hist = warmHist[i];
        const warmShare = hist.length ? hist.filter((x) => x).length / hist.length : 0;
        const warm = pick.uncachedTokens < 512;
        hist.push(warm);
        if (warm) warmArrivals[i]++;
        if (hist.length > SPLIT_WIN) hist.shift();
        split = pick.uncachedTokens > SPLIT_MIN && warmShare >= SPLIT_WARM;
      }
      if (split) {
        const cached = t.tokens.length - pick.uncachedTokens;
        const cuts: number[] = [];
        for (let e = Math.floor((cached + SPLIT) / 16) * 16; e < t.tokens.length - SPLIT / 2; e += SPLIT) cuts.push(e);
        let k = 0;
        let warmSeen = warmArrivals[i];
        const next = () => {
          if (k >= cuts.length) return addMain();
          if (k > 0 && SPLIT_MODE >= 1) {
            // Another request for this prompt's prefix waits at this worker: the rest goes whole.
            for (const [lid, l] of live)
              if (lid !== id && l.w === i && !l.first && convs[l.conv][l.turn].key === t.key) return addMain();
          }
          if (k > 0 && SPLIT_MODE >= 2) {
            // No warm request reached this worker during the last piece: the rest goes whole.
            if (warmArrivals[i] === warmSeen) return addMain();
            warmSeen = warmArrivals[i];
          }
          const pid = `${id}p${k}`;
          const e = cuts[k++];
          pieces.set(pid, (cachedTokens: number) => {
            // The request's hits are what its first piece found: the pieces' own work is no hit.
            if (k === 1) pieceCached.set(id, cachedTokens);
            later.push({ at: now + SPLIT_RTT, fn: next });
          });
          engines[i].add({
            id: pid,
            tokens: t.tokens.slice(0, e),
            hashes: blocks.slice(0, e / 16).map((b) => BigInt("0x" + b)),
            maxTokens: 1,
          });
          kick(i);
        };
        next();
      } else addMain();
    });
    live.set(id, {
      start: at,
      conv,
      turn,
      w: i,
      dispatchedAt: ticket.admitted ? at : -1,
      first: false,
      steps: 0,
      otherPrefill: 0,
      r: pick.reservation,
      ticket,
    });
    if (!ticket.admitted) deadlines.push({ at: at + admission.maxWaitMs, ticket });
  };
  if (concurrency) dispatch();
  else convs.forEach((c, k) => arrivals.push({ at: c[0].at || 0, conv: k, turn: 0 }));
  for (let guard = 0; guard < 10_000_000 && (live.size || arrivals.length || later.length); guard++) {
    let i = 0;
    for (let k = 1; k < N; k++) if (ends[k] < ends[i]) i = k;
    let firstArrival = Infinity;
    if (deadlines.length || later.length) for (const a of arrivals) firstArrival = Math.min(firstArrival, a.at);
    const lt = later.findIndex((x) => x.at <= ends[i] && x.at <= firstArrival);
    if (lt >= 0) {
      const x = later.splice(lt, 1)[0];
      now = Math.max(now, x.at);
      x.fn();
      continue;
    }
    const d = deadlines.findIndex((x) => x.at <= ends[i] && x.at <= firstArrival);
    if (d >= 0) {
      const x = deadlines.splice(d, 1)[0];
      if (!x.ticket.admitted) {
        now = Math.max(now, x.at);
        x.ticket.force();
        res.forced++;
      }
      continue;
    }
    let a = -1;
    for (let k = 0; k < arrivals.length; k++) if (arrivals[k].at <= (a < 0 ? ends[i] : arrivals[a].at)) a = k;
    if (a >= 0) {
      const x = arrivals.splice(a, 1)[0];
      now = x.at;
      start(x.conv, x.turn);
      continue;
    }
    if (ends[i] === Infinity) throw new Error("stalled");
    now = ends[i];
    const done = plans[i]!;
    if (REQS) {
      // Who sat in this step before their first token, and what else it computed.
      const own = new Map<string, number>();
      for (const x of done.items) own.set(x.s.r.id, x.n);
      for (const [lid, l] of live)
        if (l.w === i && !l.first && l.dispatchedAt >= 0) {
          l.steps++;
          l.otherPrefill += done.prefillTokens - (own.get(lid) || 0);
        }
    }
    const out = engines[i].complete(done);
    plans[i] = null;
    applyEvents(i);
    for (const t of out) {
      const pc = pieces.get(t.id);
      if (pc) {
        if (t.done) {
          pieces.delete(t.id);
          pc(t.cachedTokens);
        }
        continue;
      }
      const l = live.get(t.id)!;
      if (t.index === 0 && l.conv >= W) {
        res.ttft.push(now - l.start);
        res.hits += pieceCached.has(t.id) ? pieceCached.get(t.id)! : t.cachedTokens;
        res.prompt += t.promptTokens;
      }
      if (t.index === 0 && REQS && l.conv >= W)
        REQS.push({
          key: convs[l.conv][l.turn].key,
          w: l.w,
          at: l.start,
          dispatched: l.dispatchedAt,
          first: now,
          ttft: now - l.start,
          cached: t.cachedTokens,
          prompt: t.promptTokens,
          stepMs: done.ms,
          stepPrefill: done.prefillTokens,
          steps: l.steps,
          otherPrefill: l.otherPrefill,
          evicted: evicted[l.w],
          inflight: inflight[l.w],
        });
      if (t.index === 0) {
        l.first = true;
        measuring = l.conv >= W;
        curId = t.id;
        curDump = DUMP ? { ...dumpAt.get(t.id), firstAt: now, cached: t.cachedTokens, prompt: t.promptTokens } : null;
        l.r.firstToken();
        measuring = false;
        l.ticket.leave();
      } else if (!t.done && (t.index + 1) % STREAM_INTERVAL === 0) l.r.chunk();
      if (t.done) {
        l.r.finish();
        inflight[l.w]--;
        live.delete(t.id);
        busy[l.conv] = false;
        if (l.conv < W && ++warmDone === W) for (let c = W; c < convs.length; c++) busy[c] = false;
        freeClients++;
        if (concurrency) dispatch();
      }
    }
    kick(i);
  }
  // --show-slowness: each run's learned slowness at its end (stderr), the figure bench:trace logs.
  if (argv.includes("--show-slowness") && router.latency)
    console.error(
      `slowness at the end ${JSON.stringify(router.latency.slowness(eks0))}, requests ${res.spread.join("/")}`,
    );
  return res;
}

/**
 * bench:trace's floor in the model: every request alone on an engine that
 * holds every prompt sent before it (conversation by conversation, or by
 * arrival), so no queue and no batch; a first request for a new prefix still
 * computes it. No router can average below it.
 */
function floor(convs: Conv[], numBlocks = 1 << 20): Result {
  const e = new EngineModel({ ...engineModel(), numBlocks });
  const res: Result = { ttft: [], hits: 0, prompt: 0, spread: [0, 0, 0, 0], forced: 0, ape: [], oracleApe: [] };
  const reqs = convs.some((c) => c[0].at !== undefined)
    ? convs.map((c) => c[0]).sort((a, b) => (a.at || 0) - (b.at || 0))
    : convs.flat();
  let n = 0;
  for (const t of reqs) {
    const a = alone(e, `f${n++}`, t.tokens);
    res.ttft.push(a.ms);
    res.hits += a.cached;
    res.prompt += a.prompt;
    res.spread[0]++;
  }
  return res;
}

/** A prompt's first token alone on an empty engine of the floor's kind (ms) and the tokens it found cached. */
function alone(e: EngineModel, id: string, tokens: number[]): { ms: number; cached: number; prompt: number } {
  const blocks = blockHashes(tokens, 16);
  e.add({ id, tokens, hashes: blocks.map((b) => BigInt("0x" + b)), maxTokens: 1 });
  let ms = 0;
  let out: ReturnType<EngineModel["complete"]> = [];
  // A lone prompt takes one step per max_num_batched_tokens chunk.
  for (let guard = 0; guard < 1000 && !out.length; guard++) {
    const p = e.schedule();
    if (!p) break;
    ms += p.ms;
    out = e.complete(p);
  }
  if (!out.length) throw new Error("floor: a request did not reach its first token");
  return { ms, cached: out[0].cachedTokens, prompt: out[0].promptTokens };
}

/**
 * The floor at concurrency c: the floor above, tightened where the closed
 * loop fixes arrival times whatever the router does. Its opening burst (the
 * first c requests, sent at time 0 plus the client jitter, drawn exactly as
 * run() draws them) arrives before any request can finish (every request
 * decodes maxTokens steps of at least the engine's fixed cost, far above the
 * jitter), so the burst's arrival times are the same under every router. A
 * burst request i whose prompt starts with blocks an earlier burst request j
 * brought first (j found nothing cached) cannot have them before j's arrival
 * plus the time to compute them alone: whichever engine serves i computed them
 * there from nothing after a_j (engines start empty, the model has no KV
 * transfer, and the step cost only adds), whether for j, for i, or for
 * anyone. So TTFT_i >= max(its floor, a_j + alone(those blocks) - a_i). At
 * concurrency 16 on kv-docs that is the burst's repeated documents; on
 * conversation workloads the burst's prompts share nothing and it equals
 * the floor. Every other request keeps its floor, the engine holding every
 * prompt sent before it (the burst first, by arrival, then the rest as
 * floor() orders them). Still a bound for any router, and no tighter beyond
 * the burst: after it, arrival times depend on the schedule.
 */
function floorAtConcurrency(convs: Conv[], c: number, seed: number): Result {
  if (!c || convs.some((x) => x[0].at !== undefined)) return floor(convs);
  const rand = rng(seed * 7919 + 1);
  const pickRng = rng(424242 + seed);
  const ready: number[] = convs.map((_, k) => k);
  const burst: { conv: number; at: number }[] = [];
  for (let k = 0; k < c && ready.length; k++) {
    const conv = ready.splice(pickRng(ready.length), 1)[0];
    burst.push({ conv, at: (rand(1000) / 1000) * JITTER });
  }
  // run() takes arrivals in time order, ties by insertion.
  const order = burst.map((b, k) => ({ ...b, k })).sort((a, b) => a.at - b.at || a.k - b.k);
  const e = new EngineModel({ ...engineModel(), numBlocks: 1 << 20 });
  const res: Result = { ttft: [], hits: 0, prompt: 0, spread: [0, 0, 0, 0], forced: 0, ape: [], oracleApe: [] };
  const opened: { at: number; blocks: string[] }[] = [];
  let n = 0;
  for (const b of order) {
    const t = convs[b.conv][0];
    const r = alone(e, `b${n++}`, t.tokens);
    let ms = r.ms;
    const blocks = blockHashes(t.tokens, 16);
    const L = Math.floor(r.cached / 16);
    if (L > 0) {
      // The earlier burst request that brought these blocks first (it found nothing cached).
      const src = opened.find((o) => o.blocks.length >= L && o.blocks[L - 1] === blocks[L - 1]);
      if (src) {
        const compute = alone(
          new EngineModel({ ...engineModel(), numBlocks: 1 << 20 }),
          "c",
          t.tokens.slice(0, 16 * L),
        );
        ms = Math.max(ms, src.at + compute.ms - b.at);
      }
    } else opened.push({ at: b.at, blocks });
    res.ttft.push(ms);
    res.hits += r.cached;
    res.prompt += r.prompt;
    res.spread[0]++;
  }
  const inBurst = new Set(burst.map((b) => b.conv));
  convs.forEach((conv, k) =>
    conv.forEach((t, turn) => {
      if (turn === 0 && inBurst.has(k)) return;
      const r = alone(e, `f${n++}`, t.tokens);
      res.ttft.push(r.ms);
      res.hits += r.cached;
      res.prompt += r.prompt;
      res.spread[0]++;
    }),
  );
  return res;
}

function main(): void {
  const variants: [string, string[]][] = [
    ["default", []],
    ["round-robin", ["--router-policy", "round-robin"]],
  ];
  // --smg adds the smg cache_aware model (smgModel) as a row.
  if (argv.includes("--smg")) variants.push(["smg cache_aware (model)", ["smg"]]);
  // On a mixed-speed fleet the floor (one calibrated engine) is no bound; the oracle row is the reference.
  if (MIXED) variants.push([`oracle (pinned by speed ${SPEEDS.join(":")})`, ["oracle"]]);
  else {
    variants.push(["floor (each request alone, its prefix cached)", ["floor"]]);
    variants.push(["floor at this concurrency (floor + the opening burst's repeated prefixes)", ["floor-c"]]);
  }
  // Under --capacity-blocks: the floor again on one engine whose cache is the
  // fleet's caches pooled (4 x capacity, LRU), so a prefix the fleet cannot
  // hold is computed again; and the KV-pressure oracle (kvOracleModel).
  if (CAPACITY && !MIXED) {
    variants.push([`floor, the fleet's caches pooled (4 x ${CAPACITY} blocks)`, ["floor-pooled"]]);
    variants.push(["kv oracle (pinned by known popularity, hottest replicated)", ["kv-oracle"]]);
  }
  for (const e of opt("--variant", "").split(";").filter(Boolean)) {
    const [label, flags] = e.split("|");
    variants.push([label, (flags || "").trim().split(/\s+/).filter(Boolean)]);
  }
  const seeds = Number(opt("--seeds", "3"));
  const loads: [string, (s: number) => Conv[]][] = [
    ["trace", () => trace()],
    ["shared-prefix", sharedPrefix],
    ["multi-turn", multiTurn],
    ["agentic", agentic],
    ["unique", () => unique()],
    ["kv-docs", kvDocs],
  ];
  const want = opt("--workloads", "trace,shared-prefix,multi-turn,agentic,unique").split(",");
  console.log(`step_model=${STEP_MODEL}${STEP_MODEL === "knee" ? ` step_knee_exp=${STEP_KNEE_EXP}` : ""}`);
  console.log(
    `| workload | policy | TTFT mean ms | p50 | p90 | RR/this | hit | requests per worker (all seeds) | admitted past the wait bound | TTFT MAPE |${ORACLE_PREDICTOR ? " oracle predictor MAPE |" : ""}`,
  );
  console.log(`|---|---|---:|---:|---:|---:|---:|---|---:|---:|${ORACLE_PREDICTOR ? "---:|" : ""}`);
  for (const [name, make] of loads) {
    if (!want.includes(name)) continue;
    for (const c of name === "trace" ? [0] : [4, 16]) {
      const rows: [string, number[], number, number[], number, number[], number[]][] = [];
      for (const [label, flags] of variants) {
        const peer =
          flags[0] === "smg" || flags[0] === "oracle" || flags[0] === "kv-oracle"
            ? (flags[0] as "smg" | "oracle" | "kv-oracle")
            : null;
        const isFloor = flags[0] === "floor" || flags[0] === "floor-pooled" || flags[0] === "floor-c";
        const opts = parseArgs(
          ["--workers", "127.0.0.1:1", ...(peer || isFloor ? ["--router-policy", "round-robin"] : flags)],
          {},
        );
        const cfg = opts.router as RouterConfig;
        const all: number[] = [];
        let hits = 0;
        let prompt = 0;
        let forced = 0;
        const spread = [0, 0, 0, 0];
        const ape: number[] = [];
        const oape: number[] = [];
        for (let s = 0; s < (c ? seeds : 1); s++) {
          // Every row of a seed gets the same token ids (so the same block
          // hashes and content-hash tie-breaks): rows differ by policy only.
          nextTok = 1000 + s * 10_000_000;
          const r = isFloor
            ? flags[0] === "floor-c"
              ? floorAtConcurrency(make(1000 + s), c, s)
              : floor(make(1000 + s), flags[0] === "floor-pooled" ? 4 * CAPACITY : undefined)
            : run(make(1000 + s), c, cfg, opts.admission, s, peer);
          forced += r.forced;
          ape.push(...r.ape);
          if (REQS) for (const d of REQS.splice(0)) requests.push({ workload: name, c, policy: label, seed: s, ...d });
          oape.push(...r.oracleApe);
          if (DUMP)
            for (const d of DUMP.splice(0)) if (!peer) dumped.push({ workload: name, c, policy: label, seed: s, ...d });
          all.push(...r.ttft);
          hits += r.hits;
          prompt += r.prompt;
          r.spread.forEach((n, k) => (spread[k] += n));
        }
        rows.push([label, all, hits / prompt, spread, forced, ape, oape]);
      }
      const rr = mean(rows[1][1]);
      for (const [label, t, hit, spread, forced, ape, oape] of rows)
        console.log(
          `| ${c ? `${name} c=${c}` : name} | ${label} | ${mean(t).toFixed(1)} | ${pct(t, 50).toFixed(1)} | ${pct(t, 90).toFixed(1)} | ${(rr / mean(t)).toFixed(2)}x | ${(hit * 100).toFixed(1)}% | ${spread.join("/")} | ${forced} | ${ape.length ? (mean(ape) * 100).toFixed(1) + "%" : "–"} |${ORACLE_PREDICTOR ? ` ${oape.length ? (mean(oape) * 100).toFixed(1) + "%" : "–"} |` : ""}`,
        );
    }
  }
  if (DUMP_FILE) fs.writeFileSync(DUMP_FILE, dumped.map((d) => JSON.stringify(d)).join("\n") + "\n");
  if (REQ_FILE) fs.writeFileSync(REQ_FILE, requests.map((d) => JSON.stringify(d)).join("\n") + "\n");
}
const dumped: Record<string, unknown>[] = [];
const requests: Record<string, unknown>[] = [];

main();
