// Testcontainers path: where a Docker engine exists, etcd and NATS run as
// containers and the router is exercised against them; elsewhere the test is
// skipped with the reason printed.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { startSim, startRouter, startEnvoy, startRelay, chat, longText, stopAll, waitFor, envoyBin } from "../harness";

let reason: string | false = false;
let tc: typeof import("testcontainers") | null = null;

before(async () => {
  try {
    tc = await import("testcontainers");
    await tc.getContainerRuntimeClient();
  } catch (e) {
    reason = `no Docker engine for Testcontainers (${(e as Error).message.split("\n")[0]})`;
  }
  if (!reason && !envoyBin()) reason = "envoy binary not found";
  if (reason) process.stdout.write(`# skipping Testcontainers e2e: ${reason}\n`);
});
after(stopAll);

test("etcd + NATS in containers: discovery and KV events through them", async (t) => {
  if (reason) return t.skip(reason);
  const etcd = await new tc!.GenericContainer("quay.io/coreos/etcd:v3.5.17")
    .withCommand([
      "etcd",
      "--listen-client-urls",
      "http://0.0.0.0:2379",
      "--advertise-client-urls",
      "http://127.0.0.1:2379",
    ])
    .withExposedPorts(2379)
    .start();
  const nats = await new tc!.GenericContainer("nats:2.10").withExposedPorts(4222).start();
  try {
    const etcdUrl = `http://127.0.0.1:${etcd.getMappedPort(2379)}`;
    const natsUrl = `nats://127.0.0.1:${nats.getMappedPort(4222)}`;
    const sims = [
      await startSim("c0", ["--etcd-endpoint", etcdUrl]),
      await startSim("c1", ["--etcd-endpoint", etcdUrl]),
    ];
    for (const s of sims) startRelay(s, natsUrl, `infera.kv.${s.id}`);
    const router = await startRouter([
      "--discovery-backend",
      "etcd",
      "--etcd-endpoint",
      etcdUrl,
      "--kv-event-transport",
      "nats",
      "--nats-url",
      natsUrl,
    ]);
    await waitFor("fleet", async () => (await router.workers()).length === 2, 20000);
    const envoy = await startEnvoy(router.grpcPort);
    const p = longText("containers", 300);
    const a = await chat(envoy.url, p);
    await waitFor("mirror", async () => (await router.cacheView(a.worker!)).block_count > 0, 10000);
    assert.equal((await chat(envoy.url, p)).worker, a.worker);
  } finally {
    await etcd.stop();
    await nats.stop();
  }
});
