// Issue 12 over real ZMQ: a vLLM-like publisher (PUB + replay ROUTER,
// sim/kvpublisher.ts) and the ext_proc app. Gaps are repaired from replay,
// a router that starts late ends with the same mirror as one that saw it all,
// a restart whose first batches were lost is detected, silence is flagged.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { KvPublisher, SimKvEvent } from "../../sim/kvpublisher";
import { freePort, freePortRun, waitFor, sleep, startSim, stopAll, chat, longText, startNats } from "../harness";
import { runRelay } from "../../cli/relay";
import { tierCounts } from "../../core/kvevents";
import { needs, binMissing } from "../tools";

const toks = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + i);
const opened: { close(): Promise<void> }[] = [];
after(async () => {
  for (const o of opened) await o.close().catch(() => undefined);
});

/** Batch i stores 2 GPU blocks of chain i and offloads its first block to CPU. */
function batch(i: number, base = 0): SimKvEvent[] {
  const t = toks(32, base + i * 1000);
  const h = [BigInt(base * 100 + i * 10 + 1), BigInt(base * 100 + i * 10 + 2)];
  return [
    {
      type: "BlockStored",
      block_hashes: h,
      parent_block_hash: null,
      token_ids: t,
      block_size: 16,
      lora_id: null,
      medium: "GPU",
      lora_name: null,
    },
    {
      type: "BlockStored",
      block_hashes: [h[0]],
      parent_block_hash: null,
      token_ids: t.slice(0, 16),
      block_size: 16,
      lora_id: null,
      medium: "CPU",
      lora_name: null,
    },
  ];
}

async function publisher(
  encoding: "map" | "array",
  ports?: { port: number; replayPort: number | null },
): Promise<KvPublisher> {
  const p = new KvPublisher({
    host: "127.0.0.1",
    port: ports?.port ?? (await freePort()),
    replayPort: ports ? ports.replayPort : await freePort(),
    topic: "kv",
    encoding,
    bufferSteps: 1000,
    dpRank: null,
  });
  await p.bind();
  opened.push(p);
  return p;
}

function app(p: KvPublisher, replay: boolean, extra: string[] = []): App {
  const ev =
    `tcp://127.0.0.1:${p.o.port}` + (replay && p.o.replayPort !== null ? `+tcp://127.0.0.1:${p.o.replayPort}` : "");
  const a = new App(
    parseArgs(
      [
        "--workers",
        `127.0.0.1:9@${ev}`,
        "--kv-event-topic",
        "kv",
        "--health-interval-ms",
        "0",
        "--kv-replay-timeout-ms",
        "1500",
        ...extra,
      ],
      {},
    ),
    () => undefined,
  );
  a.setWorkers(a.opts.workers);
  opened.push({ close: () => a.close() });
  return a;
}

const W = "127.0.0.1:9";
const view = (a: App) => {
  const w = a.router.worker(W)!;
  return tierCounts(a.state.mirror, w.epochKey);
};
const applied = async (a: App, seq: number) =>
  waitFor(`seq ${seq} applied`, async () => a.state.mirror.sequence(a.router.worker(W)!.epochKey) === seq, 20000);

for (const encoding of ["map", "array"] as const) {
  test(`${encoding}: a gap is repaired from replay, not wiped; a late router ends with the same mirror`, async () => {
    const p = await publisher(encoding);
    const early = app(p, true);
    const noReplay = app(p, false);
    await sleep(400); // ZMQ slow joiner
    for (let i = 0; i < 10; i++) await p.publish(batch(i), i !== 4 && i !== 5); // 4 and 5 never reach subscribers live
    await applied(early, 9);
    await applied(noReplay, 9);
    assert.deepEqual(view(early), { GPU: 20, CPU: 10, DISK: 0, EXTERNAL: 0 }, "every batch, 4 and 5 from replay");
    assert.deepEqual(
      view(noReplay),
      { GPU: 8, CPU: 4, DISK: 0, EXTERNAL: 0 },
      "without replay the gap wipes: batches 6-9 only",
    );
    assert.match(
      await noReplay.metrics.registry.metrics(),
      /infera_router_kv_event_errors_total\{worker="127.0.0.1:9",reason="sequence_gap"\} 1/,
    );
    assert.doesNotMatch(await early.metrics.registry.metrics(), /reason="sequence_gap"/);
    // a router that starts now asks for replay first
    const late = app(p, true);
    await applied(late, 9);
    await p.publish(batch(10));
    await applied(late, 10);
    await applied(early, 10);
    assert.deepEqual(view(late), view(early));
    assert.deepEqual(view(late), { GPU: 22, CPU: 11, DISK: 0, EXTERNAL: 0 });
  });
}

test("an engine restart whose first batches were lost lines up with the old sequence: detected by replay, not kept", async () => {
  const port = await freePort();
  const replayPort = await freePort();
  let p = await publisher("map", { port, replayPort });
  const a = app(p, true);
  const b = app(p, false);
  await sleep(400);
  for (let i = 0; i < 5; i++) await p.publish(batch(i));
  await applied(a, 4);
  await applied(b, 4);
  assert.equal(view(a).GPU, 10);
  await p.close();
  await sleep(300);
  // the new engine publishes seq 0..4 before anyone reconnects (lost), then 5: it looks continuous
  p = await publisher("map", { port, replayPort });
  for (let i = 0; i < 5; i++) await p.publish(batch(i, 50), false);
  await sleep(1800); // both subscribers reconnect (200 ms reconnect interval) and, with replay, verify
  await p.publish(batch(5, 50));
  await applied(a, 5);
  await applied(b, 5);
  assert.deepEqual(view(a), { GPU: 12, CPU: 6, DISK: 0, EXTERNAL: 0 }, "new engine's 6 batches, none of the old 5");
  assert.deepEqual(
    view(b),
    { GPU: 2, CPU: 1, DISK: 0, EXTERNAL: 0 },
    "no replay: the reconnect drops the mirror, batch 5 remains",
  );
  assert.match(await a.metrics.registry.metrics(), /reason="engine_restart"\} 1/);
});

test("unknown event types are skipped and counted; a silent events endpoint is flagged while serving traffic", async () => {
  const p = await publisher("array");
  const a = app(p, false, ["--kv-event-silence-s", "0.4"]);
  await sleep(400);
  await p.publish([{ type: "BlockMoved", block_hashes: [1] }, ...batch(0)]);
  await applied(a, 0);
  assert.equal(view(a).GPU, 2);
  assert.match(await a.metrics.registry.metrics(), /reason="unknown_event"\} 1/);
  // silent: picks keep coming, events do not
  assert.equal(a.eventStatus(W).kv_events_silent, false);
  a.route("completions", Buffer.from(JSON.stringify({ model: "m", prompt: "hello" })), null);
  await waitFor("flagged", async () => a.eventStatus(W).kv_events_silent, 5000);
  const m = await a.metrics.registry.metrics();
  assert.match(m, /infera_router_kv_events_silent\{worker="127.0.0.1:9"\} 1/);
  assert.match(
    m,
    /infera_router_kv_event_age_seconds\{worker="127.0.0.1:9"\} 0\.[4-9]|infera_router_kv_event_age_seconds\{worker="127.0.0.1:9"\} [1-9]/,
  );
  await p.publish(batch(1));
  await applied(a, 1);
  assert.equal(a.eventStatus(W).kv_events_silent, false, "events flowing again clear the flag");
});

test("simulator e2e (tagged maps + replay ROUTER): a router started after traffic mirrors exactly what the engine caches, like one that saw everything", async () => {
  const rp = await freePort();
  const sim = await startSim("kvrep", [
    "--kv-replay-port",
    String(rp),
    "--kv-event-encoding",
    "map",
    "--time-scale",
    "20",
  ]);
  try {
    const mk = () => {
      const a = new App(
        parseArgs(["--workers", `${sim.address}@${sim.events}+tcp://127.0.0.1:${rp}`, "--health-interval-ms", "0"], {}),
        () => undefined,
      );
      a.setWorkers(a.opts.workers);
      opened.push({ close: () => a.close() });
      return a;
    };
    const gpu = (a: App) => a.state.mirror.count(a.router.worker(sim.address)!.epochKey);
    const early = mk();
    await sleep(400);
    for (let i = 0; i < 6; i++) await chat(`http://${sim.address}`, longText(`kvrep${i % 3}-`, 300), { maxTokens: 4 });
    const engine = (await sim.stats()).cached_blocks;
    assert.ok(engine > 20, `engine cached ${engine} blocks`);
    await waitFor("early mirror = engine", async () => gpu(early) === engine, 20000);
    const late = mk();
    await waitFor("late mirror = engine", async () => gpu(late) === engine, 20000);
    // same blocks, not only the same count: every engine block maps to the same hash on both
    const ek = (a: App) => a.router.worker(sim.address)!.epochKey;
    const body = Buffer.from(
      JSON.stringify({ model: "m", messages: [{ role: "user", content: longText("kvrep1-", 300) }] }),
    );
    const pe = early.route("chat", body, null);
    const pl = late.route("chat", body, null);
    const he = pe.candidates[0].hits;
    assert.ok(he > 10, `hits ${he}`);
    assert.equal(pl.candidates[0].hits, he);
    pe.reservation.finish();
    pl.reservation.finish();
    assert.equal(early.state.mirror.entries(ek(early)), late.state.mirror.entries(ek(late)));
  } finally {
    await stopAll();
  }
});

test("tagged DP events on one socket: each rank's target mirrors only its batches, without false gaps", async () => {
  const p = await publisher("map");
  const a = new App(
    parseArgs(
      [
        "--workers",
        `127.0.0.1:9/dp=2/tagged@tcp://127.0.0.1:${p.o.port}+tcp://127.0.0.1:${p.o.replayPort}`,
        "--kv-event-topic",
        "kv",
        "--health-interval-ms",
        "0",
      ],
      {},
    ),
    () => undefined,
  );
  a.setWorkers(a.opts.workers);
  opened.push({ close: () => a.close() });
  await sleep(400);
  for (let i = 0; i < 6; i++) await p.publish(batch(i), true, i % 2);
  const t = (r: number) => a.router.worker(`127.0.0.1:9/dp${r}`)!.epochKey;
  await waitFor(
    "both ranks at seq 5",
    async () => a.state.mirror.sequence(t(0)) === 5 && a.state.mirror.sequence(t(1)) === 5,
    20000,
  );
  assert.deepEqual(
    [tierCounts(a.state.mirror, t(0)), tierCounts(a.state.mirror, t(1))],
    [
      { GPU: 6, CPU: 3, DISK: 0, EXTERNAL: 0 },
      { GPU: 6, CPU: 3, DISK: 0, EXTERNAL: 0 },
    ],
  );
  assert.doesNotMatch(await a.metrics.registry.metrics(), /sequence_gap/);
});

type RankStats = { cached_blocks: number; cpu_blocks: number; requests: number; last_kv_seq: number | null };

test("simulator with --data-parallel-size 2: two targets, events per rank port, the picked rank reaches the engine", async () => {
  const rp = await freePortRun(2);
  const sim = await startSim("kvdp", [
    "--data-parallel-size",
    "2",
    "--kv-replay-port",
    String(rp),
    "--kv-event-encoding",
    "map",
    "--time-scale",
    "20",
  ]);
  try {
    const a = new App(
      parseArgs(
        ["--workers", `${sim.address}/dp=2@${sim.events}+tcp://127.0.0.1:${rp}`, "--health-interval-ms", "0"],
        {},
      ),
      () => undefined,
    );
    a.setWorkers(a.opts.workers);
    opened.push({ close: () => a.close() });
    await sleep(400);
    const ranks = async () =>
      ((await (await fetch(`http://${sim.address}/sim/stats`)).json()) as { ranks: RankStats[] }).ranks;
    // prompt A cached on rank 0, prompt B on rank 1, through the engine's own header
    await chat(`http://${sim.address}`, longText("dpA-", 300), {
      maxTokens: 2,
      headers: { "x-data-parallel-rank": "0" },
    });
    await chat(`http://${sim.address}`, longText("dpB-", 300), {
      maxTokens: 2,
      headers: { "x-data-parallel-rank": "1" },
    });
    const st = await ranks();
    assert.ok(st[0].cached_blocks > 10 && st[1].cached_blocks > 10);
    const count = (r: number) => a.state.mirror.count(a.router.worker(`${sim.address}/dp${r}`)!.epochKey);
    await waitFor(
      "per-rank mirrors = per-rank engine caches",
      async () => count(0) === st[0].cached_blocks && count(1) === st[1].cached_blocks,
      20000,
    );
    const route = (seed: string) =>
      a.route(
        "chat",
        Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: longText(seed, 300) }] })),
        null,
      );
    const pa = route("dpA-");
    const pb = route("dpB-");
    assert.deepEqual([pa.target.dpRank, pb.target.dpRank], [0, 1], "each prompt goes to the rank holding it");
    pa.reservation.finish();
    pb.reservation.finish();
    // the header picks the rank that serves (what ext_proc and nginx send)
    const r = await fetch(`http://${sim.address}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-data-parallel-rank": "1" },
      body: JSON.stringify({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "hi" }] }),
    });
    await r.text();
    assert.equal(r.headers.get("x-sim-dp-rank"), "1");
  } finally {
    await stopAll();
  }
});

test("simulator tiers, second KV group, salts, LoRA names, restart: the router's mirror follows the engine exactly", async () => {
  const rp = await freePort();
  const sim = await startSim("kvx", [
    "--kv-replay-port",
    String(rp),
    "--kv-event-encoding",
    "array",
    "--time-scale",
    "20",
    "--capacity-blocks",
    "64",
    "--kv-cpu-blocks",
    "40",
    "--kv-sliding-window",
    "256",
    "--lora-modules",
    "sql-lora",
    "--served-model-name",
    "sim-model",
  ]);
  try {
    const a = new App(
      parseArgs(["--workers", `${sim.address}@${sim.events}+tcp://127.0.0.1:${rp}`, "--health-interval-ms", "0"], {}),
      () => undefined,
    );
    a.setWorkers(a.opts.workers);
    opened.push({ close: () => a.close() });
    await sleep(400);
    const ek = () => a.router.worker(sim.address)!.epochKey;
    const stats = async () => (await sim.stats()) as unknown as RankStats;
    // 6 prompts of ~33 blocks into 64 GPU blocks: evictions offload to CPU, CPU evicts past 40
    for (let i = 0; i < 6; i++)
      assert.equal((await chat(`http://${sim.address}`, longText(`tier${i}-`, 60), { maxTokens: 2 })).status, 200);
    let s = await stats();
    assert.equal(s.cpu_blocks, 40);
    // Full tiers keep their counts while blocks are swapped: wait for the engine's last batch, not only the counts.
    const atLast = async () => a.state.mirror.sequence(ek()) === ((await stats()).last_kv_seq ?? undefined);
    await waitFor(
      "GPU and CPU tiers = engine",
      async () => {
        const t = tierCounts(a.state.mirror, ek());
        return t.GPU === s.cached_blocks && t.CPU === 40 && (await atLast());
      },
      20000,
    );
    assert.match(
      await a.metrics.registry.metrics(),
      /infera_router_kv_events_total\{worker="[^"]+",type="other_group"\} [1-9]/,
    );
    // the oldest prompt is now only on CPU: a hit worth 0.75 per block
    const body = (seed: string, extra: Record<string, unknown> = {}) =>
      Buffer.from(
        JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: longText(seed, 60) }], ...extra }),
      );
    const hits = (seed: string, extra: Record<string, unknown> = {}) => {
      const p = a.route("chat", body(seed, extra), null);
      p.reservation.finish();
      return p.candidates[0].hits;
    };
    const h5 = hits("tier5-");
    assert.ok(h5 >= 10 && Number.isInteger(h5), `latest prompt on GPU: ${h5}`);
    // an older prompt offloaded to CPU scores 0.75 per block (default --kv-tier-weights)
    const weighted = [0, 1, 2, 3, 4].map((i) => hits(`tier${i}-`));
    const tw = a.opts.router.kvTierWeights;
    a.opts.router.kvTierWeights = { GPU: 1 };
    const gpuOnly = [0, 1, 2, 3, 4].map((i) => hits(`tier${i}-`));
    a.opts.router.kvTierWeights = tw;
    const extra = weighted.map((w, i) => w - gpuOnly[i]);
    assert.ok(
      extra.some((x) => x > 0 && x % 0.75 === 0),
      `CPU blocks add 0.75 each: weighted ${weighted}, GPU only ${gpuOnly}`,
    );
    // salts: the engine isolates them, the router too
    await chat(`http://${sim.address}`, longText("salted-", 60), { maxTokens: 2, extra: { cache_salt: "tenant-a" } });
    await waitFor(
      "salted blocks mirrored",
      async () => tierCounts(a.state.mirror, ek()).GPU === (await stats()).cached_blocks && (await atLast()),
      20000,
    );
    assert.ok(hits("salted-", { cache_salt: "tenant-a" }) >= 10);
    assert.equal(hits("salted-", { cache_salt: "tenant-b" }), 0);
    assert.equal(hits("salted-"), 0);
    // LoRA by name: the adapter's blocks match requests for the adapter only
    await chat(`http://${sim.address}`, longText("lora-", 60), { maxTokens: 2, extra: { model: "sql-lora" } });
    await waitFor(
      "adapter blocks mirrored",
      async () => tierCounts(a.state.mirror, ek()).GPU === (await stats()).cached_blocks && (await atLast()),
      20000,
    );
    assert.ok(hits("lora-", { model: "sql-lora" }) >= 10);
    assert.equal(hits("lora-"), 0);
    // restart: new event stream from seq 0, empty cache; the router drops the old mirror
    const r = await fetch(`http://${sim.address}/sim/restart`, { method: "POST" });
    assert.equal(await r.text(), "restarted");
    await chat(`http://${sim.address}`, longText("after-", 60), { maxTokens: 2 });
    s = await stats();
    await waitFor(
      "mirror = restarted engine",
      async () => {
        const t = tierCounts(a.state.mirror, ek());
        return t.GPU === s.cached_blocks && t.CPU === 0 && (await atLast());
      },
      20000,
    );
    assert.equal(hits("salted-", { cache_salt: "tenant-a" }), 0, "nothing from before the restart");
    assert.match(await a.metrics.registry.metrics(), /reason="engine_restart"\} [1-9]/);
  } finally {
    await stopAll();
  }
});

test(
  "NATS transport (relay): a gap the relay never saw is repaired from the engine's replay ROUTER; a late router catches up",
  { skip: needs(binMissing("nats-server")) },
  async () => {
    const nats = await startNats();
    const p = await publisher("map");
    // The relay matches the publisher's topic exactly, like the router.
    const relay = await runRelay(`tcp://127.0.0.1:${p.o.port}`, nats.url, "infera.kv.natsw", "kv");
    const apps: App[] = [];
    try {
      const mk = async () => {
        const o = parseArgs(
          [
            "--workers",
            `127.0.0.1:9@infera.kv.natsw+tcp://127.0.0.1:${p.o.replayPort}`,
            "--kv-event-transport",
            "nats",
            "--nats-url",
            nats.url,
            "--health-interval-ms",
            "0",
          ],
          {},
        );
        const a = await App.create(o, () => undefined);
        a.setWorkers(o.workers);
        apps.push(a);
        return a;
      };
      const early = await mk();
      await sleep(600);
      for (let i = 0; i < 8; i++) await p.publish(batch(i), i !== 3);
      await applied(early, 7);
      assert.deepEqual(view(early), { GPU: 16, CPU: 8, DISK: 0, EXTERNAL: 0 });
      const late = await mk();
      await applied(late, 7);
      assert.deepEqual(view(late), view(early));
    } finally {
      // NATS clients reconnect forever: close them before the server goes.
      for (const a of apps) await a.close();
      await relay.close();
      await stopAll();
    }
  },
);
