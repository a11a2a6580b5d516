// Issue 15 item 7: the nginx bridge never drops. nginx is stopped while the
// engines keep serving (and storing/evicting blocks); once nginx is back the
// bridge resyncs it in full, and nginx's cache-view equals each engine's.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  nginx08,
  startSim,
  startNginx,
  startBridge,
  workerArg,
  chat,
  longText,
  stopAll,
  sleep,
  waitFor,
  run,
  freePort,
  httpOk,
  Sim,
} from "../harness";
import { needs } from "../tools";
import { SWEEP_STEP } from "../../core/state/keyed";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
after(stopAll);

/** nginx's cache-view block count for an engine. */
async function cacheView(ngUrl: string, s: Sim): Promise<number> {
  return ((await (await fetch(`${ngUrl}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number })
    .block_count;
}

/** Whether nginx's cache-view equals every engine's cached blocks. */
async function mirrorsMatch(ngUrl: string, sims: Sim[]): Promise<boolean> {
  for (const s of sims) if ((await cacheView(ngUrl, s)) !== (await s.stats()).cached_blocks) return false;
  return true;
}

/** nginx (with vars) and a bridge on sims that retries nginx at most every 500 ms, ready; nginx's cache-view count per engine. */
async function nginxAndBridge(sims: Sim[], vars: Record<string, string> = {}, bridgeArgs: string[] = []) {
  const ng = await startNginx(n8!, vars);
  const admin = await freePort();
  const bridge = await startBridge(
    ["--workers", workerArg(sims), "--admin-port", String(admin), "--bridge-backoff-max-ms", "500", ...bridgeArgs],
    `${ng.url}/_infera/push`,
  );
  const bAdmin = `http://127.0.0.1:${admin}`;
  await waitFor("bridge ready", () => httpOk(`${bAdmin}/readyz`), 15000);
  const view = (s: Sim) => cacheView(ng.url, s);
  const inSync = () => mirrorsMatch(ng.url, sims);
  return { ng, bridge, bAdmin, view, inSync };
}

test(
  "bridge: nginx stopped under traffic, then back: full resync, cache-view equals the engines', /readyz and /metrics tell",
  { skip, timeout: 180000 },
  async () => {
    // A small cache, so the outage also sees evictions (BlockRemoved), not only stores.
    const sims: Sim[] = await Promise.all(
      ["b0", "b1"].map((id) => startSim(id, ["--capacity-blocks", "400", "--decode-ms-per-token", "1"])),
    );
    const { ng, bridge, bAdmin, view, inSync } = await nginxAndBridge(sims);
    // Engine traffic straight to the workers, independent of nginx being up.
    let stop = false;
    let sent = 0;
    const traffic = (async () => {
      for (let i = 0; !stop && i < 2000; i++) {
        await Promise.all(
          sims.map((s, j) =>
            chat(`http://127.0.0.1:${s.port}`, longText(`br${i % 37}x${j}`, 60 + (i % 5) * 40)).catch(() => null),
          ),
        );
        sent += sims.length;
      }
    })();
    await sleep(1500);
    stop = true;
    await traffic;
    await waitFor("nginx mirrors the engines before the outage", inSync, 15000);

    // nginx goes away; the engines keep storing and evicting.
    // SIGTERM: a SIGKILLed master leaves its workers serving.
    await ng.proc.kill("SIGTERM");
    stop = false;
    const traffic2 = (async () => {
      for (let i = 0; !stop && i < 2000; i++) {
        await Promise.all(
          sims.map((s, j) =>
            chat(`http://127.0.0.1:${s.port}`, longText(`out${i}x${j}`, 80 + (i % 7) * 30)).catch(() => null),
          ),
        );
        sent += sims.length;
      }
    })();
    await waitFor(
      "bridge not ready while nginx is down",
      async () => (await fetch(`${bAdmin}/readyz`)).status === 503,
      10000,
    );
    await sleep(6000);
    stop = true;
    await traffic2;
    const during = (await sims[0].stats()).cached_blocks;
    assert.ok(during > 0);

    // nginx back on the same port with empty shared dicts.
    const ng2 = run(
      "nginx-again",
      n8!.bin,
      ["-p", ng.dir, "-c", path.join(ng.dir, "nginx.conf"), "-e", "stderr", "-g", "daemon off;"],
      { INFERA_PUSH_TOKEN: "test-token" },
    );
    await waitFor(
      "nginx answers",
      async () => !!(await fetch(`${ng.url}/v1/admin/reservations`).catch(() => null)),
      15000,
    );
    await waitFor("bridge ready again", () => httpOk(`${bAdmin}/readyz`), 20000);
    await waitFor("nginx's cache-view equals each engine's after the resync", inSync, 20000).catch(async (e) => {
      const got = await Promise.all(
        sims.map(async (s) => `${s.id}: nginx ${await view(s)} engine ${(await s.stats()).cached_blocks}`),
      );
      throw new Error(`${(e as Error).message}: ${got.join("; ")}\n${bridge.log().slice(-3000)}`);
    });
    for (const s of sims) assert.ok((await view(s)) > 0, "mirror restored, not just emptied");

    // Live batches after the resync still apply (sequence continues).
    const r = await chat(`http://127.0.0.1:${sims[1].port}`, longText("afterresync", 200));
    assert.equal(r.status, 200);
    await waitFor("live events after the resync", inSync, 10000);

    // nginx may have applied the last push before the bridge read its answer.
    await waitFor(
      "queue drained",
      async () => /^infera_bridge_queue_depth 0$/m.test(await (await fetch(`${bAdmin}/metrics`)).text()),
      5000,
    );
    const m = await (await fetch(`${bAdmin}/metrics`)).text();
    const resyncs = Number(/^infera_bridge_resyncs_total (\d+)/m.exec(m)?.[1] ?? 0);
    assert.ok(resyncs >= 2, `startup + after the outage: ${resyncs}`);
    assert.match(m, /^infera_bridge_nginx_dirty 0$/m);
    assert.match(m, /^infera_bridge_queue_depth 0$/m);
    // One warning when nginx went away, one line when it came back; not a line per retry.
    const warn = bridge
      .log()
      .split("\n")
      .filter((l) => /nginx push .*retrying/.test(l));
    assert.ok(warn.length >= 1 && warn.length <= 3, `outage warnings: ${warn.length}`);
    assert.match(bridge.log(), /nginx push .* recovered after/);
    void ng2;
    void sent;
  },
);

test(
  "bridge: a queue over --bridge-queue-max is replaced by a full resync, not dropped",
  { skip, timeout: 120000 },
  async () => {
    const sims: Sim[] = await Promise.all(
      ["q0", "q1"].map((id) => startSim(id, ["--capacity-blocks", "300", "--decode-ms-per-token", "1"])),
    );
    const ng = await startNginx(n8!);
    const admin = await freePort();
    await startBridge(
      ["--workers", workerArg(sims), "--admin-port", String(admin), "--bridge-queue-max", "1"],
      `${ng.url}/_infera/push`,
    );
    const bAdmin = `http://127.0.0.1:${admin}`;
    await waitFor("bridge ready", () => httpOk(`${bAdmin}/readyz`), 15000);
    // Bursts of concurrent requests: batches arrive faster than one-at-a-time pushes drain.
    for (let round = 0; round < 6; round++)
      await Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          chat(`http://127.0.0.1:${sims[i % 2].port}`, longText(`qq${round}x${i}`, 120)).catch(() => null),
        ),
      );
    const metric = async (name: string) =>
      Number(new RegExp(`^${name} (\\d+)`, "m").exec(await (await fetch(`${bAdmin}/metrics`)).text())?.[1] ?? -1);
    assert.ok((await metric("infera_bridge_queue_overflows_total")) >= 1, "the queue overflowed");
    await waitFor("nginx equals the engines after the overflow resync", () => mirrorsMatch(ng.url, sims), 20000);
    assert.ok((await metric("infera_bridge_resyncs_total")) >= 2);
  },
);

test(
  "bridge: engines caching more than nginx's zones hold: after the first 507 one resync fits, nginx keeps the newest blocks within the zones and stays in sync",
  { skip, timeout: 180000 },
  async () => {
    const sims: Sim[] = await Promise.all(["z0", "z1"].map((id) => startSim(id, ["--decode-ms-per-token", "1"])));
    const { ng, bridge, bAdmin, view } = await nginxAndBridge(sims, { zone_str: "1m", zone_num: "1m" });
    const metrics = async () => (await (await fetch(`${bAdmin}/metrics`)).text()) as string;
    const refused = async () =>
      Number(/^infera_bridge_pushes_total\{type="events",result="507"\} (\d+)/m.exec(await metrics())?.[1] ?? 0);
    // Engine traffic straight to the workers (their caches never evict here) until nginx's zones refuse a batch.
    let round = 0;
    const traffic = async (rounds: number) => {
      for (const end = round + rounds; round < end; round++)
        await Promise.all(sims.map((s, j) => chat(`http://127.0.0.1:${s.port}`, longText(`zf${round}x${j}`, 300))));
    };
    for (let i = 0; i < 60 && (await refused()) === 0; i++) await traffic(2);
    assert.ok((await refused()) > 0, "the zones filled");
    const settled = () =>
      waitFor(
        "the bridge back in sync",
        async () => {
          const m = await metrics();
          return /^infera_bridge_nginx_dirty 0$/m.test(m) && /^infera_bridge_queue_depth 0$/m.test(m);
        },
        20000,
      );
    await settled().catch((e) => {
      throw new Error(`${(e as Error).message}\n${bridge.log().slice(-2000)}`);
    });
    const resyncs = Number(/^infera_bridge_resyncs_total (\d+)/m.exec(await metrics())?.[1]);
    const refusedThen = await refused();
    const engines = (await sims[0].stats()).cached_blocks + (await sims[1].stats()).cached_blocks;
    // More traffic: every live batch fits now, with no further refusal or resync.
    await traffic(10);
    await settled();
    const m = await metrics();
    assert.equal(
      Number(/^infera_bridge_resyncs_total (\d+)/m.exec(m)?.[1]),
      resyncs,
      "no resync after the one that fit",
    );
    assert.equal(await refused(), refusedThen, "no push refused after it");
    const held = [await view(sims[0]), await view(sims[1])];
    const now = (await sims[0].stats()).cached_blocks + (await sims[1].stats()).cached_blocks;
    assert.ok(now > engines, "the engines kept storing");
    assert.ok(held[0] > 0 && held[1] > 0 && held[0] + held[1] < now, `nginx holds ${held} of ${now}`);
    // The newest prompt is among the blocks kept: nginx routes it to the engine that cached it.
    const last = round - 1;
    for (let j = 0; j < 2; j++) {
      const r = await chat(ng.url, longText(`zf${last}x${j}`, 300));
      assert.equal(r.status, 200);
      assert.equal(r.worker, sims[j].id, `the newest prompt of ${sims[j].id}`);
      assert.ok(r.cachedTokens > 0, "and it hits there");
    }
  },
);

test(
  "bridge: an engine's prefix-cache reset with thousands of blocks mirrored: nginx drops them from picks in the clear's push and sweeps them over later pushes",
  { skip, timeout: 120000 },
  async () => {
    const sims: Sim[] = await Promise.all(["c0", "c1"].map((id) => startSim(id, ["--decode-ms-per-token", "1"])));
    // Engine readings pushed every 200 ms: the pushes that sweep while no events come.
    const { ng, view, inSync } = await nginxAndBridge(sims, {}, ["--engine-metrics-interval-ms", "200"]);
    /** A metric of nginx's /metrics summed over its series; -1 when it has none. */
    const metric = async (name: string) => {
      const text = await (await fetch(`${ng.url}/metrics`)).text();
      let n = -1;
      for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\d+)$`, "gm")))
        n = Math.max(n, 0) + Number(m[1]);
      return n;
    };
    const unswept = () => metric("infera_router_mirror_unswept_blocks");
    const hits = async () => Math.max(0, await metric("infera_router_cache_hit_blocks_total"));
    // Cached on c0 alone (sent to it directly): far more blocks than one sweep step.
    const prompts = Array.from({ length: 6 }, (_, i) => longText(`sweep${i}`, 2500));
    for (const p of prompts) assert.equal((await chat(`http://127.0.0.1:${sims[0].port}`, p)).status, 200);
    await waitFor(
      "nginx mirrors c0",
      async () => (await view(sims[0])) > 0 && (await view(sims[0])) === (await sims[0].stats()).cached_blocks,
      20000,
    );
    const held = await view(sims[0]);
    assert.ok(held > SWEEP_STEP * 10, `c0 holds ${held} blocks`);
    assert.equal(await unswept(), 0);
    const routed = await chat(ng.url, prompts[0]);
    assert.equal(routed.worker, sims[0].id, "a cached prompt goes to its holder");

    // The reset: one AllBlocksCleared. The mirror is empty for picks at once, its blocks still to sweep.
    assert.equal((await fetch(`http://127.0.0.1:${sims[0].port}/sim/clear`, { method: "POST" })).status, 200);
    await waitFor("c0's mirror empty in nginx", async () => (await view(sims[0])) === 0, 10000);
    const left = await unswept();
    assert.ok(left > 0 && left <= held, `blocks left to sweep: ${left} of ${held}`);
    // A prompt c0 held before the reset finds no cached block anywhere, though its old entries are still there.
    const h0 = await hits();
    assert.equal((await chat(ng.url, prompts[1])).status, 200);
    assert.equal((await hits()) - h0, 0, "no hit counted for blocks the engine dropped");
    assert.ok((await unswept()) > 0, "the request ran while the old blocks were still being swept");

    // Later pushes sweep them all, a step each.
    await waitFor("swept", async () => (await unswept()) === 0, 60000);
    // The prompt sent after the reset is mirrored again (on the engine that computed it), and a repeat hits it.
    await waitFor("nginx in sync", inSync, 10000);
    const h1 = await hits();
    const again = await chat(ng.url, prompts[1]);
    assert.ok(again.cachedTokens > 0, "the repeat hits the engine that computed it");
    assert.ok((await hits()) - h1 > 0, "and the router counted it");
  },
);
