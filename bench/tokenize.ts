// Tokenization in the pick, old path vs new, side by side in one process with
// interleaved rounds (machine noise hits both alike):
//   old: the pick as main did it before this change: parse, render,
//        @huggingface/tokenizers + piece cache and every block hashed, all on
//        the event loop (core computeFeatures, as App.route called it);
//   new: the fast BPE + piece cache, long prompts on a tokenizer thread
//        (App.routeAsync, defaults).
// Workload: ~112k-token agentic conversations (system prompt, tool definitions,
// read_file tool calls whose results are disjoint slices of real code), each
// first sent cold (never seen), then extended by one turn (~500 new tokens).
// Also: raw encode throughput (tokens/s) and the inline-vs-thread crossover
// that sets --tokenize-inline-chars.
// Usage: npm run bench:tokenize [-- --reps N]
import * as fs from "fs";
import * as path from "path";
import { App } from "../runtime/app";
import { parseArgs } from "../runtime/config";
import { loadTokenizer } from "../runtime/tokenizer";
import { createFastBpe } from "../runtime/fastbpe";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { defaultTokenizerDir } from "../runtime/tokenizer";
import { blockHashes } from "../core/hash";
import { computeFeatures, parseRequest } from "../core/request";
import { requestRoot } from "../core/kvevents";
import { nativeHasher } from "../runtime/hasher";
import { pct } from "./stats";

const argReps = process.argv.indexOf("--reps");
const REPS = argReps > 0 ? Number(process.argv[argReps + 1]) : 12;
const WARMUP = 2;
const TARGET_TOKENS = 112000;

const CODE = fs.readFileSync(require.resolve("typescript/lib/typescript.js"), "utf8");
const TOOLS = [
  {
    type: "function",
    function: {
      name: "read_file",
      description: "Read a file of the repository",
      parameters: {
        type: "object",
        properties: { path: { type: "string" }, start: { type: "integer" } },
        required: ["path"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "run_tests",
      description: "Run the test suite and report failures",
      parameters: { type: "object", properties: { filter: { type: "string" } } },
    },
  },
];
const SYSTEM =
  "You are a coding agent working in a large TypeScript repository. Read files with read_file, run tests with run_tests, and explain every change you make. Keep answers short and precise.";

type Msg = Record<string, unknown>;

/** Conversation k: read_file calls whose results are a disjoint region of real code, ~112k tokens in all. */
function conversation(k: number, chunkChars: number, turns: number): Msg[] {
  const msgs: Msg[] = [
    { role: "system", content: SYSTEM },
    {
      role: "user",
      content: `Task ${k}: find why the checker mis-reports overloads and fix it. Start by reading the relevant sources.`,
    },
  ];
  const region = (k * turns * chunkChars) % Math.max(1, CODE.length - turns * chunkChars);
  for (let t = 0; t < turns; t++) {
    const start = region + t * chunkChars;
    msgs.push({
      role: "assistant",
      content: `Reading part ${t} of the checker.`,
      tool_calls: [
        {
          id: `call_${k}_${t}`,
          type: "function",
          function: { name: "read_file", arguments: JSON.stringify({ path: "src/compiler/checker.ts", start }) },
        },
      ],
    });
    msgs.push({ role: "tool", tool_call_id: `call_${k}_${t}`, content: CODE.slice(start, start + chunkChars) });
  }
  return msgs;
}

function extendTurn(msgs: Msg[], k: number): Msg[] {
  const answer =
    `I found it: the overload resolution in part ${k} drops the rest parameter when the candidate list is filtered twice. ` +
    "The fix keeps the original arity and re-checks the signature against the widened argument types. ".repeat(8);
  const next =
    `Good. Now apply the fix for case ${k}, run the tests with filter "overload-${k}", and tell me which ones still fail and why. ` +
    "Mention any related diagnostics that change wording. ".repeat(10);
  return [...msgs, { role: "assistant", content: answer }, { role: "user", content: next }];
}

const body = (msgs: Msg[]) => Buffer.from(JSON.stringify({ model: "m", messages: msgs, tools: TOOLS }));

function makeApp(args: string[]): App {
  const specs = Array.from({ length: 8 }, (_, i) => `127.0.0.1:${20000 + i}`).join(",");
  const app = new App(
    parseArgs(
      ["--workers", specs, "--log-level", "warn", "--render-probe-api", "off", "--health-interval-ms", "0", ...args],
      {},
    ),
    () => undefined,
    {
      subscribe: () => ({ close() {} }),
      close: async () => undefined,
    },
  );
  app.setWorkers(app.opts.workers);
  return app;
}

async function main(): Promise<void> {
  const t00 = performance.now();
  const tok = loadTokenizer(null)!;
  // Size the conversation to ~112k tokens on the rendered prompt.
  const chunk = 8000;
  let turns = 10;
  const count = (m: Msg[]) =>
    tok.encode(
      tok.renderChat({
        messages: m as never,
        tools: TOOLS as never,
        kwargs: {},
        addGenerationPrompt: true,
        continueFinal: false,
        documents: null,
      } as never),
    ).length;
  const per = count(conversation(999, chunk, turns)) / turns;
  turns = Math.floor(TARGET_TOKENS / per);
  while (count(conversation(1000, chunk, turns)) < TARGET_TOKENS) turns++;
  const promptTokens = count(conversation(1000, chunk, turns));
  const extTokens = count(extendTurn(conversation(1000, chunk, turns), 1000)) - promptTokens;

  const oldApp = makeApp(["--tokenizer-backend", "hf", "--tokenizer-threads", "0"]);
  const newApp = makeApp([]);
  await newApp.warmTokenizers();
  const sides = [
    {
      name: "old",
      app: oldApp,
      pick: async (b: Buffer) => {
        const req = parseRequest("chat", b.toString("utf8"), b.length, { maxBodyBytes: 1 << 30 });
        const root = requestRoot(oldApp.state.mirror, req.model, req.cacheSalt, nativeHasher);
        return oldApp.router.pick(computeFeatures(req, oldApp.tokenizer, 16, nativeHasher, root), req.sessionId);
      },
    },
    { name: "new", app: newApp, pick: (b: Buffer) => newApp.routeAsync("chat", b, null) },
  ];
  const cold: number[][] = [[], []];
  const ext: number[][] = [[], []];
  for (let r = 0; r < REPS + WARMUP; r++) {
    const conv = conversation(r, chunk, turns);
    const b1 = body(conv);
    const b2 = body(extendTurn(conv, r));
    for (let s = 0; s < 2; s++) {
      let t0 = performance.now();
      const p1 = await sides[s].pick(b1);
      const c = performance.now() - t0;
      p1.reservation.finish();
      t0 = performance.now();
      const p2 = await sides[s].pick(b2);
      const e = performance.now() - t0;
      p2.reservation.finish();
      if (r >= WARMUP) {
        cold[s].push(c);
        ext[s].push(e);
      }
    }
  }
  // The floor under both: pick + release alone with the features precomputed.
  const floor: number[] = [];
  {
    const conv = conversation(0, chunk, turns);
    const ids = tok.encode(
      tok.renderChat({
        messages: conv as never,
        tools: TOOLS as never,
        kwargs: {},
        addGenerationPrompt: true,
        continueFinal: false,
        documents: null,
      } as never),
    );
    const feats = {
      blocks: blockHashes(ids, 16, nativeHasher),
      inputTokens: ids.length,
      exact: true,
      mediaHashes: [],
      n: 1,
    };
    for (let r = 0; r < REPS + WARMUP; r++) {
      const t0 = performance.now();
      newApp.router.pick(feats as never).reservation.finish();
      if (r >= WARMUP) floor.push(performance.now() - t0);
    }
  }
  const oldStats = oldApp.cacheStats()!;
  const newStats = newApp.cacheStats()!;

  // Raw encode throughput on cold text (no piece cache; a fresh word cache for the fast BPE).
  const dir = defaultTokenizerDir();
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const hf = new HfTokenizer(tj, JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")));
  const text = CODE.slice(CODE.length - 420000);
  const tput = { hf: [] as number[], fast: [] as number[], n: 0 };
  for (let r = 0; r < 4; r++) {
    let t0 = performance.now();
    const a = hf.encode(text, { add_special_tokens: false }).ids;
    tput.hf.push(a.length / ((performance.now() - t0) / 1000));
    const fb = createFastBpe(tj);
    t0 = performance.now();
    const f = fb.encode(text);
    tput.fast.push(f.length / ((performance.now() - t0) / 1000));
    if (f.length !== a.length || f.some((x, i) => x !== a[i]))
      throw new Error("fast BPE ids differ from @huggingface/tokenizers on the throughput text");
    tput.n = a.length;
  }

  // Inline vs thread: where the hop starts to pay (sets --tokenize-inline-chars).
  const cross: string[] = [];
  const inlineApp = makeApp(["--tokenizer-threads", "0"]);
  const threadApp = makeApp(["--tokenize-inline-chars", "0"]);
  await threadApp.warmTokenizers();
  for (const chars of [4096, 16384, 65536, 262144]) {
    const times: number[][] = [[], []];
    for (let r = 0; r < 14; r++) {
      // distinct text per round: a cold piece every time
      const content = CODE.slice(r * chars + 1_000_000, r * chars + 1_000_000 + chars);
      const b = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content }] }));
      for (let s = 0; s < 2; s++) {
        const t0 = performance.now();
        const p = s === 0 ? inlineApp.route("chat", b, null) : await threadApp.routeAsync("chat", b, null);
        const dt = performance.now() - t0;
        p.reservation.finish();
        if (r >= 2) times[s].push(dt);
      }
    }
    cross.push(`| ${chars} | ${pct(times[0], 50).toFixed(2)} | ${pct(times[1], 50).toFixed(2)} |`);
  }
  for (const a of [oldApp, newApp, inlineApp, threadApp]) await a.close();

  const f = (x: number) => x.toFixed(1);
  const ratio = (a: number, b: number) => (a / b).toFixed(1) + "x";
  const hit = (s: { hitTokens: number; missTokens: number }) =>
    ((100 * s.hitTokens) / (s.hitTokens + s.missTokens)).toFixed(1) + "%";
  const lines = [
    `infera-gate tokenize bench, ${new Date().toISOString()}, node ${process.version}, ${REPS} interleaved rounds (+${WARMUP} warm-up), ${((performance.now() - t00) / 1000).toFixed(0)} s`,
    "",
    `Pick latency (parse + chat template + tokenize + chained XXH3 + score over 8 workers), ${promptTokens}-token agentic prompt (${turns} tool results of real code), then the same conversation + one turn (+${extTokens} tokens):`,
    "",
    "| case | old p50 ms | new p50 ms | old p99 ms | new p99 ms | old/new p50 |",
    "|---|---:|---:|---:|---:|---:|",
    `| cold ${promptTokens}-token prompt | ${f(pct(cold[0], 50))} | ${f(pct(cold[1], 50))} | ${f(pct(cold[0], 99))} | ${f(pct(cold[1], 99))} | ${ratio(pct(cold[0], 50), pct(cold[1], 50))} |`,
    `| ${promptTokens + extTokens}-token turn extending it | ${f(pct(ext[0], 50))} | ${f(pct(ext[1], 50))} | ${f(pct(ext[0], 99))} | ${f(pct(ext[1], 99))} | ${ratio(pct(ext[0], 50), pct(ext[1], 50))} |`,
    "",
    `Of which pick + release alone (features precomputed, same 8 workers): p50 ${f(pct(floor, 50))} ms.`,
    "",
    `Piece cache hit rate over the run: old ${hit(oldStats)}, new ${hit(newStats)}.`,
    "",
    `Raw encode throughput, ${tput.n} tokens of cold code (no piece cache, fresh word cache), median of 4: @huggingface/tokenizers ${(pct(tput.hf, 50) / 1e6).toFixed(2)} M tokens/s, fast BPE ${(pct(tput.fast, 50) / 1e6).toFixed(2)} M tokens/s (${ratio(pct(tput.fast, 50), pct(tput.hf, 50))}), ids identical.`,
    "",
    "Inline vs tokenizer thread, pick p50 ms for a cold prompt of N chars (fast BPE both):",
    "",
    "| chars | inline | thread |",
    "|---:|---:|---:|",
    ...cross,
  ];
  const out = lines.join("\n") + "\n";
  process.stdout.write(out);
  fs.mkdirSync(path.join(__dirname, "results"), { recursive: true });
  fs.writeFileSync(path.join(__dirname, "results", "tokenize.md"), out);
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${e.stack}\n`);
  process.exit(1);
});
