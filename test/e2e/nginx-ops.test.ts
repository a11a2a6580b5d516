// NGINX operations, each through real nginx + njs 0.8 and real simulators:
//  - a worker that refuses the connection: the request goes once to the pick's
//    second choice, and the load moves with it (released once, where it went);
//  - a worker that accepts and then says nothing (SIGSTOP): bounded like the
//    Envoy path (streamed: idle timeout; whole answers: the longer one), a 504
//    and no retry (the worker may have started it), load released;
//  - the README's command (`npm run nginx`) on this checkout serves a prompt
//    with a cache hit on the second call, a 40-deep tool schema included
//    (njs's own JSON.parse stops at 32), and clients get no x-infera-worker
//    unless $infera_response_worker_header is on.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { spawn } from "child_process";
import {
  ROOT,
  startSim,
  startNginx,
  startBridgeReady,
  needsNjs08,
  chat,
  openStream,
  longText,
  stopAll,
  waitFor,
  freePort,
  httpOk,
  Sim,
} from "../harness";

const { n8, skip } = needsNjs08();
after(stopAll);

async function pushFleet(url: string, workers: { id: string; address: string }[]): Promise<void> {
  const r = await fetch(`${url}/_infera/push`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-infera-push-token": "test-token" },
    body: JSON.stringify({
      type: "workers",
      pseq: Date.now() * 1000,
      workers: workers.map((w) => ({ ...w, role: "mixed", blockSize: 16 })),
    }),
  });
  assert.equal(r.status, 200, await r.text());
}

/** One Prometheus sample from nginx's /metrics (0 when absent). */
async function metric(url: string, name: string, labels = ""): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name + (labels ? `{${labels}}` : " ")));
  return line ? Number(line.split(" ").pop()) : 0;
}

async function openGuards(url: string): Promise<number> {
  return ((await (await fetch(`${url}/v1/admin/reservations`)).json()) as { open_guards: number }).open_guards;
}

async function post(url: string, body: unknown): Promise<{ status: number; headers: Headers; text: string }> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

test(
  "a worker that refuses the connection: each request retried once on the second choice, load moved and released once",
  { skip, timeout: 90000 },
  async () => {
    const live = await startSim("lv", ["--decode-ms-per-token", "5"]);
    const dead = `127.0.0.1:${await freePort()}`; // nothing listens here
    const ng = await startNginx(n8!, { response_worker_header: "on" });
    // A long answer held open on live: live carries load, so cold picks prefer the dead one.
    await pushFleet(ng.url, [{ id: "live", address: live.address }]);
    const held = await openStream(ng.url, longText("held", 1000), 4000);
    // Then the dead worker joins: still "healthy" as far as nginx knows (no bridge here).
    await pushFleet(ng.url, [
      { id: "dead", address: dead },
      { id: "live", address: live.address },
    ]);
    const blocksHeld = await metric(ng.url, "infera_router_active_blocks", 'worker="live"');
    assert.ok(blocksHeld > 0, "the held stream's blocks are booked on live");
    const guardsHeld = await openGuards(ng.url);

    for (let i = 0; i < 6; i++) {
      const stream = i % 2 === 1;
      const r = await fetch(`${ng.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          stream,
          max_tokens: 4,
          messages: [{ role: "user", content: longText(`cold${i}`, 120) }],
        }),
      });
      const text = await r.text();
      assert.equal(r.status, 200, `request ${i} (stream ${stream}): ${text.slice(0, 200)}`);
      assert.equal(r.headers.get("x-sim-worker"), live.id);
      assert.equal(r.headers.get("x-infera-worker"), "live", "the header names where it was served");
    }
    assert.equal(await metric(ng.url, "infera_router_failovers_total"), 6, "every one was picked for dead and moved");
    await new Promise((r) => setTimeout(r, 300)); // the last request's log phase
    // Moved and released exactly once: what remains is the held stream's load, on live; none on dead.
    assert.equal(await metric(ng.url, "infera_router_active_blocks", 'worker="live"'), blocksHeld);
    assert.equal(await metric(ng.url, "infera_router_active_blocks", 'worker="dead"'), 0);
    assert.equal(await openGuards(ng.url), guardsHeld);
    held.abort();
    await waitFor("the held stream's load released", async () => (await openGuards(ng.url)) === 0, 10000);
    assert.equal(await metric(ng.url, "infera_router_active_blocks", 'worker="live"'), 0);

    // No second choice (one worker, and it refuses): a JSON 502 in the API's shape, nothing held.
    await pushFleet(ng.url, [{ id: "dead", address: dead }]);
    const r = await post(ng.url, { model: "m", max_tokens: 2, messages: [{ role: "user", content: "hi" }] });
    assert.equal(r.status, 502);
    assert.equal(r.headers.get("retry-after"), "1");
    assert.equal((JSON.parse(r.text) as { error: { type: string } }).error.type, "upstream_error");
    // (released at nginx's log phase, which may run just after the client has the answer)
    await waitFor("the failed request's load released", async () => (await openGuards(ng.url)) === 0, 5000);
  },
);

test(
  "a worker stopped mid-request (SIGSTOP): streamed bounded by the stream idle timeout, whole answers by the longer one; 504, not retried",
  { skip, timeout: 90000 },
  async () => {
    const [stopped, live] = await Promise.all([startSim("st", []), startSim("lv2", ["--decode-ms-per-token", "5"])]);
    // Scaled down from the shipped 60 s / 540 s (Envoy's route idle timeouts).
    const ng = await startNginx(n8!, { stream_idle_timeout: "2s", answer_timeout: "4s" });
    await pushFleet(ng.url, [{ id: "live", address: live.address }]);
    const held = await openStream(ng.url, longText("held2", 1000), 4000); // live is loaded: picks go to "stopped"
    await pushFleet(ng.url, [
      { id: "stopped", address: stopped.address },
      { id: "live", address: live.address },
    ]);
    stopped.proc.child.kill("SIGSTOP");
    try {
      const timed = async (stream: boolean) => {
        const t0 = Date.now();
        const r = await post(ng.url, {
          model: "m",
          stream,
          max_tokens: 4,
          messages: [{ role: "user", content: longText(`stop${stream}`, 120) }],
        });
        return { ...r, ms: Date.now() - t0 };
      };
      const [s, w] = await Promise.all([timed(true), timed(false)]);
      assert.equal(s.status, 504, s.text.slice(0, 200));
      assert.equal(w.status, 504, w.text.slice(0, 200));
      assert.equal((JSON.parse(w.text) as { error: { type: string } }).error.type, "upstream_timeout");
      assert.ok(s.ms >= 1800 && s.ms < 3800, `streamed: ${s.ms} ms (idle timeout 2 s)`);
      assert.ok(w.ms >= 3800 && w.ms < 9000, `whole answer: ${w.ms} ms (timeout 4 s)`);
      assert.equal(
        await metric(ng.url, "infera_router_failovers_total"),
        0,
        "a request the worker took is not retried",
      );
    } finally {
      stopped.proc.child.kill("SIGCONT");
    }
    held.abort();
    await waitFor("every guard released", async () => (await openGuards(ng.url)) === 0, 10000);
  },
);

/** `npm run nginx -- ...` as the README says, from the checkout; returns the master's PID file and the log. */
async function npmNginx(port: number, prefix: string): Promise<{ log: () => string; stop: () => Promise<void> }> {
  const child = spawn("npm", ["run", "nginx", "--", "--port", String(port), "--prefix", prefix], {
    cwd: ROOT,
    env: { ...process.env, INFERA_PUSH_TOKEN: "test-token" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  child.stderr!.on("data", (d) => (out += d));
  const pidFile = path.join(prefix, "nginx.pid");
  const stop = async () => {
    // The master is the process the script exec'd: stop it by the PID it wrote.
    if (fs.existsSync(pidFile)) {
      const pid = Number(fs.readFileSync(pidFile, "utf8").trim());
      try {
        process.kill(pid, "SIGTERM");
      } catch {
        /* gone */
      }
    }
    if (child.exitCode === null && child.signalCode === null)
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          child.kill("SIGKILL");
          resolve();
        }, 5000);
        child.once("exit", () => {
          clearTimeout(t);
          resolve();
        });
      });
  };
  after(stop);
  await waitFor("npm run nginx", async () => {
    if (child.exitCode !== null) throw new Error(`npm run nginx exited ${child.exitCode}: ${out}`);
    return fs.existsSync(pidFile) && (await httpOk(`http://127.0.0.1:${port}/v1/admin/reservations`));
  });
  return { log: () => out, stop };
}

test(
  "npm run nginx as documented: a cache hit on the second call, a 40-deep tool schema routes, no x-infera-worker for clients",
  { skip, timeout: 120000 },
  async () => {
    const sims: Sim[] = await Promise.all(["r0", "r1"].map((id) => startSim(id, ["--decode-ms-per-token", "1"])));
    const port = await freePort();
    const prefix = fs.mkdtempSync(path.join(os.tmpdir(), "infera-npm-nginx-"));
    const ng = await npmNginx(port, prefix);
    const url = `http://127.0.0.1:${port}`;
    await startBridgeReady(sims, url);

    const prompt = longText("asdoc", 400);
    const first = await chat(url, prompt);
    assert.equal(first.status, 200, first.body.slice(0, 200));
    // The first call's blocks reach nginx as KV events through the bridge.
    await waitFor(
      "the first call's blocks mirrored",
      async () =>
        (await metric(
          url,
          "infera_router_mirror_blocks",
          `worker="${sims.find((s) => s.id === first.worker)!.address}"`,
        )) > 0,
      10000,
    );
    const second = await chat(url, prompt);
    assert.equal(second.status, 200);
    assert.equal(second.worker, first.worker, "the second call follows its cache");
    assert.ok(second.cachedTokens > 0, `cache hit: ${second.cachedTokens} cached tokens`);

    // A body 40 levels deep through its tool's parameters (njs's JSON.parse
    // refuses 32+; under the 64 of --max-json-depth): body, tools, tool and
    // function are 4, each schema level 2 (the object and its properties).
    let schema: unknown = true; // a boolean schema: anything
    for (let i = 0; i < 18; i++) schema = { type: "object", properties: { [`k${i}`]: schema } };
    const deep = {
      model: "m",
      max_tokens: 4,
      tools: [{ type: "function", function: { name: "deep", description: longText("tool", 200), parameters: schema } }],
      messages: [{ role: "user", content: longText("deepq", 100) }],
    };
    const mirrored = (id: string) =>
      metric(url, "infera_router_mirror_blocks", `worker="${sims.find((s) => s.id === id)!.address}"`);
    const before = Object.fromEntries(await Promise.all(sims.map(async (s) => [s.id, await mirrored(s.id)])));
    const depth = (v: unknown): number =>
      typeof v === "object" && v !== null ? 1 + Math.max(0, ...Object.values(v).map(depth)) : 0;
    assert.equal(depth(deep), 40);
    const d1 = await post(url, deep);
    assert.equal(d1.status, 200, d1.text.slice(0, 300));
    assert.equal(d1.headers.get("x-infera-worker"), null, "clients do not see the pick by default");
    const w1 = d1.headers.get("x-sim-worker")!;
    // Every block the engine holds is mirrored (not only the earlier calls' late events).
    await waitFor(
      "the deep request's blocks mirrored",
      async () => {
        const held = (await sims.find((s) => s.id === w1)!.stats()).cached_blocks;
        return (await mirrored(w1)) > before[w1] && (await mirrored(w1)) >= held;
      },
      10000,
    );
    const d2 = await post(url, deep);
    assert.equal(d2.status, 200);
    assert.equal(d2.headers.get("x-sim-worker"), w1, "the deep prompt follows its cache like any other");
    assert.ok(Number(d2.headers.get("x-sim-cached-tokens")) > 0, "and hits it");
    // The pick itself ran (a throw routes at random and logs it; njs's small stack once did for this body).
    assert.doesNotMatch(ng.log(), /pick failed|call stack|zone full/, "every pick ran");
    await ng.stop();
  },
);
