// The simulator's HTTP front over the engine model: overload shows in latency,
// vLLM's gauges on /metrics, cached_tokens in usage, --time-scale.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { EngineSim, parseSimArgs } from "../../sim/engine";
import { freePort } from "../harness";

const sims: EngineSim[] = [];
after(async () => {
  await Promise.all(sims.map((s) => s.stop()));
});

async function sim(extra: string[]): Promise<string> {
  const s = new EngineSim(
    parseSimArgs(["--id", "it", "--port", String(await freePort()), "--kv-events-port", "none", ...extra]),
  );
  await s.start();
  sims.push(s);
  return `http://127.0.0.1:${s.o.port}`;
}

const ids = (seed: number, n: number) =>
  Array.from({ length: n }, (_, i) => 1000 + ((seed * 7919 + i * 104729) % 140000));

/** Streams one completion; returns TTFT and mean inter-token gap (wall ms) and the final usage. */
async function stream(base: string, prompt: number[], maxTokens: number) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt, max_tokens: maxTokens, stream: true }),
  });
  assert.equal(r.status, 200);
  const text = await r.text().then((t) => t);
  const t1 = performance.now();
  const chunks = text.split("\n\n").filter((l) => l.startsWith("data: {"));
  const last = JSON.parse(chunks[chunks.length - 1].slice(6));
  return {
    total: t1 - t0,
    usage: last.usage as {
      prompt_tokens: number;
      completion_tokens: number;
      prompt_tokens_details: { cached_tokens: number };
    },
  };
}

async function metric(base: string, name: string): Promise<number> {
  const t = await (await fetch(`${base}/metrics`)).text();
  const m = t.match(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, "m"));
  assert.ok(m, `${name} on /metrics`);
  return Number(m![1]);
}

test("decode slows down as the batch grows: 32 concurrent long streams take longer per token than one", async () => {
  const base = await sim(["--time-scale", "4"]);
  const one = await stream(base, ids(1, 4000), 64);
  const many = await Promise.all(Array.from({ length: 32 }, (_, i) => stream(base, ids(100 + i, 4000), 64)));
  const slowest = Math.max(...many.map((m) => m.total));
  // one request: prefill 4k + 63 steps of ~6.5 ms; 32 requests: 128k prefill tokens plus steps over 32 x 4k KV tokens
  assert.ok(slowest > one.total * 3, `32 streams ${slowest.toFixed(0)} ms vs one ${one.total.toFixed(0)} ms`);
  assert.equal(many[0].usage.completion_tokens, 64);
});

test("a full KV cache queues requests: vllm:num_requests_waiting rises, kv_cache_usage_perc near 1, all finish", async () => {
  const base = await sim(["--capacity-blocks", "600", "--time-scale", "4"]);
  const inflight = Array.from({ length: 6 }, (_, i) => stream(base, ids(200 + i, 3000), 200));
  let waiting = 0;
  let usage = 0;
  let running = 0;
  // Sample until requests are seen waiting while memory is mostly taken: the
  // first waiting sample can come before the step that admits the others.
  for (let k = 0; k < 200 && !(waiting > 0 && usage > 0.5); k++) {
    await new Promise((r) => setTimeout(r, 10));
    waiting = await metric(base, "vllm:num_requests_waiting");
    usage = await metric(base, "vllm:kv_cache_usage_perc");
    running = await metric(base, "vllm:num_requests_running");
  }
  assert.ok(waiting > 0, "requests wait for KV memory");
  assert.ok(running >= 1 && running <= 3, `running ${running}`);
  assert.ok(usage > 0.5, `usage ${usage}`);
  const done = await Promise.all(inflight);
  assert.ok(done.every((d) => d.usage.completion_tokens === 200));
  assert.equal(await metric(base, "vllm:num_requests_waiting"), 0);
  assert.equal(await metric(base, "vllm:kv_cache_usage_perc"), 0);
});

test("usage.prompt_tokens_details.cached_tokens reports the prefix-cache hit; prefix_cache counters agree", async () => {
  const base = await sim([]);
  const p = ids(300, 1000);
  const a = await stream(base, p, 2);
  const b = await stream(base, p.concat(ids(301, 100)), 2);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 992, "62 whole blocks of the shared 1000 tokens");
  assert.equal(await metric(base, "vllm:prefix_cache_hits_total"), 992);
  assert.equal(await metric(base, "vllm:prefix_cache_queries_total"), 2100);
});

test("--time-scale runs the engine faster than real time", async () => {
  const slow = await sim([]);
  const fast = await sim(["--time-scale", "10"]);
  const p = ids(400, 8000);
  const s = await stream(slow, p, 20);
  const f = await stream(fast, p, 20);
  // ~8000 x 35 µs + 2 chunks + 19 x 6.5 ms ≈ 0.45 s of engine time
  assert.ok(s.total > 350, `real time ${s.total.toFixed(0)} ms`);
  assert.ok(f.total < s.total / 4, `x10: ${f.total.toFixed(0)} ms vs ${s.total.toFixed(0)} ms`);
});

test("PD decode role: a modelled KV transfer (--kv-bytes-per-token over --kv-link-gbps) moves only blocks it lacks", async () => {
  const pre = await sim(["--role", "prefill"]);
  const flat = await sim(["--role", "decode"]);
  const costly = await sim(["--role", "decode", "--kv-bytes-per-token", "131072", "--kv-link-gbps", "10"]);
  const peer = pre.replace("http://", "");
  async function viaPeer(base: string, prompt: number[]) {
    const t0 = performance.now();
    const r = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-prefill": peer },
      body: JSON.stringify({ model: "m", prompt, max_tokens: 2 }),
    });
    assert.equal(r.status, 200);
    await r.text();
    assert.equal(r.headers.get("x-sim-prefill-worker"), peer);
    return performance.now() - t0;
  }
  const p = ids(700, 2000);
  await viaPeer(flat, ids(701, 16)); // warm the HTTP paths
  // 2000 tokens x 128 KiB x 8 bit / 10 Gbit/s ≈ 210 ms on the costly link; a flat 1 ms on the other.
  const a = await viaPeer(flat, ids(702, 2000)); // another prompt: the peer computes both in full
  const b = await viaPeer(costly, p);
  assert.ok(b - a > 150, `transfer modelled: ${b.toFixed(0)} ms vs ${a.toFixed(0)} ms`);
  // The same prompt again: every block is already held here, nothing crosses the link.
  const c = await viaPeer(costly, p);
  assert.ok(c < b - 150, `held blocks are not pulled again: ${c.toFixed(0)} ms vs ${b.toFixed(0)} ms`);
});

test("KV source hint: a sim pulls the blocks a named peer holds instead of computing them; cached_tokens counts them", async () => {
  const holder = await sim([]);
  const puller = await sim(["--kv-bytes-per-token", "131072", "--kv-link-gbps", "100"]);
  const peer = holder.replace("http://", "");
  const p = ids(800, 3000);
  const tail = ids(801, 200);
  await stream(holder, p, 2); // the holder caches p
  async function send(base: string, prompt: number[], headers: Record<string, string> = {}) {
    const r = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ model: "m", prompt, max_tokens: 2 }),
    });
    assert.equal(r.status, 200);
    const j = (await r.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } };
    return { cached: j.usage.prompt_tokens_details.cached_tokens, pulled: r.headers.get("x-sim-kv-pulled-tokens") };
  }
  const cold = await send(puller, [...ids(802, 3000)], { "x-infera-kv-source": peer });
  assert.equal(cold.cached, 0, "the peer holds nothing of this prompt: nothing pulled");
  assert.equal(cold.pulled, null);
  const a = await send(puller, [...p, ...tail], { "x-infera-kv-source": peer });
  assert.equal(a.pulled, String(Math.floor(3000 / 16) * 16), "the peer's whole blocks of p were pulled");
  assert.equal(a.cached, Math.floor(3000 / 16) * 16, "cached_tokens reports the pulled blocks");
  // The pulled blocks are now in the puller's own cache.
  const b = await send(puller, [...p, ...ids(803, 50)]);
  assert.ok(b.cached >= Math.floor(3000 / 16) * 16, `held after the pull: ${b.cached}`);
});
