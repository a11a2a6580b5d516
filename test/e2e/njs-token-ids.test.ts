// --send-token-ids exact through real nginx (njs 0.8, one worker) and the
// bridge: the bridge probes each worker's render parity and pushes it with the
// fleet; the tokenizer helper builds the engine's body with the prompt's ids;
// njs sends it to a worker pushed as exact (a chat request on the engine's
// completions endpoint) and its body filter rewrites the answer back to the
// chat shape. The engine's x-sim-prompt-input says what it received and
// x-sim-prompt-digest digests the prompt ids it ran: equal on the ids and text
// sides, the engine computed the same prompt. A worker whose parity is not
// exact, and a request the completions endpoint cannot answer as chat
// (tools), get text. A worker behind a proxy that cuts the answer into 7-byte
// pieces checks that events cut anywhere come out whole; a refused connection
// is retried on the next exact worker, still as ids, with its load released once.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as http from "http";
import * as net from "net";
import { freePort, longText, needsNjs08, Sim, sleep, startSim, stopAll, waitFor, workerArg } from "../harness";
import { cachedOf, chunks, sendJson } from "../chat-answer";
import { NginxStack, startBridgeAt, startNginx1, mirrorSettled } from "../nginx-stack";

const { n8, skip } = needsNjs08();

interface Side {
  sims: Sim[];
  ng: NginxStack;
  admin: number;
}

/** Simulators, one-worker nginx pointed at the bridge's helper, and the bridge; ids: the flag on both. */
async function side(
  ids: string[],
  idsOn: boolean,
  simArgs: string[] = [],
  workers?: string,
  bridgeArgs: string[] = [],
  helperUrl?: string,
): Promise<Side> {
  const sims = await Promise.all(ids.map((id) => startSim(id, simArgs)));
  const port = await freePort();
  const vars: Record<string, string> = { tokenizer_url: helperUrl ?? `http://127.0.0.1:${port}/v1/tokenize` };
  if (idsOn) vars.send_token_ids = "exact";
  vars.response_worker_header = "on";
  const ng = await startNginx1(n8!, vars);
  await startBridgeAt(workers ?? workerArg(sims), `${ng.url}/_infera/push`, port, [
    "--send-token-ids",
    idsOn ? "exact" : "off",
    ...bridgeArgs,
  ]);
  const want = workers ? workers.split(",").length : sims.length;
  await waitFor(
    "fleet pushed" + (idsOn ? ", parity probed" : ""),
    async () => {
      const ws = (await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as {
        render_parity?: { status: string };
      }[];
      return (
        ws.length === want && (!idsOn || ws.every((w) => w.render_parity && w.render_parity.status !== "unchecked"))
      );
    },
    30000,
  );
  return { sims, ng, admin: port };
}

let ids: Side;
let text: Side;
let divergent: Side;

before(async () => {
  if (skip) return;
  ids = await side(["ni0"], true);
  text = await side(["nt0"], false);
  divergent = await side(["nd0"], true, ["--render-divergent"]);
});
after(stopAll);

const send = (s: Side, body: Record<string, unknown>, path?: string) => sendJson(s.ng.url, body, path);

const strip = (cs: Record<string, unknown>[]) => cs.map((c) => ({ choices: c.choices, usage: c.usage }));

async function nginxMetrics(s: Side): Promise<string> {
  return (await fetch(`${s.ng.url}/metrics`)).text();
}

test(
  "chat, whole: the engine gets ids, the client a chat.completion with the text path's text and cache hits",
  { skip, timeout: 120000 },
  async () => {
    const messages = [
      { role: "system", content: "You are terse. " + longText("nid-sys", 200) },
      { role: "user", content: "Summarise: " + longText("nid-doc", 300) },
    ];
    const req = { model: "m", max_tokens: 6, messages };
    const a1 = await send(ids, req);
    const t1 = await send(text, req);
    assert.equal(a1.status, 200, a1.raw);
    assert.equal(a1.input, "token-ids", "the engine received token ids");
    assert.equal(t1.input, "text");
    assert.equal(a1.digest, t1.digest, "the engine ran the same prompt tokens on both paths");
    assert.equal(a1.body.object, "chat.completion");
    assert.match(String(a1.body.id), /^chatcmpl-/);
    assert.ok(a1.length === null || a1.length === String(Buffer.byteLength(a1.raw)), "no stale content-length");
    const c = (a1.body.choices as { message: unknown; finish_reason: string }[])[0];
    const tc = (t1.body.choices as { message: unknown; finish_reason: string }[])[0];
    assert.deepEqual(c.message, tc.message, "same completion text, same message shape");
    assert.equal(c.finish_reason, tc.finish_reason);
    assert.deepEqual(a1.body.usage, t1.body.usage, "same usage (prompt tokens, cached tokens)");
    // The next turn on the same context: as many cached tokens as on the text path.
    await Promise.all([mirrorSettled(ids.ng, ids.sims), mirrorSettled(text.ng, text.sims)]);
    const next = {
      ...req,
      messages: [...messages, { role: "assistant", content: "ok" }, { role: "user", content: "More." }],
    };
    const a2 = await send(ids, next);
    const t2 = await send(text, next);
    assert.equal(a2.input, "token-ids");
    assert.ok(cachedOf(t2) > 400, `the text path hits the cache: ${cachedOf(t2)}`);
    assert.equal(cachedOf(a2), cachedOf(t2), "no hit-rate loss");
    const stats = (await ids.sims[0].stats()) as unknown as { tokenIdRequests: number };
    assert.equal(stats.tokenIdRequests, 2);
    assert.match(await nginxMetrics(ids), /infera_router_token_id_requests_total\{outcome="ids"\} 2/);
  },
);

test("chat, streamed: chat.completion.chunk events with the text path's content", { skip }, async () => {
  const req = {
    model: "m",
    max_tokens: 5,
    stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: "user", content: "Stream this: " + longText("nid-stream", 100) }],
  };
  const a = await send(ids, req);
  const t = await send(text, req);
  assert.equal(a.input, "token-ids");
  assert.equal(a.digest, t.digest);
  assert.ok(a.raw.endsWith("data: [DONE]\n\n"), a.raw.slice(-80));
  const ac = chunks(a.raw);
  for (const c of ac) assert.equal(c.object, "chat.completion.chunk");
  assert.deepEqual(strip(ac), strip(chunks(t.raw)), "the same deltas (role first, content, finish reason) and usage");
});

test(
  "completions with a text prompt: ids to the same endpoint, the text_completion answer as it is",
  { skip },
  async () => {
    const req = { model: "m", max_tokens: 4, prompt: "Continue: " + longText("nid-cmpl", 150) };
    const a = await send(ids, req, "/v1/completions");
    const t = await send(text, req, "/v1/completions");
    assert.equal(a.status, 200, a.raw);
    assert.equal(a.input, "token-ids");
    assert.equal(a.digest, t.digest);
    assert.equal(a.body.object, "text_completion");
    assert.deepEqual(a.body.choices, t.body.choices);
    assert.deepEqual(a.body.usage, t.body.usage);
  },
);

test("text instead of ids: a worker whose render parity is not exact; a request with tools", { skip }, async () => {
  const w = (
    (await (await fetch(`${divergent.ng.url}/v1/admin/workers`)).json()) as {
      render_parity: { status: string };
    }[]
  )[0];
  assert.equal(w.render_parity.status, "diverged");
  const d = await send(divergent, { model: "m", max_tokens: 3, messages: [{ role: "user", content: "hi there" }] });
  assert.equal(d.status, 200);
  assert.equal(d.input, "text", "not exact: text");
  assert.equal(d.body.object, "chat.completion");
  assert.match(await nginxMetrics(divergent), /infera_router_token_id_requests_total\{outcome="text_not_exact"\} 1/);
  const tools = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }];
  const a = await send(ids, { model: "m", max_tokens: 3, tools, messages: [{ role: "user", content: "call f" }] });
  assert.equal(a.status, 200);
  assert.equal(a.input, "text", "tools: the chat endpoint parses tool calls, so text");
  assert.match(await nginxMetrics(ids), /infera_router_token_id_requests_total\{outcome="text_ineligible"\} 1/);
});

/** A proxy in front of a simulator that writes every answer on in 7-byte pieces, a few ms apart. */
async function chopper(sim: Sim): Promise<{ address: string; close(): void }> {
  const port = await freePort();
  const server = http.createServer((req, res) => {
    const up = http.request(
      { host: "127.0.0.1", port: sim.port, path: req.url, method: req.method, headers: req.headers },
      (ur) => {
        const h = { ...ur.headers };
        res.writeHead(ur.statusCode || 502, h);
        const parts: Buffer[] = [];
        let ended = false;
        let writing = false;
        const pump = async () => {
          if (writing) return;
          writing = true;
          for (let guard = 0; guard < 1000000 && (parts.length || !ended); guard++) {
            if (!parts.length) {
              await sleep(1);
              continue;
            }
            const b = parts.shift()!;
            for (let i = 0; i < b.length; i += 7) {
              res.write(b.subarray(i, i + 7));
              await sleep(1);
            }
          }
          res.end();
        };
        ur.on("data", (c: Buffer) => {
          parts.push(c);
          void pump();
        });
        ur.on("end", () => {
          ended = true;
          void pump();
        });
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(port, "127.0.0.1", () => r()));
  return { address: `127.0.0.1:${port}`, close: () => server.close() };
}

test("an answer cut into 7-byte pieces comes out whole: every event, the whole JSON", { skip }, async () => {
  const sim = await startSim("nc0");
  const ch = await chopper(sim);
  try {
    const s = await side([], true, [], `${ch.address}@${sim.events}`);
    const messages = [{ role: "user", content: "Cut this: " + longText("nid-cut", 120) }];
    const a = await send(s, { model: "m", max_tokens: 12, stream: true, messages });
    const t = await send(text, { model: "m", max_tokens: 12, stream: true, messages });
    assert.equal(a.input, "token-ids");
    assert.ok(a.raw.endsWith("data: [DONE]\n\n"), a.raw.slice(-80));
    assert.deepEqual(strip(chunks(a.raw)), strip(chunks(t.raw)));
    const w = await send(s, { model: "m", max_tokens: 12, messages });
    const tw = await send(text, { model: "m", max_tokens: 12, messages });
    assert.equal(w.input, "token-ids");
    assert.equal(w.body.object, "chat.completion");
    assert.deepEqual(w.body.choices, tw.body.choices);
  } finally {
    ch.close();
  }
});

test(
  "a refused connection is retried on the next exact worker, still as ids; the load is released once",
  { skip, timeout: 120000 },
  async () => {
    // Health checks off: a dead worker is then found only by its refused connection (they would race the request).
    const s = await side(["nf0", "nf1"], true, ["--decode-ms-per-token", "1"], undefined, [
      "--health-interval-ms",
      "0",
    ]);
    // A prompt cached on nf1 (bounded: new prompts until one lands there).
    let p = "";
    for (let i = 0; i < 12 && !p; i++) {
      const c = "Failover: " + longText("nid-fo" + i, 200);
      const r = await send(s, { model: "m", max_tokens: 2, messages: [{ role: "user", content: c }] });
      assert.equal(r.input, "token-ids");
      if (r.worker === s.sims[1].address) p = c;
    }
    assert.ok(p, "some prompt landed on nf1");
    await mirrorSettled(s.ng, s.sims);
    // nf1 gone, nginx not told (no health checks): its cache still draws the pick, the connection is refused.
    await s.sims[1].proc.kill();
    await new Promise<void>((resolve, reject) => {
      const c = net.connect(s.sims[1].port, "127.0.0.1");
      c.on("connect", () => reject(new Error("nf1 still listens")));
      c.on("error", () => resolve());
    });
    const before = ((await s.sims[0].stats()) as unknown as { tokenIdRequests: number }).tokenIdRequests;
    for (const stream of [false, true]) {
      const r = await send(s, { model: "m", max_tokens: 3, stream, messages: [{ role: "user", content: p }] });
      assert.equal(r.status, 200, r.raw);
      assert.equal(r.worker, s.sims[0].address, "retried on nf0");
      assert.equal(r.input, "token-ids", "still as ids");
      if (stream) for (const c of chunks(r.raw)) assert.equal(c.object, "chat.completion.chunk");
      else assert.equal(r.body.object, "chat.completion");
    }
    const after = ((await s.sims[0].stats()) as unknown as { tokenIdRequests: number }).tokenIdRequests;
    assert.equal(after - before, 2);
    assert.match(await nginxMetrics(s), /infera_router_failovers_total 2/);
    await waitFor("every guard released", async () => {
      const r = (await (await fetch(`${s.ng.url}/v1/admin/reservations`)).json()) as { open_guards: number };
      return r.open_guards === 0;
    });
  },
);

test("the tokenizer helper unreachable: the prompt is tokenized in njs and goes as text", { skip }, async () => {
  // nginx asks a port nobody listens on; the bridge (parity, fleet) runs on its own.
  const dead = `http://127.0.0.1:${await freePort()}/v1/tokenize`;
  const s = await side(["nh0"], true, [], undefined, [], dead);
  const w = (
    (await (await fetch(`${s.ng.url}/v1/admin/workers`)).json()) as { render_parity: { status: string } }[]
  )[0];
  assert.equal(w.render_parity.status, "exact");
  const a = await send(s, { model: "m", max_tokens: 3, messages: [{ role: "user", content: "no helper here" }] });
  assert.equal(a.status, 200, a.raw);
  assert.equal(a.input, "text");
  assert.equal(a.body.object, "chat.completion");
  assert.match(await nginxMetrics(s), /infera_router_token_id_requests_total\{outcome="text_ineligible"\} 1/);
});
