// Issue 12 with an SGLang-style publisher over real ZMQ: the simulator in
// --engine sglang mode speaks SGLang's ZmqEventPublisher (its event structs,
// attn_dp_rank, a publisher per attention-DP rank on port + rank, the same
// ROUTER replay as vLLM, no snapshot, no epoch). A router that starts after
// its workers ends with the same per-rank mirrors as one that saw it all.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { freePortRun, waitFor, sleep, startSim, stopAll, chat, longText } from "../harness";

const opened: { close(): Promise<void> }[] = [];
after(async () => {
  for (const o of opened) await o.close().catch(() => undefined);
});

type RankStats = { cached_blocks: number; cpu_blocks: number; requests: number; promptTokens: number };

test("SGLang publisher (its event structs, attn_dp_rank, port + rank, replay ROUTER): a router started after its workers ends with the same per-rank mirrors as one that saw everything; a rank restart is detected by the sequence reset", async () => {
  const rp = await freePortRun(2);
  // SGLang has no snapshot endpoint: its ZmqEventPublisher keeps the last buffer_steps batches for
  // the same ROUTER replay protocol as vLLM's, per attention-DP rank on replay port + rank.
  const sim = await startSim("kvsg", [
    "--engine",
    "sglang",
    "--data-parallel-size",
    "2",
    "--kv-replay-port",
    String(rp),
    "--time-scale",
    "20",
    "--capacity-blocks",
    "80",
  ]);
  try {
    const mk = () => {
      const a = new App(
        parseArgs(
          ["--workers", `${sim.address}/dp=2/sglang@${sim.events}+tcp://127.0.0.1:${rp}`, "--health-interval-ms", "0"],
          {},
        ),
        () => undefined,
      );
      a.setWorkers(a.opts.workers);
      opened.push({ close: () => a.close() });
      return a;
    };
    const ek = (a: App, r: number) => a.router.worker(`${sim.address}/dp${r}`)!.epochKey;
    const ranks = async () =>
      (
        (await (await fetch(`http://${sim.address}/sim/stats`)).json()) as {
          ranks: (RankStats & { last_kv_seq: number | null })[];
        }
      ).ranks;
    const sameAsEngine = async (a: App) => {
      const st = await ranks();
      return [0, 1].every(
        (r) =>
          a.state.mirror.count(ek(a, r)) === st[r].cached_blocks &&
          a.state.mirror.sequence(ek(a, r)) === (st[r].last_kv_seq ?? undefined),
      );
    };
    const early = mk();
    await sleep(400);
    // 6 distinct prompts a rank of ~56 blocks each into 80 blocks: both ranks store and evict
    // (BlockRemoved); one batch a step with events, so at least one a prompt.
    for (let i = 0; i < 12; i++)
      assert.equal(
        (
          await chat(`http://${sim.address}`, longText(`sg${i}-`, 100), {
            maxTokens: 2,
            extra: { routed_dp_rank: i % 2 },
          })
        ).status,
        200,
      );
    const st = await ranks();
    for (const r of st)
      assert.ok(r.cached_blocks > 40 && r.promptTokens / 16 > 2 * 80 && (r.last_kv_seq ?? 0) >= 5, JSON.stringify(st));
    await waitFor("early per-rank mirrors = engine ranks", () => sameAsEngine(early), 20000);
    const late = mk();
    await waitFor("late per-rank mirrors = engine ranks (from replay)", () => sameAsEngine(late), 20000);
    for (const r of [0, 1])
      assert.equal(
        late.state.mirror.entries(ek(late, r)),
        early.state.mirror.entries(ek(early, r)),
        `rank ${r}: same engine blocks`,
      );
    const body = (seed: string) =>
      Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: longText(seed, 100) }] }));
    for (const seed of ["sg10-", "sg11-"]) {
      const pe = early.route("chat", body(seed), null);
      const pl = late.route("chat", body(seed), null);
      assert.deepEqual(
        [pl.target.id, pl.candidates.map((c) => c.hits)],
        [pe.target.id, pe.candidates.map((c) => c.hits)],
        seed,
      );
      assert.ok(Math.max(...pe.candidates.map((c) => c.hits)) > 10);
      pe.reservation.finish();
      pl.reservation.finish();
    }
    // Rank 1's engine restarts (SGLang: a new process, sequence from 0, no epoch in the topic):
    // both routers see the sequence go back, drop rank 1's mirror and follow the new stream.
    assert.equal(
      await (await fetch(`http://${sim.address}/sim/restart?rank=1`, { method: "POST" })).text(),
      "restarted",
    );
    await chat(`http://${sim.address}`, longText("sgafter-", 100), { maxTokens: 2, extra: { routed_dp_rank: 1 } });
    const st2 = await ranks();
    assert.equal(st2[0].cached_blocks, st[0].cached_blocks, "rank 0 untouched");
    assert.ok(st2[1].cached_blocks > 0 && st2[1].cached_blocks < st[1].cached_blocks);
    for (const a of [early, late])
      await waitFor("mirrors = engine ranks after rank 1 restarted", () => sameAsEngine(a), 20000);
    for (const a of [early, late]) assert.match(await a.metrics.registry.metrics(), /reason="engine_restart"\} [1-9]/);
  } finally {
    await stopAll();
  }
});

test('SGLang salted tenant over real ZMQ (simulator --engine sglang: BlockStoredWithMetadata {cache_salt}): the tenant\'s repeat hits, no adapter "[object Object]", other tenants and unsalted prompts miss', async () => {
  const sim = await startSim("kvsalt", ["--engine", "sglang", "--time-scale", "20"]);
  try {
    const a = new App(
      parseArgs(["--workers", `${sim.address}/sglang@${sim.events}`, "--health-interval-ms", "0"], {}),
      () => undefined,
    );
    a.setWorkers(a.opts.workers);
    opened.push({ close: () => a.close() });
    const ek = a.router.worker(sim.address)!.epochKey;
    await sleep(400);
    const text = longText("salted-", 100);
    assert.equal(
      (await chat(`http://${sim.address}`, text, { maxTokens: 2, extra: { cache_salt: "tenant-a" } })).status,
      200,
    );
    const st = (await (await fetch(`http://${sim.address}/sim/stats`)).json()) as {
      cached_blocks: number;
      last_kv_seq: number | null;
    };
    assert.ok(st.cached_blocks > 10, JSON.stringify(st));
    await waitFor(
      "mirror = engine",
      async () =>
        a.state.mirror.count(ek) === st.cached_blocks && a.state.mirror.sequence(ek) === (st.last_kv_seq ?? undefined),
      20000,
    );
    const hits = (salt: string | null) => {
      const body = Buffer.from(
        JSON.stringify({
          model: "m",
          messages: [{ role: "user", content: text }],
          ...(salt ? { cache_salt: salt } : {}),
        }),
      );
      const p = a.route("chat", body, null);
      p.reservation.finish();
      return Math.max(...p.candidates.map((c) => c.hits));
    };
    assert.ok(hits("tenant-a") >= st.cached_blocks - 2, `tenant-a hits ${hits("tenant-a")} of ${st.cached_blocks}`);
    assert.equal(hits("tenant-b"), 0);
    assert.equal(hits(null), 0);
    assert.equal(a.state.mirror.meta("*" as never, "lora:[object Object]"), undefined);
    assert.doesNotMatch(await a.metrics.registry.metrics(), /reason="malformed"\} [1-9]/);
    // And the engine agrees: the same salted prompt is served from its cache.
    const again = await chat(`http://${sim.address}`, text, { maxTokens: 2, extra: { cache_salt: "tenant-a" } });
    assert.ok(again.cachedTokens > 0, `engine cached ${again.cachedTokens}`);
  } finally {
    await stopAll();
  }
});

test("SGLang snapshot resync over real ZMQ (simulator --engine sglang --kv-snapshot-port): a gap replay cannot fill keeps the blocks the engine still holds instead of wiping the mirror", async () => {
  const { freePort } = await import("../harness");
  const sp = await freePort();
  const sim = await startSim("kvsnap", [
    "--engine",
    "sglang",
    "--kv-snapshot-port",
    String(sp),
    "--time-scale",
    "20",
    "--capacity-blocks",
    "2000",
  ]);
  try {
    const lines: string[] = [];
    // No replay endpoint ("++"): only the snapshot can repair a gap.
    const a = new App(
      parseArgs(
        ["--workers", `${sim.address}/sglang@${sim.events}++tcp://127.0.0.1:${sp}`, "--health-interval-ms", "0"],
        {},
      ),
      (l, m) => lines.push(`${l} ${m}`),
    );
    a.setWorkers(a.opts.workers);
    opened.push({ close: () => a.close() });
    assert.equal(a.router.worker(sim.address)!.snapshot, `tcp://127.0.0.1:${sp}`);
    const ek = a.router.worker(sim.address)!.epochKey;
    const stats = async () =>
      (await (await fetch(`http://${sim.address}/sim/stats`)).json()) as {
        cached_blocks: number;
        last_kv_seq: number | null;
      };
    const synced = async () => {
      const st = await stats();
      return a.state.mirror.sequence(ek) === (st.last_kv_seq ?? undefined);
    };
    const hits = (seed: string) => {
      const p = a.route(
        "chat",
        Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: longText(seed, 100) }] })),
        null,
      );
      p.reservation.finish();
      return Math.max(...p.candidates.map((c) => c.hits));
    };
    await sleep(400);
    assert.equal((await chat(`http://${sim.address}`, longText("keep-", 100), { maxTokens: 2 })).status, 200);
    await waitFor("mirror has the first prompt", synced, 20000);
    const kept = hits("keep-");
    assert.ok(kept > 10, `first prompt hits ${kept}`);
    // The next batches never reach the subscriber (and there is no replay buffer to ask).
    assert.equal(
      await (await fetch(`http://${sim.address}/sim/drop-events?n=1000`, { method: "POST" })).text(),
      "dropping",
    );
    assert.equal((await chat(`http://${sim.address}`, longText("missed-", 100), { maxTokens: 2 })).status, 200);
    assert.equal(
      await (await fetch(`http://${sim.address}/sim/drop-events?n=0`, { method: "POST" })).text(),
      "dropping",
    );
    assert.equal((await chat(`http://${sim.address}`, longText("after-", 100), { maxTokens: 2 })).status, 200);
    await waitFor(
      "resynced and caught up",
      async () => /type="snapshot_resync"\} 1/.test(await a.metrics.registry.metrics()) && (await synced()),
      20000,
    );
    assert.equal(hits("keep-"), kept, "blocks stored before the gap and still held survive");
    assert.ok(hits("after-") > 10, "the live batch held during the resync is applied");
    assert.equal(hits("missed-"), 0, "blocks stored during the gap carry no tokens in the snapshot: left out");
    const st = await stats();
    const missedBlocks = st.cached_blocks - a.state.mirror.count(ek);
    assert.ok(
      missedBlocks > 10 && missedBlocks < st.cached_blocks / 2,
      `engine ${st.cached_blocks}, mirror ${a.state.mirror.count(ek)}`,
    );
    const m = await a.metrics.registry.metrics();
    assert.doesNotMatch(m, /reason="sequence_gap"\} [1-9]/, "no wipe");
    assert.match(m, new RegExp(`reason="snapshot_unknown_block"\\} ${missedBlocks}`));
    assert.ok(
      lines.some((l) => /resynced from its snapshot at seq=\d+: \d+ mirrored block\(s\) kept/.test(l)),
      lines.join("\n"),
    );
  } finally {
    await stopAll();
  }
});
