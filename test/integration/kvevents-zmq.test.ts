// Issue 12 over real ZMQ: a vLLM-like publisher (PUB + replay ROUTER,
// sim/kvpublisher.ts) and the ext_proc app. Gaps are repaired from replay,
// a router that starts late ends with the same mirror as one that saw it all,
// a restart whose first batches were lost is detected, silence is flagged.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { App } from "../../extproc/app";
import { parseArgs } from "../../extproc/config";
import { KvPublisher, SimKvEvent } from "../../sim/kvpublisher";
import { freePort, waitFor, sleep, startSim, stopAll, chat, longText } from "../harness";
import { tierCounts } from "../../core/kvevents";

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
    { type: "BlockStored", block_hashes: h, parent_block_hash: null, token_ids: t, block_size: 16, lora_id: null, medium: "GPU", lora_name: null },
    { type: "BlockStored", block_hashes: [h[0]], parent_block_hash: null, token_ids: t.slice(0, 16), block_size: 16, lora_id: null, medium: "CPU", lora_name: null },
  ];
}

async function publisher(encoding: "map" | "array", ports?: { port: number; replayPort: number | null }): Promise<KvPublisher> {
  const p = new KvPublisher({ host: "127.0.0.1", port: ports?.port ?? (await freePort()), replayPort: ports ? ports.replayPort : await freePort(), topic: "kv", encoding, bufferSteps: 1000, dpRank: null });
  await p.bind();
  opened.push(p);
  return p;
}

function app(p: KvPublisher, replay: boolean, extra: string[] = []): App {
  const ev = `tcp://127.0.0.1:${p.o.port}` + (replay && p.o.replayPort !== null ? `+tcp://127.0.0.1:${p.o.replayPort}` : "");
  const a = new App(parseArgs(["--workers", `127.0.0.1:9@${ev}`, "--kv-event-topic", "kv", "--health-interval-ms", "0", "--kv-replay-timeout-ms", "1500", ...extra], {}), () => undefined);
  a.setWorkers(a.opts.workers);
  opened.push({ close: () => a.close() });
  return a;
}

const W = "127.0.0.1:9";
const view = (a: App) => {
  const w = a.router.worker(W)!;
  return tierCounts(a.state.mirror, w.epochKey);
};
const applied = async (a: App, seq: number) => waitFor(`seq ${seq} applied`, async () => a.state.mirror.sequence(a.router.worker(W)!.epochKey) === seq, 10000);

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
    assert.deepEqual(view(noReplay), { GPU: 8, CPU: 4, DISK: 0, EXTERNAL: 0 }, "without replay the gap wipes: batches 6-9 only");
    assert.match(await noReplay.metrics.registry.metrics(), /infera_router_kv_event_errors_total\{worker="127.0.0.1:9",reason="sequence_gap"\} 1/);
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
  assert.deepEqual(view(b), { GPU: 2, CPU: 1, DISK: 0, EXTERNAL: 0 }, "no replay: the reconnect drops the mirror, batch 5 remains");
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
  assert.match(m, /infera_router_kv_event_age_seconds\{worker="127.0.0.1:9"\} 0\.[4-9]|infera_router_kv_event_age_seconds\{worker="127.0.0.1:9"\} [1-9]/);
  await p.publish(batch(1));
  await applied(a, 1);
  assert.equal(a.eventStatus(W).kv_events_silent, false, "events flowing again clear the flag");
});

test("simulator e2e (tagged maps + replay ROUTER): a router started after traffic mirrors exactly what the engine caches, like one that saw everything", async () => {
  const rp = await freePort();
  const sim = await startSim("kvrep", ["--kv-replay-port", String(rp), "--kv-event-encoding", "map", "--time-scale", "20"]);
  try {
    const mk = () => {
      const a = new App(parseArgs(["--workers", `${sim.address}@${sim.events}+tcp://127.0.0.1:${rp}`, "--health-interval-ms", "0"], {}), () => undefined);
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
    await waitFor("early mirror = engine", async () => gpu(early) === engine, 10000);
    const late = mk();
    await waitFor("late mirror = engine", async () => gpu(late) === engine, 10000);
    // same blocks, not only the same count: every engine block maps to the same hash on both
    const ek = (a: App) => a.router.worker(sim.address)!.epochKey;
    const body = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: longText("kvrep1-", 300) }] }));
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
