// Objectives over the real ext_proc server: with the worker's prefill slot
// taken, a sheddable request is refused at once with 429 and Retry-After, a
// critical one waits and goes first, and untrusted headers change nothing.
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
const cold = (word: string) => `${word} `.repeat(1500);

function send(f: ExtProcFixture, text: string, extra: Record<string, string> = {}) {
  const s = processStream(f.client);
  s.send(reqHeaders("/v1/chat/completions", "POST", false, extra));
  const answer = s.next().then(() => {
    const sentAt = Date.now();
    s.send(reqBody(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] })));
    return s.next().then((r) => ({ r, sentAt, at: Date.now() }));
  });
  return { s, answer };
}

async function finish(s: ReturnType<typeof processStream>) {
  s.send(respHeaders());
  await s.next();
  s.send(respBody(true));
  await s.next();
}

const objective = (name: string, flow = "t") => ({
  "x-gateway-inference-objective": name,
  "x-gateway-inference-fairness-id": flow,
});
const ARGS = ["--workers", "127.0.0.1:7301", "--health-interval-ms", "0", "--objectives", "critical=100,batch=-1"];

test("saturated worker: sheddable gets 429 + Retry-After at once, critical waits and goes before standard", async () => {
  const f = await startExtProcFixture([...ARGS, "--objective-headers", "trust"]);
  try {
    const holder = send(f, cold("alpha"));
    assert.equal((await holder.answer).r.response.case, "requestBody");
    const standard = send(f, cold("bravo"));
    let standardAt = 0;
    void standard.answer.then((x) => (standardAt = x.at));
    for (let i = 0; i < 100 && f.app.admission.waiting() < 1; i++) await sleep(10);
    const critical = send(f, cold("charlie"), objective("critical"));
    let criticalAt = 0;
    void critical.answer.then((x) => (criticalAt = x.at));
    for (let i = 0; i < 100 && f.app.admission.waiting() < 2; i++) await sleep(10);
    const batch = send(f, cold("delta"), objective("batch"));
    const shed = await batch.answer;
    assert.equal(shed.r.response.case, "immediateResponse");
    const imm = shed.r.response.value as {
      status?: { code: number };
      headers?: { setHeaders: { header?: { key: string; rawValue: Uint8Array } }[] };
      body: Uint8Array;
    };
    assert.equal(imm.status?.code, 429);
    const hdr = Object.fromEntries(
      (imm.headers?.setHeaders ?? []).map((h) => [h.header!.key, Buffer.from(h.header!.rawValue).toString()]),
    );
    assert.equal(hdr["retry-after"], "1");
    assert.match(Buffer.from(imm.body).toString(), /"code":429/);
    assert.ok(shed.at - shed.sentAt < 200, `answered in ${shed.at - shed.sentAt} ms`);
    assert.equal(criticalAt + standardAt, 0, "both still wait for the slot");
    assert.match(await f.app.metrics.registry.metrics(), /infera_router_admission_waiting\{priority="100"\} 1/);
    // The holder's first token frees the slot: critical goes, standard waits for critical's.
    await finish(holder.s);
    await critical.answer;
    await sleep(100);
    assert.equal(standardAt, 0, "standard still waits behind critical");
    await finish(critical.s);
    await standard.answer;
    await finish(standard.s);
    const m = await f.app.metrics.registry.metrics();
    assert.match(m, /infera_router_shed_total\{priority="-1"\} 1/);
  } finally {
    await f.close();
  }
});

test("a sheddable request with a free slot is served; untrusted objective headers change nothing", async () => {
  const f = await startExtProcFixture([...ARGS]);
  try {
    const first = send(f, cold("echo"), objective("batch"));
    assert.equal((await first.answer).r.response.case, "requestBody", "a free slot: sheddable is not refused");
    // Headers ignored (the default): the batch objective waits like anyone else instead of a 429.
    const second = send(f, cold("foxtrot"), objective("batch"));
    for (let i = 0; i < 100 && f.app.admission.waiting() < 1; i++) await sleep(10);
    assert.equal(f.app.admission.waiting(), 1);
    assert.match(await f.app.metrics.registry.metrics(), /infera_router_admission_waiting\{priority="0"\} 1/);
    await finish(first.s);
    assert.equal((await second.answer).r.response.case, "requestBody");
    await finish(second.s);
  } finally {
    await f.close();
  }
});
