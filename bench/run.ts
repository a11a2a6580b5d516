// Benchmarks, every ratio from one run on this machine:
//  1. pick latency (parse + tokenize + hash + score) for 1k/4k/32k-token
//     prompts over 8 and 64 workers, in-process with the production code path;
//  2. TTFT of kv-aware vs round-robin through real Envoy on a shared-prefix
//     workload (engine simulators with a prefix cache).
// Usage: npm run bench [-- --skip-ttft] [-- --skip-pick] [-- --quick]
import * as fs from "fs";
import * as path from "path";
import { App } from "../runtime/app";
import { parseArgs } from "../runtime/config";
import { nativeHasher } from "../runtime/hasher";
import { jsHasher, blockHashes } from "../core/hash";
import { applyBatch } from "../core/kvevents";
import { plainChat } from "../core/chat";
import { startSim, startRouter, startEnvoy, workerArg, chat, longText, stopAll, envoyBin, Sim } from "../test/harness";
import { mean, pct } from "./stats";

const quick = process.argv.includes("--quick");

function wordsFor(tokens: number): number {
  return Math.round(tokens / 10.8); // longText averages ~10.8 Qwen3 tokens per word
}

async function pickLatency(): Promise<string[]> {
  const rows: string[] = ["| prompt tokens | workers | median ms | p99 ms |", "|---:|---:|---:|---:|"];
  for (const workers of [8, 64]) {
    const specs = Array.from({ length: workers }, (_, i) => `127.0.0.1:${20000 + i}`).join(",");
    const app = new App(parseArgs(["--workers", specs, "--log-level", "warn"], {}), () => undefined, {
      subscribe: () => ({ close() {} }),
      close: async () => undefined,
    });
    app.setWorkers(app.opts.workers);
    const tok = app.tokenizer!;
    const ws = app.router.workers();
    // every worker caches an unrelated 2k-token prompt; worker 3 also holds the benchmark prefix
    for (let i = 0; i < ws.length; i++) {
      const t = tok.encode(tok.renderChat(plainChat([{ role: "user", content: longText(`bg${i}`, wordsFor(2000)) }])));
      const n = Math.floor(t.length / 16);
      applyBatch(
        app.state.mirror,
        ws[i].epochKey,
        0,
        [
          {
            type: "BlockStored",
            hashes: Array.from({ length: n }, (_, k) => `${i}-${k}`),
            parent: null,
            tokens: t.slice(0, n * 16),
            blockSize: 16,
          },
        ],
        16,
        nativeHasher,
      );
    }
    for (const size of [1000, 4000, 32000]) {
      const content = longText(`q${size}`, wordsFor(size));
      const t = tok.encode(tok.renderChat(plainChat([{ role: "user", content }])));
      const half = Math.floor(t.length / 32) * 16;
      applyBatch(
        app.state.mirror,
        ws[3].epochKey,
        1,
        [
          {
            type: "BlockStored",
            hashes: Array.from({ length: half / 16 }, (_, k) => `p${size}-${k}`),
            parent: null,
            tokens: t.slice(0, half),
            blockSize: 16,
          },
        ],
        16,
        nativeHasher,
      );
      const body = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content }] }));
      const reps = quick ? 5 : size >= 32000 ? 15 : 60;
      const times: number[] = [];
      let tokens = 0;
      for (let k = 0; k < reps + 3; k++) {
        const t0 = performance.now();
        const p = app.route("chat", body, null);
        const dt = performance.now() - t0;
        if (k >= 3) times.push(dt);
        if (p.target.id !== ws[3].id) throw new Error(`bench pick went to ${p.target.id}, expected the cached worker`);
        tokens = p.candidates.length ? t.length : 0;
        p.reservation.finish();
      }
      rows.push(`| ${tokens} | ${workers} | ${pct(times, 50).toFixed(2)} | ${pct(times, 99).toFixed(2)} |`);
      applyBatch(app.state.mirror, ws[3].epochKey, 2, [{ type: "AllBlocksCleared" }], 16);
    }
    await app.close();
  }
  return rows;
}

function hasherRatio(): string {
  const toks = Array.from({ length: 32000 }, (_, i) => (i * 2654435761) >>> 0);
  const time = (h: typeof jsHasher) => {
    const t0 = performance.now();
    for (let r = 0; r < 5; r++) blockHashes(toks, 16, h);
    return (performance.now() - t0) / 5;
  };
  time(jsHasher);
  time(nativeHasher);
  const js = time(jsHasher);
  const nat = time(nativeHasher);
  return `block hashing of 32k tokens: pure-JS ${js.toFixed(2)} ms, @node-rs/xxhash ${nat.toFixed(2)} ms (JS/native = ${(js / nat).toFixed(2)}x)`;
}

async function ttft(args: string[]): Promise<number[]> {
  const sims: Sim[] = await Promise.all(
    ["b0", "b1", "b2", "b3"].map((id) => startSim(id, ["--prefill-us-per-token", "100", "--decode-ms-per-token", "1"])),
  );
  const router = await startRouter(["--workers", workerArg(sims), ...args]);
  const envoy = await startEnvoy(router.grpcPort);
  await chat(envoy.url, "warm " + longText("warm", 30));
  const docs = Array.from({ length: quick ? 4 : 8 }, (_, i) => longText(`doc${i}`, wordsFor(2500)));
  // every doc asked 4 questions, in a seeded shuffle (a fixed order could line
  // docs up with round-robin's rotation and hand it cache hits by accident)
  const reqs: string[] = [];
  for (let q = 0; q < 4; q++)
    for (let d = 0; d < docs.length; d++)
      reqs.push(`${docs[d]}\n\nQuestion ${q}: what about part ${(d * 7 + q) % 13}?`);
  let seed = 20261202;
  for (let i = reqs.length - 1; i > 0; i--) {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    const j = seed % (i + 1);
    [reqs[i], reqs[j]] = [reqs[j], reqs[i]];
  }
  const out: number[] = [];
  const conc = 4;
  for (let i = 0; i < reqs.length; i += conc) {
    const batch = await Promise.all(reqs.slice(i, i + conc).map((r) => chat(envoy.url, r, { maxTokens: 8 })));
    for (const b of batch) {
      if (b.status !== 200) throw new Error(`status ${b.status}`);
      out.push(b.ttftMs);
    }
  }
  await stopAll();
  return out;
}

async function main(): Promise<void> {
  const lines: string[] = [
    `infera-gate bench, ${new Date().toISOString()}, node ${process.version}, ${quick ? "quick" : "full"} run`,
    "",
  ];
  if (!process.argv.includes("--skip-pick")) {
    lines.push(
      "Pick latency (parse + chat template + tokenize + chained XXH3 + score), in-process:",
      "",
      ...(await pickLatency()),
      "",
    );
    lines.push(hasherRatio(), "");
  }
  if (!process.argv.includes("--skip-ttft") && envoyBin()) {
    const kv = await ttft(["--router-policy", "kv-aware"]);
    const kv4 = await ttft(["--router-policy", "kv-aware", "--kv-overlap-weight", "4"]);
    const rr = await ttft(["--router-policy", "round-robin"]);
    lines.push(
      `TTFT through real Envoy, ${kv.length} requests (${kv.length / 4} docs x 4 questions, ~2.5k-token shared prefixes, 4 workers, concurrency 4):`,
      "",
      "| policy | mean ms | p50 ms | p90 ms |",
      "|---|---:|---:|---:|",
      `| kv-aware (weight 1, default) | ${mean(kv).toFixed(1)} | ${pct(kv, 50).toFixed(1)} | ${pct(kv, 90).toFixed(1)} |`,
      `| kv-aware (--kv-overlap-weight 4) | ${mean(kv4).toFixed(1)} | ${pct(kv4, 50).toFixed(1)} | ${pct(kv4, 90).toFixed(1)} |`,
      `| round-robin | ${mean(rr).toFixed(1)} | ${pct(rr, 50).toFixed(1)} | ${pct(rr, 90).toFixed(1)} |`,
      "",
      `round-robin / kv-aware mean TTFT: weight 1 = ${(mean(rr) / mean(kv)).toFixed(2)}x, weight 4 = ${(mean(rr) / mean(kv4)).toFixed(2)}x; p50: ${(pct(rr, 50) / pct(kv, 50)).toFixed(2)}x, ${(pct(rr, 50) / pct(kv4, 50)).toFixed(2)}x`,
    );
  }
  const text = lines.join("\n") + "\n";
  process.stdout.write(text);
  const dir = path.join(__dirname, "results");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "latest.md"), text);
}

main().catch(async (e) => {
  await stopAll();
  process.stderr.write(`bench failed: ${e.stack}\n`);
  process.exit(1);
});
