// Issue 26 item 4 and the health parts of item 6, against real processes on
// 127.0.0.1 (etcd, simulators, the router and the bridge as started in
// production): SIGTERM ends the process within --drain-timeout-s plus a few
// seconds whatever discovery is doing, and a second SIGTERM at once;
// readiness means "can route"; a dropped KV event stream probes its worker at once.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as grpc from "@grpc/grpc-js";
import { startEtcd, startSim, startRouter, startBridge, run, stopAll, waitFor, sleep, fatal, freePort, workerArg, Proc, TSX } from "../harness";

const hasEtcd = spawnSync("sh", ["-c", "command -v etcd"]).status === 0;
const skipEtcd = hasEtcd ? false : "etcd not installed";
after(stopAll);

/** Resolves with the exit code and when the process exited; rejects past ms. */
function exited(p: Proc, ms: number): Promise<{ code: number | null; at: number }> {
  return new Promise((resolve, reject) => {
    if (p.child.exitCode !== null) return resolve({ code: p.child.exitCode, at: Date.now() });
    const t = setTimeout(() => reject(new Error(`${p.name} still running ${ms} ms later:\n${p.log().slice(-2000)}`)), ms);
    p.child.once("exit", (code) => {
      clearTimeout(t);
      resolve({ code, at: Date.now() });
    });
  });
}

/** grpc.health.v1.Health/Check, encoded by hand: 1 SERVING, 2 NOT_SERVING. */
function healthCheck(port: number, service: string): Promise<number> {
  const c = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const enc = (s: string) => Buffer.concat([Buffer.from([0x0a, Buffer.byteLength(s)]), Buffer.from(s)]);
  return new Promise((resolve, reject) =>
    c.makeUnaryRequest("/grpc.health.v1.Health/Check", enc, (b: Buffer) => (b.length >= 2 && b[0] === 0x08 ? b[1] : 0), service, { deadline: Date.now() + 3000 }, (err, v) => {
      c.close();
      if (err) reject(err);
      else resolve(v as number);
    }),
  );
}

const readyz = async (admin: string) => {
  const r = await fetch(`${admin}/readyz`, { signal: AbortSignal.timeout(3000) });
  return { status: r.status, body: (await r.json()) as { status: string; degraded?: string[]; checks: Record<string, { ok: boolean; detail: string }> } };
};

const DRAIN_S = 2;

async function etcdRouter(extra: string[] = []) {
  const etcd = await startEtcd();
  const sim = await startSim("l0", ["--etcd-endpoint", etcd.endpoint]);
  const router = await startRouter(["--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, "--health-interval-ms", "300", "--router-tokenizer-path", "none", "--drain-timeout-s", String(DRAIN_S), "--log-format", "text", ...extra]);
  await waitFor("router ready on the etcd fleet", async () => (await readyz(router.admin)).status === 200, 20000);
  return { etcd, sim, router };
}

async function etcdBridge() {
  const etcd = await startEtcd();
  const sim = await startSim("lb0", ["--etcd-endpoint", etcd.endpoint]);
  // No nginx: the bridge backs off on its pushes; shutdown must not wait for them either.
  const bridge = await startBridge(["--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, "--log-format", "text", "--bridge-backoff-max-ms", "500"], `http://127.0.0.1:${await freePort()}/_infera/push`);
  await waitFor("bridge watching etcd", async () => {
    if (bridge.child.exitCode !== null) throw fatal(`bridge exited: ${bridge.log()}`);
    return /etcd: watching/.test(bridge.log());
  }, 20000);
  return { etcd, sim, bridge };
}

test("SIGTERM with etcd discovery: the router exits 0 within --drain-timeout-s + 5 s", { skip: skipEtcd, timeout: 90000 }, async () => {
  const { router } = await etcdRouter();
  const t0 = Date.now();
  router.proc.child.kill("SIGTERM");
  const r = await exited(router.proc, (DRAIN_S + 5) * 1000);
  assert.equal(r.code, 0, router.proc.log().slice(-1500));
  assert.ok(r.at - t0 < (DRAIN_S + 5) * 1000, `exit after ${r.at - t0} ms`);
  assert.match(router.proc.log(), /drained/);
});

test("SIGTERM with etcd discovery: the bridge exits 0 within 5 s", { skip: skipEtcd, timeout: 90000 }, async () => {
  const { bridge } = await etcdBridge();
  const t0 = Date.now();
  bridge.child.kill("SIGTERM");
  const r = await exited(bridge, 5000);
  assert.equal(r.code, 0, bridge.log().slice(-1500));
  assert.ok(r.at - t0 < 5000, `exit after ${r.at - t0} ms`);
});

test("SIGTERM while etcd hangs (paused): still bounded; a second SIGTERM exits the router and the bridge at once", { skip: skipEtcd, timeout: 120000 }, async () => {
  // The router: etcd paused, one SIGTERM. Its watch cancel is never answered; the deadline ends it.
  {
    const { etcd, router } = await etcdRouter();
    etcd.proc.child.kill("SIGSTOP");
    try {
      const t0 = Date.now();
      router.proc.child.kill("SIGTERM");
      const r = await exited(router.proc, (DRAIN_S + 5) * 1000);
      assert.ok(r.at - t0 < (DRAIN_S + 5) * 1000, `exit after ${r.at - t0} ms`);
    } finally {
      etcd.proc.child.kill("SIGCONT");
    }
  }
  // Second SIGTERM, router and bridge: the first is stuck on the paused etcd, the second ends it.
  for (const which of ["router", "bridge"]) {
    const s = which === "router" ? await etcdRouter(["--drain-timeout-s", "30"]) : await etcdBridge();
    const p = "router" in s ? s.router.proc : s.bridge;
    // With a 30 s drain the router waits on an open ext_proc stream; the bridge on the paused etcd.
    let hold: grpc.ClientDuplexStream<Buffer, Buffer> | null = null;
    let client: grpc.Client | null = null;
    if ("router" in s) {
      client = new grpc.Client(`127.0.0.1:${s.router.grpcPort}`, grpc.credentials.createInsecure());
      hold = client.makeBidiStreamRequest("/envoy.service.ext_proc.v3.ExternalProcessor/Process", (b: Buffer) => b, (b: Buffer) => b);
      hold!.on("error", () => undefined);
      await sleep(300);
    }
    s.etcd.proc.child.kill("SIGSTOP");
    try {
      p.child.kill("SIGTERM");
      await sleep(500);
      assert.equal(p.child.exitCode, null, `${which} is still shutting down when the second SIGTERM comes`);
      const t1 = Date.now();
      p.child.kill("SIGTERM");
      const r = await exited(p, 3000);
      assert.ok(r.at - t1 < 3000, `${which} exit ${r.at - t1} ms after the second SIGTERM`);
      assert.notEqual(r.code, 0, "a forced exit is not a clean one");
      assert.match(p.log(), /second SIGTERM: exiting now/);
    } finally {
      s.etcd.proc.child.kill("SIGCONT");
      hold?.cancel();
      client?.close();
    }
  }
});
