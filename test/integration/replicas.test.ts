// Router replicas sharing in-flight load (runtime/replicas.ts) through a real
// nats-server: holds on one replica count on the others for the same worker
// (mapped by worker id, whatever the local epoch key), releases undo them, a
// late replica converges from heartbeats, and a replica that goes silent has
// its load dropped within TTL + one heartbeat.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { connect, NatsConnection } from "nats";
import { memoryState } from "../../core/state/memory";
import { RouterState } from "../../core/state/types";
import { BlockHash, EpochKey } from "../../core/types";
import { ReplicaSync } from "../../runtime/replicas";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { startNats, stopAll, waitFor, sleep } from "../harness";
import { needs, binMissing } from "../tools";

const noNats = needs(binMissing("nats-server"));

const HB = 200;
const TTL = 600;
const conns: NatsConnection[] = [];
const syncs: ReplicaSync[] = [];
after(async () => {
  for (const s of syncs) await s.close().catch(() => undefined);
  for (const c of conns) if (!c.isClosed()) await c.close().catch(() => undefined);
  await stopAll();
});

const blocks = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag}${i}` as BlockHash);

interface Replica {
  state: RouterState;
  sync: ReplicaSync;
  nc: NatsConnection;
  ek(id: string): EpochKey;
}

async function replica(url: string, id: string, workers: string[], padFirst = 0): Promise<Replica> {
  const state = memoryState();
  // Different epoch numbering per replica: the wire must not depend on it.
  for (let i = 0; i < padFirst; i++)
    state.workers.add({ id: `pad${i}`, address: `127.0.0.1:${i + 1}`, blockSize: 16, role: "mixed" });
  for (const w of workers) state.workers.add({ id: w, address: w, blockSize: 16, role: "mixed" });
  const sync = new ReplicaSync(
    state.load,
    state.workers,
    { id, subject: "test.load", heartbeatMs: HB, ttlMs: TTL },
    () => undefined,
  );
  state.load = sync.ledger;
  const nc = await connect({ servers: url });
  conns.push(nc);
  syncs.push(sync);
  await sync.start(nc);
  return { state, sync, nc, ek: (w) => state.workers.get(w)!.epochKey };
}

test(
  "two replicas through nats-server: holds and releases converge, a silent replica's load expires",
  { skip: noNats },
  async () => {
    const nats = await startNats();
    const W = ["127.0.0.1:7001", "127.0.0.1:7002"];
    const a = await replica(nats.url, "A", W);
    const b = await replica(nats.url, "B", W, 3);
    assert.notEqual(a.ek(W[0]), b.ek(W[0]), "epoch keys differ between the replicas");

    const g1 = a.state.load.hold(a.ek(W[0]), blocks("x", 5), 0, 0);
    const g2 = a.state.load.hold(a.ek(W[1]), blocks("y", 3), 100, 1);
    // Its prefill still queued: the same blocks, booked as queued (the queued-shared scorer reads them).
    const g2q = a.state.load.hold(a.ek(W[1]), blocks("y", 3), 0, 0, 3);
    await waitFor(
      "B sees A's holds",
      async () =>
        b.state.load.activeBlocks(b.ek(W[0])) === 5 &&
        b.state.load.activeBlocks(b.ek(W[1])) === 3 &&
        b.state.load.pendingBlocks(b.ek(W[1])) === 3,
      3000,
    );
    assert.deepEqual(b.state.load.demand(b.ek(W[1])), { tokens: 100, requests: 1 });
    assert.deepEqual(b.state.load.queuedShared(blocks("y", 3), { [b.ek(W[1])]: 3 }), { [b.ek(W[1])]: 3 });
    assert.deepEqual(b.state.load.activePrefix(blocks("x", 7), [b.ek(W[0]), b.ek(W[1])]), { [b.ek(W[0])]: 5 });
    // Drain waits for this process's own requests, not for its peers'.
    assert.equal(b.state.load.openGuards(), 0);
    assert.equal(a.state.load.openGuards(), 3);

    // B's own hold on a shared prefix adds to A's view too; blocks count once per worker.
    const g3 = b.state.load.hold(b.ek(W[0]), blocks("x", 7), 0, 0);
    await waitFor("A sees B's hold", async () => a.state.load.activeBlocks(a.ek(W[0])) === 7, 3000);

    // A release by copy (the ext_proc server's releaseGuard) is recognised as the same guard.
    a.state.load.release({ ...g2, done: false });
    a.state.load.release({ ...g2q, done: false });
    a.state.load.release(g1);
    await waitFor(
      "B sees A's releases",
      async () => b.state.load.activeBlocks(b.ek(W[0])) === 7 && b.state.load.activeBlocks(b.ek(W[1])) === 0,
      3000,
    );
    assert.equal(b.state.load.pendingBlocks(b.ek(W[1])), 0);
    assert.deepEqual(b.state.load.queuedShared(blocks("y", 3), { [b.ek(W[1])]: 3 }), {});
    assert.deepEqual(b.state.load.demand(b.ek(W[1])), { tokens: 0, requests: 0 });

    // A newcomer converges from the heartbeats of replicas that were up before it.
    const g4 = a.state.load.hold(a.ek(W[1]), blocks("z", 4), 0, 0);
    const c = await replica(nats.url, "C", W, 1);
    await waitFor(
      "C converges from heartbeats",
      async () => c.state.load.activeBlocks(c.ek(W[0])) === 7 && c.state.load.activeBlocks(c.ek(W[1])) === 4,
      3000,
    );
    assert.equal(c.sync.remoteStats().peers, 2);

    // A dies without a word (its connection just stops): B and C drop its load within TTL + a heartbeat.
    await waitFor("B has A's g4", async () => b.state.load.activeBlocks(b.ek(W[1])) === 4, 3000);
    const t0 = Date.now();
    // Its timer keeps ticking but publishes nothing on a closed connection.
    await a.nc.close();
    await waitFor(
      "A's load expires on B and C",
      async () => b.state.load.activeBlocks(b.ek(W[1])) === 0 && c.state.load.activeBlocks(c.ek(W[1])) === 0,
      TTL + HB + 3000,
    );
    const took = Date.now() - t0;
    assert.ok(took <= TTL + HB + 400, `expired after ${took} ms (TTL ${TTL} + heartbeat ${HB})`);
    // The live replica's load stays: B's own hold, seen by C.
    assert.equal(c.state.load.activeBlocks(c.ek(W[0])), 7);
    assert.equal(b.sync.remoteStats().peers, 1);
    void g4;

    // A clean shutdown says bye: peers drop at once, not after the TTL.
    b.state.load.release(g3);
    const g5 = b.state.load.hold(b.ek(W[0]), blocks("w", 2), 0, 0);
    await waitFor("C sees g5", async () => c.state.load.activeBlocks(c.ek(W[0])) === 2, 3000);
    const t1 = Date.now();
    await b.sync.close();
    await waitFor("bye drops B's load", async () => c.state.load.activeBlocks(c.ek(W[0])) === 0, 2000);
    assert.ok(Date.now() - t1 < TTL, "dropped on bye, before the TTL");
    void g5;
  },
);

test("a turn's holds over NATS's max_payload go out in several messages", { skip: noNats }, async () => {
  const nats = await startNats();
  const W = ["127.0.0.1:7001"];
  const a = await replica(nats.url, "A3", W);
  const b = await replica(nats.url, "B3", W);
  // 5 x 15,000 blocks (a 240k-token prompt each) in one event-loop turn: ~1.5 MB of ops.
  for (let i = 0; i < 5; i++) a.state.load.hold(a.ek(W[0]), blocks(`hash${i}-0000000`, 15000), 0, 0);
  await waitFor("B holds all of it", async () => b.state.load.activeBlocks(b.ek(W[0])) === 75000, 5000);
});

test("remote load on a worker this replica learns about later is applied when it joins", { skip: noNats }, async () => {
  const nats = await startNats();
  const a = await replica(nats.url, "A2", ["127.0.0.1:7001", "127.0.0.1:7009"]);
  const b = await replica(nats.url, "B2", ["127.0.0.1:7001"]);
  a.state.load.hold(a.ek("127.0.0.1:7009"), blocks("q", 6), 0, 0);
  await waitFor("B holds it as unknown", async () => b.sync.remoteStats().unknown === 1, 3000);
  b.state.workers.add({ id: "127.0.0.1:7009", address: "127.0.0.1:7009", blockSize: 16, role: "mixed" });
  await waitFor("applied after the join", async () => b.state.load.activeBlocks(b.ek("127.0.0.1:7009")) === 6, 3000);
  assert.equal(b.sync.remoteStats().unknown, 0);
});

test("replica flags: off by default, TTL must outlast a heartbeat, metrics registered", async () => {
  const o = parseArgs(["--workers", "127.0.0.1:1"], {});
  assert.equal(o.replica.sync, "off");
  assert.equal(o.replica.subject, "infera.load");
  assert.throws(
    () =>
      parseArgs(
        [
          "--workers",
          "127.0.0.1:1",
          "--replica-sync",
          "nats",
          "--replica-heartbeat-ms",
          "1000",
          "--replica-ttl-ms",
          "800",
        ],
        {},
      ),
    /--replica-ttl-ms/,
  );
  const app = new App(
    parseArgs(
      ["--workers", "127.0.0.1:1", "--replica-sync", "nats", "--replica-id", "r1", "--health-interval-ms", "0"],
      {},
    ),
    () => undefined,
    { subscribe: () => ({ close() {} }), close: async () => undefined },
  );
  assert.ok(app.replicas);
  assert.equal(app.replicas!.opts.id, "r1");
  const text = await app.metrics.registry.metrics();
  assert.match(text, /infera_router_replica_peers 0/);
  assert.match(text, /infera_router_replica_remote_guards\{state="applied"\} 0/);
  await sleep(0);
});
