// Issue 12 through nginx: the bridge repairs and forwards every field; njs
// mirrors per tier and group, folds salts and adapter names, routes DP ranks
// and sends X-data-parallel-rank to the engine.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as http from "http";
import * as path from "path";
import {
  ROOT,
  nginx08,
  startSim,
  startNginx,
  startBridge,
  chat,
  longText,
  stopAll,
  waitFor,
  sleep,
  Sim,
  freePort,
  freePortRun,
  run,
} from "../harness";
import { needs } from "../tools";
import { freeEngineArgs, startBridgeAt, textOfTokens } from "../nginx-stack";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs/dist/infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
let ng: { url: string; dir: string; proc: { kill(sig?: NodeJS.Signals): Promise<void> } };
let sim: Sim;
let dp: Sim;
let sg: Sim;
let simReplay = 0;

before(async () => {
  if (skip) return;
  const rp = await freePort();
  simReplay = rp;
  const drp = await freePortRun(2);
  sim = await startSim("ngx", [
    "--kv-replay-port",
    String(rp),
    "--kv-event-encoding",
    "map",
    "--time-scale",
    "20",
    "--capacity-blocks",
    "128",
    "--kv-cpu-blocks",
    "40",
    "--kv-sliding-window",
    "256",
    "--lora-modules",
    "sql-lora",
    "--served-model-name",
    "sim-model",
  ]);
  dp = await startSim("ngxdp", [
    "--data-parallel-size",
    "2",
    "--kv-replay-port",
    String(drp),
    "--time-scale",
    "20",
    "--served-model-name",
    "sim-model",
  ]);
  sg = await startSim("ngxsg", [
    "--engine",
    "sglang",
    "--data-parallel-size",
    "2",
    "--time-scale",
    "20",
    "--served-model-name",
    "sim-model",
  ]);
  ng = await startNginx(n8!);
  await startBridge(
    [
      "--workers",
      `${sim.address}@${sim.events}+tcp://127.0.0.1:${rp},${dp.address}/dp=2@${dp.events}+tcp://127.0.0.1:${drp},${sg.address}/dp=2/sglang@${sg.events}`,
      "--bridge-backoff-max-ms",
      "500",
    ],
    `${ng.url}/_infera/push`,
  );
  await waitFor(
    "fleet in nginx",
    async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 5,
  );
});
after(stopAll);

type View = { block_count: number; tiers: { GPU: number; CPU: number }; seq: number | null };
const view = async (id: string) =>
  (await (await fetch(`${ng.url}/v1/admin/cache-view/${encodeURIComponent(id)}`)).json()) as View;
const simStats = async (s: Sim) =>
  (await s.stats()) as unknown as { cached_blocks: number; cpu_blocks: number; last_kv_seq: number | null };

test(
  "nginx+njs: tiers and the second KV group follow the engine; salts and adapters only match their own",
  { skip },
  async () => {
    for (let i = 0; i < 6; i++)
      assert.equal((await chat(`http://${sim.address}`, longText(`ngt${i}-`, 60), { maxTokens: 2 })).status, 200);
    await chat(`http://${sim.address}`, longText("ngsalt-", 60), { maxTokens: 2, extra: { cache_salt: "tenant-a" } });
    await chat(`http://${sim.address}`, longText("nglora-", 60), { maxTokens: 2, extra: { model: "sql-lora" } });
    const s = await simStats(sim);
    assert.equal(s.cpu_blocks, 40);
    // Once both tiers are full their counts no longer change while blocks are
    // swapped, so equal counts alone can pass before the salted and adapter
    // batches reach nginx: wait for nginx to have applied the engine's last batch.
    await waitFor(
      "nginx applied the engine's last batch; mirror = engine (GPU and CPU)",
      async () => {
        const v = await view(sim.address);
        return (
          v.seq === s.last_kv_seq &&
          v.tiers.GPU === s.cached_blocks &&
          v.tiers.CPU === 40 &&
          v.block_count === s.cached_blocks
        );
      },
      15000,
    );
    // through nginx: the salted prompt goes to the worker holding it only with the same salt
    const cached = async (seed: string, extra: Record<string, unknown>) =>
      (await chat(ng.url, longText(seed, 60), { maxTokens: 1, extra })).cachedTokens;
    assert.ok((await cached("ngsalt-", { cache_salt: "tenant-a" })) > 100);
    assert.equal(await cached("ngsalt-", { cache_salt: "tenant-b" }), 0);
    const lr = await chat(ng.url, longText("nglora-", 60), { maxTokens: 1, extra: { model: "sql-lora" } });
    assert.ok(
      lr.cachedTokens > 100,
      `adapter prompt: ${lr.worker} cached ${lr.cachedTokens} ${lr.status} ${lr.body.slice(0, 200)}`,
    );
  },
);

test(
  "nginx+njs: a DP engine is two targets; the prompt goes to the rank holding it, told by X-data-parallel-rank",
  { skip },
  async () => {
    await chat(`http://${dp.address}`, longText("ngdpA-", 200), {
      maxTokens: 2,
      headers: { "x-data-parallel-rank": "1" },
    });
    const st = (
      (await (await fetch(`http://${dp.address}/sim/stats`)).json()) as { ranks: { cached_blocks: number }[] }
    ).ranks;
    await waitFor(
      "rank 1 mirrored in nginx",
      async () => (await view(`${dp.address}/dp1`)).block_count === st[1].cached_blocks && st[1].cached_blocks > 10,
      15000,
    );
    assert.equal((await view(`${dp.address}/dp0`)).block_count, st[0].cached_blocks);
    const r = await chat(ng.url, longText("ngdpA-", 200), { maxTokens: 1 });
    assert.equal(r.status, 200, r.body);
    assert.equal(r.worker, "ngxdp/dp1", "served by the rank nginx picked and named in the header");
    assert.ok(r.cachedTokens > 100);
    // twice more: without the header the engine's round-robin would alternate ranks
    for (let i = 0; i < 2; i++)
      assert.equal((await chat(ng.url, longText("ngdpA-", 200), { maxTokens: 1 })).worker, "ngxdp/dp1");
    await sleep(100);
  },
);

test(
  "nginx restarted: the bridge's resync rebuilds every tier (GPU and CPU, exact counts) and the salted chain, then live batches follow on",
  { skip, timeout: 120000 },
  async () => {
    // The engine's tiers as the first test left them, and nginx in step with them.
    const s = await simStats(sim);
    assert.ok(s.cached_blocks > 50 && s.cpu_blocks === 40, JSON.stringify(s));
    const inStep = async (want: { cached_blocks: number; cpu_blocks: number; last_kv_seq: number | null }) => {
      const v = await view(sim.address).catch(() => null);
      return !!v && v.seq === want.last_kv_seq && v.tiers.GPU === want.cached_blocks && v.tiers.CPU === want.cpu_blocks;
    };
    await waitFor("nginx in step before the restart", () => inStep(s), 15000);
    // SIGTERM: a SIGKILLed master leaves its workers serving.
    await ng.proc.kill("SIGTERM");
    await waitFor("nginx gone", async () => !(await fetch(`${ng.url}/v1/admin/reservations`).catch(() => null)), 10000);
    // nginx back on the same port with empty shared dicts.
    const again = run(
      "nginx-again",
      n8!.bin,
      ["-p", ng.dir, "-c", path.join(ng.dir, "nginx.conf"), "-e", "stderr", "-g", "daemon off;"],
      { INFERA_PUSH_TOKEN: "test-token" },
    );
    ng.proc = again;
    await waitFor(
      "nginx answers",
      async () => !!(await fetch(`${ng.url}/v1/admin/reservations`).catch(() => null)),
      15000,
    );
    await waitFor(
      "resync: nginx holds the engine's GPU and CPU tiers again, at its last batch",
      () => inStep(s),
      20000,
    ).catch(async (e) => {
      throw new Error(
        `${(e as Error).message}: nginx ${JSON.stringify(await view(sim.address).catch(() => null))}, engine ${JSON.stringify(s)}`,
      );
    });
    // Not only the counts: the salted chain hashes as before (the salt travelled with the replay).
    const r = await chat(ng.url, longText("ngsalt-", 60), { maxTokens: 1, extra: { cache_salt: "tenant-a" } });
    assert.ok(r.cachedTokens > 100, `salted prompt after the resync: ${r.worker} cached ${r.cachedTokens}`);
    // Live batches after the resync apply on top (the sequence continues): more evictions to CPU.
    for (let i = 0; i < 2; i++) await chat(`http://${sim.address}`, longText(`ngpost${i}-`, 60), { maxTokens: 2 });
    const s2 = await simStats(sim);
    assert.ok((s2.last_kv_seq ?? 0) > (s.last_kv_seq ?? 0));
    await waitFor("live batches after the resync", () => inStep(s2), 15000);
  },
);

test(
  "nginx+njs: an SGLang DP engine gets the picked rank in the body (routed_dp_rank, via proxy_set_body), a client's own loses",
  { skip },
  async () => {
    const r0 = await chat(`http://${sg.address}`, longText("ngsg-", 200), {
      maxTokens: 2,
      extra: { routed_dp_rank: 1 },
    });
    assert.equal(r0.worker, "ngxsg/dp1");
    const st = (
      (await (await fetch(`http://${sg.address}/sim/stats`)).json()) as {
        ranks: { cached_blocks: number; requests: number }[];
      }
    ).ranks;
    await waitFor(
      "SGLang rank 1 mirrored in nginx",
      async () =>
        (await view(`${sg.address}/dp1`)).block_count === st[1].cached_blocks &&
        (await view(`${sg.address}/dp0`)).block_count === st[0].cached_blocks,
      15000,
    );
    // the SGLang sim ignores X-data-parallel-rank: only the body field can pin the rank; twice in a row
    for (let i = 0; i < 2; i++) {
      const r = await chat(ng.url, longText("ngsg-", 200), { maxTokens: 1, extra: { routed_dp_rank: 0 } });
      assert.equal(r.status, 200, r.body);
      assert.equal(r.worker, "ngxsg/dp1", `try ${i}`);
      assert.ok(r.cachedTokens > 100);
    }
    const st2 = ((await (await fetch(`http://${sg.address}/sim/stats`)).json()) as { ranks: { requests: number }[] })
      .ranks;
    assert.deepEqual(
      st2.map((x) => x.requests),
      [st[0].requests, st[1].requests + 2],
    );
  },
);

test(
  "a second nginx whose bridge starts after all the traffic ends with the same mirror as the one that saw everything (replay from 0), every tier",
  { skip, timeout: 60000 },
  async () => {
    const ng2 = await startNginx(n8!);
    const s = await simStats(sim);
    await startBridge(
      ["--workers", `${sim.address}@${sim.events}+tcp://127.0.0.1:${simReplay}`],
      `${ng2.url}/_infera/push`,
    );
    const v2 = async () =>
      (await (await fetch(`${ng2.url}/v1/admin/cache-view/${encodeURIComponent(sim.address)}`)).json()) as View;
    await waitFor(
      "late nginx at the engine's last batch",
      async () => (await v2().catch(() => null))?.seq === s.last_kv_seq,
      20000,
    );
    const late = await v2();
    const early = await view(sim.address);
    assert.deepEqual(late.tiers, early.tiers, "same counts per tier as the nginx that saw everything");
    assert.deepEqual([late.tiers.GPU, late.tiers.CPU], [s.cached_blocks, s.cpu_blocks]);
    // and the same blocks: the salted prompt hits there too
    const r = await chat(ng2.url, longText("ngsalt-", 60), { maxTokens: 1, extra: { cache_salt: "tenant-a" } });
    assert.equal(r.worker, "ngx");
    assert.ok(r.cachedTokens > 100, `late nginx: cached ${r.cachedTokens}`);
  },
);

test(
  "nginx+njs PD with a DP prefill engine: X-Infera-Prefill-Dp-Rank names the rank the pick scored, and that rank prefills",
  { skip, timeout: 90000 },
  async () => {
    const pre = await startSim(
      "ngxpre",
      ["--data-parallel-size", "2", "--time-scale", "20", "--served-model-name", "sim-model"],
      "prefill",
    );
    const dec = await startSim("ngxdec", ["--time-scale", "20", "--served-model-name", "sim-model"], "decode");
    const ng3 = await startNginx(n8!);
    await startBridge(
      ["--workers", `prefill=${pre.address}/dp=2@${pre.events},decode=${dec.address}@${dec.events}`],
      `${ng3.url}/_infera/push`,
    );
    await waitFor(
      "PD fleet in nginx",
      async () => ((await (await fetch(`${ng3.url}/v1/admin/workers`)).json()) as unknown[]).length === 3,
    );
    const post = async (base: string, seed: string, headers: Record<string, string> = {}) => {
      const r = await fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify({
          model: "sim-model",
          max_tokens: 2,
          messages: [{ role: "user", content: longText(seed, 200) }],
        }),
      });
      await r.text();
      return {
        status: r.status,
        rank: r.headers.get("x-sim-dp-rank"),
        prefillRank: r.headers.get("x-sim-prefill-dp-rank"),
        worker: r.headers.get("x-sim-worker"),
        cached: Number(r.headers.get("x-sim-cached-tokens") ?? 0),
      };
    };
    assert.equal((await post(`http://${pre.address}`, "ngpdP-", { "x-data-parallel-rank": "1" })).rank, "1");
    assert.equal((await post(`http://${pre.address}`, "ngpdQ-", { "x-data-parallel-rank": "0" })).rank, "0");
    const st = (
      (await (await fetch(`http://${pre.address}/sim/stats`)).json()) as {
        ranks: { cached_blocks: number; requests: number }[];
      }
    ).ranks;
    const pv = async (r: number) =>
      (await (
        await fetch(`${ng3.url}/v1/admin/cache-view/${encodeURIComponent(`${pre.address}/dp${r}`)}`)
      ).json()) as View;
    await waitFor(
      "prefill ranks mirrored in nginx",
      async () =>
        (await pv(0)).block_count === st[0].cached_blocks && (await pv(1)).block_count === st[1].cached_blocks,
      15000,
    );
    // twice each: the engine's own round-robin would alternate ranks
    for (const [seed, rank] of [
      ["ngpdP-", "1"],
      ["ngpdP-", "1"],
      ["ngpdQ-", "0"],
      ["ngpdQ-", "0"],
    ]) {
      const r = await post(ng3.url, seed);
      assert.equal(r.status, 200);
      assert.equal(r.worker, "ngxdec");
      assert.equal(r.prefillRank, rank, `${seed} prefilled on rank ${rank}`);
      assert.ok(r.cached > 100, `prefill hit: ${r.cached}`);
    }
    const st2 = ((await (await fetch(`http://${pre.address}/sim/stats`)).json()) as { ranks: { requests: number }[] })
      .ranks;
    assert.deepEqual(
      st2.map((x) => x.requests),
      [st[0].requests + 2, st[1].requests + 2],
    );
  },
);

test(
  "a 7,000-block KV event batch goes to nginx in parts of at most --bridge-push-max-blocks; a part lost on the way makes nginx answer gap, the bridge resyncs, and the mirror ends exact",
  { skip, timeout: 120000 },
  async () => {
    // One engine step for the whole prompt: its ~7,000 stored blocks are one KV event batch.
    const big = await startSim("ngxbig", [
      ...freeEngineArgs(20000),
      "--max-num-batched-tokens",
      "131072",
      "--served-model-name",
      "sim-model",
    ]);
    const ng4 = await startNginx(n8!);
    // Between the bridge and nginx: forwards everything, except that it swallows the third part of the
    // first batch cut into parts and answers it as nginx would have (a part lost after the bridge sent it).
    const parts: { seq: number; part: number; partOf: number; blocks: number; gap: unknown }[] = [];
    let swallowed = false;
    const proxy = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", async () => {
        const raw = Buffer.concat(chunks).toString();
        const b = raw ? (JSON.parse(raw) as Record<string, unknown>) : {};
        const cut = b.type === "events" && typeof b.partOf === "number";
        let blocks = 0;
        for (const ev of (b.events as { type: string; hashes?: string[] }[]) ?? [])
          if (ev.type === "BlockStored" || ev.type === "BlockRemoved") blocks += ev.hashes!.length;
        if (cut && !swallowed && b.part === 2) {
          swallowed = true;
          parts.push({ seq: b.seq as number, part: 2, partOf: b.partOf as number, blocks, gap: "lost" });
          res.writeHead(200, { "content-type": "application/json" });
          return res.end(JSON.stringify({ stored: blocks, gap: false, parts: true }));
        }
        try {
          const r = await fetch(`${ng4.url}${req.url}`, {
            method: req.method,
            headers: {
              "content-type": "application/json",
              "x-infera-push-token": String(req.headers["x-infera-push-token"] ?? ""),
            },
            body: req.method === "POST" ? raw : undefined,
          });
          const text = await r.text();
          if (cut)
            parts.push({
              seq: b.seq as number,
              part: b.part as number,
              partOf: b.partOf as number,
              blocks,
              gap: r.ok ? (JSON.parse(text) as { gap: unknown }).gap : r.status,
            });
          res.writeHead(r.status, { "content-type": r.headers.get("content-type") ?? "application/json" });
          res.end(text);
        } catch (e) {
          res.writeHead(502);
          res.end(String(e));
        }
      });
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", () => r()));
    const proxyUrl = `http://127.0.0.1:${(proxy.address() as { port: number }).port}`;
    try {
      const br = await startBridgeAt(`${big.address}@${big.events}`, `${proxyUrl}/_infera/push`, undefined, [
        "--bridge-push-max-blocks",
        "256",
        "--bridge-backoff-max-ms",
        "200",
      ]);
      const counts = async () => {
        const m = await (await fetch(`http://127.0.0.1:${br.adminPort}/metrics`)).text();
        const n = (re: RegExp) => Number(re.exec(m)?.[1] ?? 0);
        return {
          events: n(/^infera_bridge_pushes_total\{type="events",result="ok"\} (\d+)/m),
          resyncs: n(/^infera_bridge_resyncs_total (\d+)/m),
        };
      };
      const bigView = async () =>
        (await (await fetch(`${ng4.url}/v1/admin/cache-view/${encodeURIComponent(big.address)}`)).json()) as View;
      await waitFor("fleet in nginx", async () => (await bigView().catch(() => null))?.block_count === 0, 15000);
      await waitFor("bridge in sync", async () => (await counts()).resyncs >= 1, 15000);
      const before = await counts();
      // Two long prompts: the first batch loses a part on the way, the second goes through whole.
      for (const seed of ["ngbigA", "ngbigB"]) {
        assert.equal((await chat(`http://${big.address}`, textOfTokens(seed, 112000), { maxTokens: 1 })).status, 200);
        const s = await simStats(big);
        await waitFor(
          `nginx at the engine's last batch after ${seed}, every block`,
          async () => {
            const v = await bigView().catch(() => null);
            return (
              !!v && v.seq === s.last_kv_seq && v.block_count === s.cached_blocks && v.tiers.GPU === s.cached_blocks
            );
          },
          30000,
        ).catch(async (e) => {
          throw new Error(
            `${(e as Error).message}: nginx ${JSON.stringify(await bigView())}, engine ${JSON.stringify(s)}`,
          );
        });
      }
      const after = await counts();
      const s = await simStats(big);
      assert.ok(s.cached_blocks > 6000, `two 112k prompts on the engine: ${s.cached_blocks} blocks`);
      // Cut: no part over the bound, and one batch's parts are many pushes.
      assert.ok(parts.length > 0, "no batch was cut into parts");
      assert.ok(
        parts.every((p) => p.blocks <= 256),
        JSON.stringify(parts.filter((p) => p.blocks > 256)),
      );
      assert.ok(after.events - before.events >= 2 * 25, `events pushes: ${after.events - before.events}`);
      // The lost part: nginx took the part after it for a gap, and the bridge resynced.
      const lost = parts.findIndex((p) => p.gap === "lost");
      assert.ok(lost >= 0 && parts[lost + 1] && parts[lost + 1].part === 3, JSON.stringify(parts.slice(0, lost + 2)));
      assert.equal(parts[lost + 1].gap, true, "the part after the lost one is a gap");
      assert.ok(
        parts.slice(0, lost).every((p) => p.gap === false),
        "parts in order are no gap",
      );
      assert.ok(after.resyncs > before.resyncs, `resyncs ${before.resyncs} -> ${after.resyncs}`);
      // The second prompt's batch went through in parts with no gap.
      const second = parts.filter((p) => p.seq > parts[lost].seq);
      assert.ok(second.length >= 25 && second.every((p) => p.gap === false), JSON.stringify(second.slice(0, 3)));
    } finally {
      proxy.close();
    }
  },
);
