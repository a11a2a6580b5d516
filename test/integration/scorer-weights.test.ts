// A scorer's weight changes the cost and nothing else: what admission judges
// warm or cold and what EPP shedding sees as load come from the data stage
// (core/scheduling/data.ts), not from whichever scorers ran. Over the real
// ext_proc server, each case with the default weights and with the scorer
// that used to fill those fields switched off.
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
const doc = "alpha ".repeat(1500);

function send(f: ExtProcFixture, text: string, extra: Record<string, string> = {}) {
  const s = processStream(f.client);
  s.send(reqHeaders("/v1/chat/completions", "POST", false, extra));
  const headers = s.next();
  s.send(reqBody(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: text }] })));
  return { s, headers, answer: headers.then(() => s.next()) };
}

async function finish(s: ReturnType<typeof processStream>) {
  s.send(respHeaders());
  await s.next();
  s.send(respBody(true));
  await s.next();
}

/** Whether a prompt extending a cold one still prefilling is answered at once (warm) or waits for admission (cold). */
async function extendingTurnWaits(weights: string[]): Promise<boolean> {
  const f = await startExtProcFixture(["--workers", "127.0.0.1:7201", "--health-interval-ms", "0", ...weights]);
  try {
    const first = send(f, doc);
    assert.equal((await first.answer).response.case, "requestBody");
    // Same 1,500-token document plus a question: its prefix is in flight on the worker.
    const next = send(f, doc + " and one more question");
    let answered = false;
    void next.answer.then(() => (answered = true));
    for (let i = 0; i < 100 && !answered; i++) await sleep(10);
    const waited = !answered && f.app.admission.waiting() === 1;
    await finish(first.s);
    await next.answer;
    await finish(next.s);
    return waited;
  } finally {
    await f.close();
  }
}

test("admission: a turn extending a prompt in flight is warm, with or without the prefix-overlap scorer", async () => {
  assert.equal(await extendingTurnWaits([]), false, "default weights");
  assert.equal(await extendingTurnWaits(["--scorer-weights", "prefix-overlap=0"]), false, "prefix-overlap=0");
  // The cold control: the same second prompt with nothing shared does wait.
  const f = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7202",
    "--health-interval-ms",
    "0",
    "--scorer-weights",
    "prefix-overlap=0",
  ]);
  try {
    const first = send(f, doc);
    await first.answer;
    const other = send(f, "bravo ".repeat(1500));
    await sleep(300);
    assert.equal(f.app.admission.waiting(), 1, "an unrelated cold prompt waits");
    await finish(first.s);
    await other.answer;
    await finish(other.s);
  } finally {
    await f.close();
  }
});

/** The status a sheddable request gets while another request holds load on the only worker. */
async function shedStatus(weights: string[]): Promise<string> {
  const f = await startExtProcFixture([
    "--workers",
    "127.0.0.1:7203",
    "--health-interval-ms",
    "0",
    "--epp-shed-active-blocks",
    "1",
    "--epp-sheddable-objectives",
    "batch",
    "--prefill-admission-slots",
    "0",
    ...weights,
  ]);
  try {
    const busy = send(f, doc);
    await busy.answer;
    const batch = send(f, "a batch job", { "x-gateway-inference-objective": "batch" });
    const r = await batch.answer;
    const status =
      r.response.case === "immediateResponse" ? String(r.response.value.status?.code) : String(r.response.case);
    await finish(busy.s);
    return status;
  } finally {
    await f.close();
  }
}

test("EPP shedding sees the workers' load with or without the active-blocks or prefix-overlap scorer", async () => {
  assert.equal(await shedStatus([]), "429", "default weights");
  assert.equal(await shedStatus(["--scorer-weights", "active-blocks=0"]), "429", "active-blocks=0");
  assert.equal(await shedStatus(["--scorer-weights", "prefix-overlap=0,active-blocks=0"]), "429", "both off");
});
