// Issue 26 item 4 and the health parts of item 6, against real processes on
// 127.0.0.1 (etcd, simulators, the router and the bridge as started in
// production): SIGTERM ends the process within --drain-timeout-s plus a few
// seconds whatever discovery is doing, and a second SIGTERM at once;
// readiness means "can route"; a dropped KV event stream probes its worker at once.
import { needs } from "../tools";
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as grpc from "@grpc/grpc-js";
import * as fs from "fs";
import * as path from "path";
import {
  startEtcd,
  startSim,
  startRouter,
  startBridge,
  startNginx,
  nginx08,
  stopAll,
  waitFor,
  sleep,
  fatal,
  freePort,
  workerArg,
  Proc,
  ROOT,
} from "../harness";
import { processStream, reqBody, reqHeaders } from "../extproc-client";

const hasEtcd = spawnSync("sh", ["-c", "command -v etcd"]).status === 0;
const skipEtcd = needs(!hasEtcd && "etcd not installed");
const skipNginx = !nginx08()
  ? needs("njs >= 0.8 not set up (bash scripts/njs08.sh)")
  : !fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"))
    ? "run npm run build:njs"
    : false;
after(stopAll);

/** Resolves with the exit code and when the process exited; rejects past ms. */
function exited(p: Proc, ms: number): Promise<{ code: number | null; at: number }> {
  return new Promise((resolve, reject) => {
    if (p.child.exitCode !== null) return resolve({ code: p.child.exitCode, at: Date.now() });
    const t = setTimeout(
      () => reject(new Error(`${p.name} still running ${ms} ms later:\n${p.log().slice(-2000)}`)),
      ms,
    );
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
    c.makeUnaryRequest(
      "/grpc.health.v1.Health/Check",
      enc,
      (b: Buffer) => (b.length >= 2 && b[0] === 0x08 ? b[1] : 0),
      service,
      { deadline: Date.now() + 3000 },
      (err, v) => {
        c.close();
        if (err) reject(err);
        else resolve(v as number);
      },
    ),
  );
}

/** One chat request through the router's ext_proc port, as Envoy sends it: the picked upstream, or the router's own answer. */
async function route(client: grpc.Client): Promise<{ upstream?: string; status?: number; body?: string }> {
  const s = processStream(client);
  try {
    s.send(reqHeaders("/v1/chat/completions"));
    await s.next();
    s.send(reqBody(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hello" }] })));
    const r = await s.next();
    if (r.response.case === "immediateResponse") {
      const v = r.response.value as { status: { code: number }; body: Uint8Array };
      return { status: v.status.code, body: Buffer.from(v.body).toString() };
    }
    const v = r.response.value as {
      response?: { headerMutation?: { setHeaders: { header: { key: string; rawValue: Uint8Array } }[] } };
    };
    const h = v.response?.headerMutation?.setHeaders.find((x) => x.header.key === "x-infera-upstream");
    return h ? { upstream: Buffer.from(h.header.rawValue).toString() } : { body: r.response.case };
  } finally {
    s.call.cancel();
  }
}

const readyz = async (admin: string) => {
  const r = await fetch(`${admin}/readyz`, { signal: AbortSignal.timeout(3000) });
  return {
    status: r.status,
    body: (await r.json()) as {
      status: string;
      degraded?: string[];
      checks: Record<string, { ok: boolean; detail: string }>;
    },
  };
};

const DRAIN_S = 2;

async function etcdRouter(extra: string[] = []) {
  const etcd = await startEtcd();
  const sim = await startSim("l0", ["--etcd-endpoint", etcd.endpoint]);
  const router = await startRouter([
    "--discovery-backend",
    "etcd",
    "--etcd-endpoint",
    etcd.endpoint,
    "--health-interval-ms",
    "300",
    "--router-tokenizer-path",
    "none",
    "--drain-timeout-s",
    String(DRAIN_S),
    "--log-format",
    "text",
    ...extra,
  ]);
  await waitFor("router ready on the etcd fleet", async () => (await readyz(router.admin)).status === 200, 20000);
  return { etcd, sim, router };
}

async function etcdBridge() {
  const etcd = await startEtcd();
  const sim = await startSim("lb0", ["--etcd-endpoint", etcd.endpoint]);
  // No nginx: the bridge backs off on its pushes; shutdown must not wait for them either.
  const bridge = await startBridge(
    [
      "--discovery-backend",
      "etcd",
      "--etcd-endpoint",
      etcd.endpoint,
      "--log-format",
      "text",
      "--bridge-backoff-max-ms",
      "500",
    ],
    `http://127.0.0.1:${await freePort()}/_infera/push`,
  );
  await waitFor(
    "bridge watching etcd",
    async () => {
      if (bridge.child.exitCode !== null) throw fatal(`bridge exited: ${bridge.log()}`);
      return /etcd: watching/.test(bridge.log());
    },
    20000,
  );
  return { etcd, sim, bridge };
}

test(
  "SIGTERM with etcd discovery: the router exits 0 within --drain-timeout-s + 5 s",
  { skip: skipEtcd, timeout: 90000 },
  async (t) => {
    const { router } = await etcdRouter();
    const t0 = Date.now();
    router.proc.child.kill("SIGTERM");
    const r = await exited(router.proc, (DRAIN_S + 5) * 1000);
    assert.equal(r.code, 0, router.proc.log().slice(-1500));
    assert.ok(r.at - t0 < (DRAIN_S + 5) * 1000, `exit after ${r.at - t0} ms`);
    assert.match(router.proc.log(), /drained/);
    t.diagnostic(`router exit ${r.at - t0} ms after SIGTERM`);
  },
);

test("SIGTERM with etcd discovery: the bridge exits 0 within 5 s", { skip: skipEtcd, timeout: 90000 }, async (t) => {
  const { bridge } = await etcdBridge();
  const t0 = Date.now();
  bridge.child.kill("SIGTERM");
  const r = await exited(bridge, 5000);
  assert.equal(r.code, 0, bridge.log().slice(-1500));
  assert.ok(r.at - t0 < 5000, `exit after ${r.at - t0} ms`);
  t.diagnostic(`bridge exit ${r.at - t0} ms after SIGTERM`);
});

test(
  "SIGTERM while etcd hangs (paused): still bounded; a second SIGTERM exits the router and the bridge at once",
  { skip: skipEtcd, timeout: 120000 },
  async (t) => {
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
    // Second SIGTERM, router and bridge: the first is stuck (the router on an open
    // ext_proc stream under a 30 s drain, the bridge on its watch cancel to the
    // paused etcd), the second ends it. The bridge is held only if the etcd
    // client counts its watch stream as up when etcd pauses: it settles a cancel
    // at once on a stream it counts as down. One CI run saw the bridge's first
    // shutdown finish within 500 ms, so such an attempt is reported and set up
    // afresh, at most 3 bridge attempts; the second-signal assertions are the same.
    let bridgeTries = 0;
    for (const which of ["router", "bridge", "bridge", "bridge"]) {
      if (which === "bridge" && bridgeTries < 0) break;
      const s = which === "router" ? await etcdRouter(["--drain-timeout-s", "30"]) : await etcdBridge();
      const p = "router" in s ? s.router.proc : s.bridge;
      let hold: grpc.ClientDuplexStream<Buffer, Buffer> | null = null;
      let client: grpc.Client | null = null;
      if ("router" in s) {
        client = new grpc.Client(`127.0.0.1:${s.router.grpcPort}`, grpc.credentials.createInsecure());
        hold = client.makeBidiStreamRequest(
          "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
          (b: Buffer) => b,
          (b: Buffer) => b,
        );
        hold!.on("error", () => undefined);
        await sleep(300);
      }
      s.etcd.proc.child.kill("SIGSTOP");
      try {
        p.child.kill("SIGTERM");
        await sleep(500);
        if (which === "bridge" && p.child.exitCode !== null) {
          bridgeTries++;
          t.diagnostic(
            `bridge attempt ${bridgeTries}: its first shutdown ended (exit ${p.child.exitCode}) before the second SIGTERM; log: ${p.log().slice(-1200)}`,
          );
          assert.ok(bridgeTries < 3, "in 3 attempts the paused etcd never held the bridge's first shutdown");
          continue;
        }
        assert.equal(p.child.exitCode, null, `${which} is still shutting down when the second SIGTERM comes`);
        const t1 = Date.now();
        p.child.kill("SIGTERM");
        const r = await exited(p, 3000);
        assert.ok(r.at - t1 < 3000, `${which} exit ${r.at - t1} ms after the second SIGTERM`);
        assert.notEqual(r.code, 0, "a forced exit is not a clean one");
        assert.match(p.log(), /second SIGTERM: exiting now/);
        if (which === "bridge") bridgeTries = -1;
      } finally {
        s.etcd.proc.child.kill("SIGCONT");
        hold?.cancel();
        client?.close();
      }
    }
    assert.equal(bridgeTries, -1, "the bridge's second SIGTERM was tested");
  },
);

test(
  "not ready before a worker has passed a health check: /readyz and gRPC Check, then ready once it answers",
  { timeout: 90000 },
  async () => {
    const sim = await startSim("p0");
    // A frozen engine: its port accepts connections, /health never answers.
    sim.proc.child.kill("SIGSTOP");
    try {
      const router = await startRouter([
        "--workers",
        workerArg([sim]),
        "--health-interval-ms",
        "3000",
        "--router-tokenizer-path",
        "none",
        "--log-format",
        "text",
      ]);
      const t0 = Date.now();
      while (Date.now() - t0 < 4000) {
        const r = await readyz(router.admin);
        assert.equal(
          r.status,
          503,
          `ready before any health check passed (${Date.now() - t0} ms after start): ${JSON.stringify(r.body)}`,
        );
        assert.match(r.body.checks.workers.detail, /not yet through a health check|0 routable/);
        assert.equal(
          await healthCheck(router.grpcPort, "readiness"),
          2,
          "gRPC readiness SERVING before any health check passed",
        );
        assert.equal(await healthCheck(router.grpcPort, "envoy.service.ext_proc.v3.ExternalProcessor"), 2);
        await sleep(250);
      }
      sim.proc.child.kill("SIGCONT");
      await waitFor(
        "ready once the worker answers its health check",
        async () => (await readyz(router.admin)).status === 200,
        15000,
      );
      assert.equal(await healthCheck(router.grpcPort, "readiness"), 1);
    } finally {
      sim.proc.child.kill("SIGCONT");
    }
  },
);

test(
  "etcd outage: /readyz and gRPC readiness stay ready (degraded: discovery) and routing goes on on the cached fleet",
  { skip: skipEtcd, timeout: 90000 },
  async () => {
    const { etcd, sim, router } = await etcdRouter();
    const client = new grpc.Client(`127.0.0.1:${router.grpcPort}`, grpc.credentials.createInsecure());
    const pick = async () => {
      const r = await route(client);
      return r.upstream ?? `no pick: ${r.status} ${r.body}`;
    };
    try {
      assert.equal(await pick(), sim.address);
      // Stop only the etcd this test started.
      await etcd.proc.kill("SIGKILL");
      // Longer than the shipped probe's 2 s x 2.
      const t0 = Date.now();
      let sawDegraded = false;
      while (Date.now() - t0 < 7000) {
        const r = await readyz(router.admin);
        assert.equal(r.status, 200, `not ready during the etcd outage while it can route: ${JSON.stringify(r.body)}`);
        if (r.body.degraded?.includes("discovery") && !r.body.checks.discovery.ok) sawDegraded = true;
        assert.equal(await healthCheck(router.grpcPort, "readiness"), 1, "gRPC readiness during the etcd outage");
        assert.equal(await pick(), sim.address, "routing on the cached fleet");
        await sleep(500);
      }
      assert.ok(sawDegraded, "the body reports discovery degraded");
    } finally {
      client.close();
    }
  },
);

test(
  "a dropped KV event stream probes its worker at once: a killed engine is out of the pool well within a 10 s health interval",
  { timeout: 90000 },
  async (t) => {
    const sims = await Promise.all(["e0", "e1"].map((id) => startSim(id)));
    const router = await startRouter([
      "--workers",
      workerArg(sims),
      "--health-interval-ms",
      "10000",
      "--router-tokenizer-path",
      "none",
      "--log-format",
      "text",
    ]);
    await waitFor(
      "ready with both workers",
      async () =>
        (await readyz(router.admin)).status === 200 &&
        /2 of 2 streams up/.test((await readyz(router.admin)).body.checks.events.detail),
      15000,
    );
    const healthy = async (id: string) =>
      ((await router.workers()) as unknown as { id: string; healthy: boolean }[]).find((w) => w.id === id)?.healthy;
    assert.equal(await healthy(sims[1].address), true);
    const t0 = Date.now();
    await sims[1].proc.kill("SIGKILL");
    await waitFor("the killed worker marked unhealthy", async () => (await healthy(sims[1].address)) === false, 3000);
    const took = Date.now() - t0;
    assert.ok(took < 3000, `out of the pool after ${took} ms`);
    t.diagnostic(`killed worker out of the pool ${took} ms after SIGKILL`);
    assert.equal(await healthy(sims[0].address), true, "the live worker stays in");
  },
);

test(
  "the router's own 503s say what happened: no worker yet, an empty fleet, no healthy worker",
  { skip: skipEtcd, timeout: 90000 },
  async () => {
    const base = ["--router-tokenizer-path", "none", "--log-format", "text"];
    const answer = async (r: { grpcPort: number }) => {
      const client = new grpc.Client(`127.0.0.1:${r.grpcPort}`, grpc.credentials.createInsecure());
      try {
        return await route(client);
      } finally {
        client.close();
      }
    };
    const message = (body?: string) =>
      (JSON.parse(body ?? "{}") as { error?: { message?: string } }).error?.message ?? `not an error body: ${body}`;
    // Discovery has not delivered the fleet (etcd not there): "not yet".
    const early = await startRouter([
      "--discovery-backend",
      "etcd",
      "--etcd-endpoint",
      `http://127.0.0.1:${await freePort()}`,
      ...base,
    ]);
    const a = await answer(early);
    assert.equal(a.status, 503);
    assert.match(message(a.body), /no worker yet \(discovery has not delivered the fleet\)/);
    // Discovery synced an empty fleet.
    const etcd = await startEtcd();
    const empty = await startRouter(["--discovery-backend", "etcd", "--etcd-endpoint", etcd.endpoint, ...base]);
    await waitFor("etcd discovery synced", async () => /etcd: watching/.test(empty.proc.log()), 15000);
    const b = await answer(empty);
    assert.equal(b.status, 503);
    assert.match(message(b.body), /no worker yet \(the fleet is empty: discovery has found none\)/);
    // Every worker failed its health checks.
    const dead = `127.0.0.1:${await freePort()}`;
    const sick = await startRouter([
      "--workers",
      `${dead},127.0.0.1:${await freePort()}`,
      "--health-interval-ms",
      "200",
      ...base,
    ]);
    await waitFor(
      "both workers unhealthy",
      async () => ((await sick.workers()) as unknown as { healthy: boolean }[]).every((w) => !w.healthy),
      10000,
    );
    const c = await answer(sick);
    assert.equal(c.status, 503);
    assert.match(message(c.body), /no healthy worker \(all 2 failed their health checks\)/);
  },
);

test(
  "SIGTERM with k8s discovery (watches open): the router exits 0 within --drain-timeout-s + 5 s",
  { timeout: 90000 },
  async (t) => {
    const os = await import("os");
    const { startFakeApi, pod } = await import("../k8s-api");
    const api = await startFakeApi("llm");
    try {
      const sim = await startSim("k0");
      api.put("pods", pod("k0", "127.0.0.1", { labels: { app: "vllm" } }));
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-lc-k8s-"));
      const kubeconfig = path.join(dir, "kubeconfig");
      fs.writeFileSync(
        kubeconfig,
        `apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: '${api.url}', insecure-skip-tls-verify: true}}]\nusers: [{name: t, user: {token: test-token}}]\ncontexts: [{name: t, context: {cluster: t, user: t, namespace: llm}}]\ncurrent-context: t\n`,
      );
      const router = await startRouter([
        "--discovery-backend",
        "k8s",
        "--kubeconfig",
        kubeconfig,
        "--k8s-selector",
        "app=vllm",
        "--k8s-target-port",
        String(sim.port),
        "--router-tokenizer-path",
        "none",
        "--drain-timeout-s",
        String(DRAIN_S),
        "--log-format",
        "text",
      ]);
      await waitFor("router ready on the k8s fleet", async () => (await readyz(router.admin)).status === 200, 20000);
      const t0 = Date.now();
      router.proc.child.kill("SIGTERM");
      const r = await exited(router.proc, (DRAIN_S + 5) * 1000);
      assert.equal(r.code, 0, router.proc.log().slice(-1500));
      t.diagnostic(`router (k8s) exit ${r.at - t0} ms after SIGTERM`);
    } finally {
      await api.close();
    }
  },
);

test(
  "etcd outage: the bridge's /readyz stays ready (degraded: discovery) while it feeds nginx the cached fleet",
  { skip: skipEtcd || skipNginx, timeout: 90000 },
  async () => {
    const etcd = await startEtcd();
    await startSim("nb0", ["--etcd-endpoint", etcd.endpoint]);
    const ng = await startNginx(nginx08()!);
    const admin = await freePort();
    await startBridge(
      [
        "--discovery-backend",
        "etcd",
        "--etcd-endpoint",
        etcd.endpoint,
        "--admin-port",
        String(admin),
        "--log-format",
        "text",
      ],
      `${ng.url}/_infera/push`,
    );
    const bAdmin = `http://127.0.0.1:${admin}`;
    await waitFor(
      "bridge ready",
      async () => (await readyz(bAdmin).catch(() => ({ status: 0 }))).status === 200,
      20000,
    );
    await etcd.proc.kill("SIGKILL");
    const t0 = Date.now();
    let sawDegraded = false;
    while (Date.now() - t0 < 6000) {
      const r = await readyz(bAdmin);
      assert.equal(r.status, 200, `bridge not ready during the etcd outage: ${JSON.stringify(r.body)}`);
      if (r.body.degraded?.includes("discovery") && !r.body.checks.discovery.ok) sawDegraded = true;
      await sleep(500);
    }
    assert.ok(sawDegraded, "the bridge's body reports discovery degraded");
    const ws = (await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[];
    assert.equal(ws.length, 1, "nginx keeps the fleet");
  },
);
