// Priority shedding through real nginx (the njs module, the same core rule as
// the Envoy path: core/admission.ts shedsAtOnce): while the worker's one
// prefill slot is taken by a slow cold prompt, a sheddable cold request gets
// 429 + Retry-After at once in the API's shape; critical and warm requests
// are routed at once (njs never queues); untrusted objective headers shed
// nothing.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  nginx08,
  startSim,
  startNginx,
  startBridge,
  workerArg,
  stopAll,
  waitFor,
  fatal,
  START_MS,
  freePort,
  httpOk,
  Sim,
} from "../harness";
import { needs } from "../tools";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
after(stopAll);

let trusted = "";
let holderSim: Sim;
let ignoredSim: Sim;
let ignored = "";

before(async () => {
  if (skip) return;
  // 1 ms per prefill token: a 1,500-word prompt holds the slot for about 1.5 s.
  const [a, b] = await Promise.all(["ns0", "ns1"].map((id) => startSim(id, ["--prefill-us-per-token", "1000"])));
  holderSim = a;
  ignoredSim = b;
  const up = async (sim: typeof a, vars: Record<string, string>) => {
    const ng = await startNginx(n8!, vars);
    const admin = await freePort();
    await startBridge(
      ["--workers", workerArg([sim]), "--admin-port", String(admin), "--health-interval-ms", "0"],
      `${ng.url}/_infera/push`,
    );
    await waitFor("bridge ready", () => httpOk(`http://127.0.0.1:${admin}/readyz`), 20000);
    // The bridge's readiness does not wait for its first fleet push to land:
    // a request sent before it got "the fleet is empty" (503) in a loaded CI run.
    await waitFor(
      "nginx knows the worker",
      async () => {
        const r = await fetch(`${ng.url}/v1/admin/workers`).catch(() => null);
        return !!r && r.status === 200 && ((await r.json()) as unknown[]).length === 1;
      },
      20000,
    );
    return ng.url;
  };
  [trusted, ignored] = await Promise.all([
    up(a, { objectives: '"critical=100,batch=-1"', objective_headers: "trust" }),
    up(b, { objectives: '"critical=100,batch=-1"' }),
  ]);
});

const chat = (url: string, content: string, objective?: string, p = "/v1/chat/completions", timeoutMs = 60000) => {
  const t0 = Date.now();
  return fetch(`${url}${p}`, {
    method: "POST",
    signal: AbortSignal.timeout(timeoutMs),
    headers: {
      "content-type": "application/json",
      ...(objective
        ? { "x-gateway-inference-objective": objective, "x-gateway-inference-fairness-id": "t", "x-slo-ttft-ms": "500" }
        : {}),
    },
    body: JSON.stringify({
      model: "m",
      max_tokens: 2,
      ...(p === "/v1/messages" ? {} : { stream: false }),
      messages: [{ role: "user", content }],
    }),
  }).then(async (r) => ({ status: r.status, headers: r.headers, body: await r.text(), ms: Date.now() - t0 }));
};

test("nginx: a sheddable cold request gets 429 + Retry-After while its worker's slot is taken", { skip }, async () => {
  let settled: { status: number; body: string } | null = null;
  const holder = chat(trusted, "alpha ".repeat(1500)).then((r) => (settled = r));
  // The holder is on its worker (nginx picked it and holds its slot) before the
  // sheddable one asks: a fixed pause lost that race when a cold nginx worker
  // first loaded its tokenizer on a loaded machine. Up to START_MS for that
  // first load; a holder answered before it was seen prefilling fails at once, with its answer.
  await waitFor(
    "the holder prefilling on its worker",
    async () => {
      if ((await holderSim.stats()).inflight > 0) return true;
      const done = settled as { status: number; body: string } | null;
      if (done)
        throw fatal(`the holder was answered before it was seen prefilling: ${done.status} ${done.body.slice(0, 300)}`);
      return false;
    },
    START_MS,
  );
  // The worker is paused while the sheddable ones ask, so the holder keeps the
  // slot however slow this machine is (a 1.5 s prefill once ended under them in CI).
  // A refusal never reaches the worker; a request let through would wait on the
  // paused worker and fail on its 5 s timeout.
  holderSim.proc.child.kill("SIGSTOP");
  try {
    for (const p of ["/v1/chat/completions", "/v1/messages"]) {
      const shed = await chat(trusted, "delta ".repeat(1500) + p, "batch", p, 5000);
      assert.equal(shed.status, 429, shed.body);
      assert.equal(shed.headers.get("retry-after"), "1");
      const j = JSON.parse(shed.body);
      if (p === "/v1/messages") assert.equal(j.error.type, "rate_limit_error");
      else assert.equal(j.error.code, 429);
      assert.ok(shed.ms < 1000, `refused in ${shed.ms} ms`);
    }
  } finally {
    holderSim.proc.child.kill("SIGCONT");
  }
  // Critical and warm go at once (njs does not queue); the holder is still prefilling.
  const [crit, warm] = await Promise.all([
    chat(trusted, "charlie ".repeat(1500), "critical"),
    chat(trusted, "hi", "batch"),
  ]);
  assert.equal(crit.status, 200, crit.body);
  assert.equal(warm.status, 200, warm.body);
  assert.equal((await holder).status, 200);
  // Every slot given back: the next sheddable cold request is served.
  const after = await chat(trusted, "echo ".repeat(1500), "batch");
  assert.equal(after.status, 200, after.body);
  const m = await (await fetch(`${trusted}/metrics`)).text();
  assert.match(m, /infera_router_shed_total\{priority="-1"\} 2/);
});

test("nginx: untrusted objective headers shed nothing", { skip }, async () => {
  const holder = chat(ignored, "alpha ".repeat(1500));
  // Asked while the holder is prefilling: a fixed pause could let it finish first and pass for nothing.
  await waitFor("the holder prefilling on its worker", async () => (await ignoredSim.stats()).inflight > 0, START_MS);
  const r = await chat(ignored, "delta ".repeat(1500), "batch");
  assert.equal(r.status, 200, r.body);
  assert.equal((await holder).status, 200);
});
