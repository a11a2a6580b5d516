// The tokenizer thread pool: same token counts and block hashes as the event
// loop's own path, a bounded queue (503), a time bound that replaces the
// thread (413), and routeAsync picking exactly like route.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { TokenizerPool, defaultThreads } from "../../runtime/tokenpool";
import { loadTokenizer } from "../../runtime/tokenizer";
import { blockHashes } from "../../core/hash";
import { nativeHasher } from "../../runtime/hasher";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { longText } from "../harness";

const pools: TokenizerPool[] = [];
after(async () => {
  for (const p of pools) await p.close();
});

test("threads: same tokens and block hashes as inline, queue bound 503, time bound 413 with the thread replaced", async () => {
  assert.equal(defaultThreads(2), 1);
  assert.equal(defaultThreads(16), 4);
  const pool = new TokenizerPool({ keys: [""], threads: 1, queueMax: 2, timeoutMs: 20000 });
  pools.push(pool);
  await pool.ready();
  const tok = loadTokenizer(null)!;
  const text = `<|im_start|>user\n${longText("pool", 3000)} 日本語 🎉<|im_end|>\n<|im_start|>assistant\n`;
  const ids = tok.encode(text);
  const got = await pool.encode("", text, false, 16, "salt0123456789ab");
  assert.equal(got.tokens, ids.length);
  assert.deepEqual(got.blocks, blockHashes(ids, 16, nativeHasher, "salt0123456789ab"));
  // Bounded queue: the third concurrent prompt is refused at once.
  const a = pool.encode("", text + "a", false, 16, null);
  const b = pool.encode("", text + "b", false, 16, null);
  await assert.rejects(
    pool.encode("", text + "c", false, 16, null),
    (e: Error & { status?: number }) => e.status === 503 && /queue is full/.test(e.message),
  );
  await Promise.all([a, b]);
  assert.equal(pool.counts.queueFull, 1);
  // A prompt whose own encoding runs past the bound: 413, the thread is replaced, the next one works.
  const slow = new TokenizerPool({ keys: [""], threads: 1, queueMax: 4, timeoutMs: 30 });
  pools.push(slow);
  await slow.ready();
  const huge = longText("huge", 300000);
  const t0 = performance.now();
  await assert.rejects(
    slow.encode("", huge, false, 16, null),
    (e: Error & { status?: number }) => e.status === 413 && /took over 30 ms to tokenize/.test(e.message),
  );
  assert.ok(performance.now() - t0 < 1000, "the caller hears at the bound, not when the encoding would have ended");
  assert.equal(slow.counts.restarts, 1);
  await slow.ready();
  const small = await slow.encode("", "hello world", false, 16, null);
  assert.equal(small.tokens, tok.encode("hello world").length);
});

test("routeAsync puts long prompts on a thread and picks exactly what route picks", async () => {
  const app = new App(
    parseArgs(
      [
        "--workers",
        "127.0.0.1:1,127.0.0.1:2",
        "--tokenizer-threads",
        "1",
        "--tokenize-inline-chars",
        "1000",
        "--render-probe-api",
        "off",
        "--health-interval-ms",
        "0",
      ],
      {},
    ),
    () => undefined,
    {
      subscribe: () => ({ close() {} }),
      close: async () => undefined,
    },
  );
  try {
    app.setWorkers(app.opts.workers);
    await app.warmTokenizers();
    const body = Buffer.from(
      JSON.stringify({
        model: "m",
        messages: [
          { role: "system", content: "be brief" },
          { role: "user", content: longText("ra", 2000) },
        ],
      }),
    );
    const inline = app.route("chat", body, null);
    const blocksInline = inline.candidates.map((c) => c.cost);
    inline.reservation.finish();
    const threaded = await app.routeAsync("chat", body, null);
    assert.deepEqual(
      threaded.candidates.map((c) => c.cost),
      blocksInline,
      "same request blocks, same costs",
    );
    threaded.reservation.finish();
    const m = await app.metrics.registry.metrics();
    assert.match(m, /infera_router_tokenize_jobs_total\{outcome="ok"\} 1/);
    assert.match(m, /infera_router_event_loop_lag_seconds\{stat="max"\} /);
    assert.match(m, /infera_router_tokenizer_piece_cache_hit_ratio /);
    // Short prompts stay on the event loop.
    (
      await app.routeAsync(
        "chat",
        Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] })),
        null,
      )
    ).reservation.finish();
    assert.match(await app.metrics.registry.metrics(), /infera_router_tokenize_jobs_total\{outcome="ok"\} 1/);
  } finally {
    await app.close();
  }
});
