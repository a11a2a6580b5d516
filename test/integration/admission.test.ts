// Prefill admission over the real ext_proc server: a second cold prompt for a
// worker gets its routing answer only when the first one's response starts
// (its first token), warm prompts never wait, a stream that ends while waiting
// leaves nothing held, and the wait bound sends a request anyway.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import {
  ExtProcFixture,
  processStream,
  reqBody,
  reqHeaders,
  respBody,
  respHeaders,
  startExtProcFixture,
} from "../extproc-client";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = async (f: () => boolean) => {
  for (let i = 0; i < 200 && !f(); i++) await sleep(10);
  return f();
};
// ~1,500 tokens each, sharing nothing but the chat template's first tokens: cold on any worker.
const cold = (word: string) => `${word} `.repeat(1500);

/** Sends headers and body; resolves with the routing answer's time. */
async function route(f: ExtProcFixture, text: string) {
  const s = processStream(f.client);
  s.send(reqHeaders("/v1/chat/completions"));
  assert.equal((await s.next()).response.case, "requestHeaders");
  s.send(reqBody(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] })));
  const answered = s.next().then((r) => {
    assert.equal(r.response.case, "requestBody");
    return Date.now();
  });
  return { s, answered };
}

async function firstToken(s: ReturnType<typeof processStream>) {
  s.send(respHeaders());
  await s.next();
  s.send(respBody(false));
  await s.next();
}

async function finish(s: ReturnType<typeof processStream>) {
  s.send(respBody(true));
  await s.next();
}

test("a second cold prompt waits for the first one's first token; a warm one passes meanwhile", async () => {
  const f = await startExtProcFixture(["--workers", "127.0.0.1:7101", "--health-interval-ms", "0"]);
  try {
    const a = await route(f, cold("alpha"));
    await a.answered;
    const b = await route(f, cold("bravo"));
    let bAt = 0;
    void b.answered.then((t) => (bAt = t));
    assert.ok(await until(() => f.app.admission.waiting() === 1), "bravo waits at the router");
    const c = await route(f, "a short question");
    await c.answered; // warm: answered while bravo still waits
    assert.equal(bAt, 0);
    assert.equal(f.app.admission.waiting(), 1);
    await sleep(150);
    assert.equal(bAt, 0, "still waiting: alpha has not started its response");
    const released = Date.now();
    await firstToken(a.s);
    await b.answered;
    assert.ok(bAt >= released);
    assert.equal(f.app.admission.waiting(), 0);
    // bravo now holds the slot: a third cold prompt waits for bravo's first token, not alpha's end.
    const d = await route(f, cold("delta"));
    assert.ok(await until(() => f.app.admission.waiting() === 1));
    await finish(a.s);
    await sleep(50);
    assert.equal(f.app.admission.waiting(), 1);
    await firstToken(b.s);
    await d.answered;
    for (const s of [b.s, d.s]) await finish(s);
    await finish(c.s).catch(() => undefined);
    assert.ok(
      await until(() => f.app.router.openGuards() === 0 && f.app.admission.busy("127.0.0.1:7101") === 0),
      `guards ${f.app.router.openGuards()}`,
    );
    const metrics = await f.app.metrics.registry.metrics();
    assert.match(metrics, /infera_router_prefill_admission_wait_seconds_count 2/);
  } finally {
    await f.close();
  }
});

test("a stream cancelled while it waits leaves the queue and holds nothing; the next one takes its place", async () => {
  const f = await startExtProcFixture(["--workers", "127.0.0.1:7102", "--health-interval-ms", "0"]);
  try {
    const a = await route(f, cold("alpha"));
    await a.answered;
    const before = f.app.router.openGuards();
    const b = await route(f, cold("bravo"));
    void b.answered.catch(() => undefined);
    assert.ok(await until(() => f.app.admission.waiting() === 1));
    const bravo = f.app.router.openGuards() - before;
    assert.ok(bravo > 0, "a waiting request holds its pick's load");
    const c = await route(f, cold("charlie"));
    assert.ok(await until(() => f.app.admission.waiting() === 2));
    const guards = f.app.router.openGuards();
    b.s.call.cancel();
    assert.ok(
      await until(() => f.app.admission.waiting() === 1 && f.app.router.openGuards() === guards - bravo),
      "bravo's load went back and it left the queue",
    );
    await firstToken(a.s);
    await c.answered;
    await finish(a.s);
    await firstToken(c.s);
    await finish(c.s);
    assert.ok(await until(() => f.app.router.openGuards() === 0 && f.app.admission.waiting() === 0));
  } finally {
    await f.close();
  }
});

test("with --queue-ttl-ms 0 the wait bound sends a request past the limit, and round-robin never waits", async () => {
  const f = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7103",
    "--health-interval-ms",
    "0",
    "--prefill-admission-max-wait-ms",
    "200",
    "--queue-ttl-ms",
    "0",
  ]);
  try {
    const a = await route(f, cold("alpha"));
    const t0 = await a.answered;
    const b = await route(f, cold("bravo"));
    const t1 = await b.answered;
    assert.ok(t1 - t0 >= 180, `forced after ${t1 - t0} ms`);
    assert.match(await f.app.metrics.registry.metrics(), /infera_router_prefill_admission_forced_total 1/);
    for (const s of [a.s, b.s]) {
      await firstToken(s);
      await finish(s);
    }
    assert.ok(await until(() => f.app.router.openGuards() === 0 && f.app.admission.busy("127.0.0.1:7103") === 0));
  } finally {
    await f.close();
  }
  const rr = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7104",
    "--health-interval-ms",
    "0",
    "--router-policy",
    "round-robin",
  ]);
  try {
    const a = await route(rr, cold("alpha"));
    await a.answered;
    const b = await route(rr, cold("bravo"));
    await b.answered;
    assert.equal(rr.app.admission.waiting(), 0);
  } finally {
    await rr.close();
  }
});
