// --send-token-ids exact through real Envoy: a chat request to a worker whose
// render parity is exact reaches the engine as the router's token ids (on the
// engine's completions endpoint), and the client still gets a chat answer,
// whole or streamed, with the text the text path gives and the same cached
// tokens on a repeated prompt. The engine's x-sim-prompt-digest is a digest of
// the prompt ids it ran: equal on both paths, the engine computed the same
// prompt. A worker whose parity is not exact, and a request the completions
// endpoint cannot answer as chat (tools), get text.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { startEnvoyFleet, stopAll, waitFor, longText, EnvoyFleet } from "../harness";
import { cachedOf, chunks, sendJson } from "../chat-answer";
import { needsEnvoy } from "../harness";

const skip = needsEnvoy();
let ids: EnvoyFleet; // --send-token-ids exact, an exact worker
let text: EnvoyFleet; // the flag off: the text path
let divergent: EnvoyFleet; // --send-token-ids exact, a worker whose render diverges

type Parity = { render_parity: { status: string } };

before(async () => {
  if (skip) return;
  // One after another: three routers starting at once on a shared machine take long.
  ids = await startEnvoyFleet({ ids: ["ti0"], routerArgs: ["--send-token-ids", "exact"] });
  text = await startEnvoyFleet({ ids: ["tt0"] });
  divergent = await startEnvoyFleet({
    ids: ["td0"],
    simArgs: ["--render-divergent"],
    routerArgs: ["--send-token-ids", "exact"],
  });
  for (const f of [ids, divergent])
    await waitFor("render parity probed", async () =>
      ((await f.router.workers()) as unknown as Parity[]).every((w) => w.render_parity.status !== "unchecked"),
    );
});
after(stopAll);

const send = (f: EnvoyFleet, body: Record<string, unknown>) => sendJson(f.envoy.url, body);

test(
  "chat, whole: the engine gets ids, the client a chat.completion with the text path's text and cache hits",
  { skip },
  async () => {
    const messages = [
      { role: "system", content: "You are terse. " + longText("tid-sys", 200) },
      { role: "user", content: "Summarise: " + longText("tid-doc", 300) },
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
    const c = (a1.body.choices as { message: unknown; finish_reason: string }[])[0];
    const tc = (t1.body.choices as { message: unknown; finish_reason: string }[])[0];
    assert.deepEqual(c.message, tc.message, "same completion text, same message shape");
    assert.equal(c.finish_reason, tc.finish_reason);
    assert.deepEqual(
      { ...(a1.body.usage as object) },
      { ...(t1.body.usage as object) },
      "same usage (prompt tokens, cached tokens)",
    );
    // The next turn on the same context: as many cached tokens as on the text path.
    await Promise.all([ids.settled(), text.settled()]);
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
    assert.match(await ids.router.metrics(), /infera_router_token_id_requests_total\{outcome="ids"\} 2/);
  },
);

test("chat, streamed: chat.completion.chunk events with the text path's content", { skip }, async () => {
  const req = {
    model: "m",
    max_tokens: 5,
    stream: true,
    messages: [{ role: "user", content: "Stream this: " + longText("tid-stream", 100) }],
  };
  const a = await send(ids, req);
  const t = await send(text, req);
  assert.equal(a.input, "token-ids");
  assert.equal(a.digest, t.digest);
  assert.ok(a.raw.endsWith("data: [DONE]\n\n"), a.raw.slice(-80));
  const ac = chunks(a.raw);
  const tc = chunks(t.raw);
  for (const c of ac) assert.equal(c.object, "chat.completion.chunk");
  const strip = (cs: Record<string, unknown>[]) => cs.map((c) => ({ choices: c.choices, usage: c.usage }));
  assert.deepEqual(strip(ac), strip(tc), "the same deltas (role first, content, finish reason) and usage");
});

test("text instead of ids: a worker whose render parity is not exact; a request with tools", { skip }, async () => {
  const w = ((await divergent.router.workers()) as unknown as Parity[])[0];
  assert.equal(w.render_parity.status, "diverged");
  const d = await send(divergent, { model: "m", max_tokens: 3, messages: [{ role: "user", content: "hi there" }] });
  assert.equal(d.status, 200);
  assert.equal(d.input, "text", "not exact: text");
  assert.equal(d.body.object, "chat.completion");
  assert.match(await divergent.router.metrics(), /infera_router_token_id_requests_total\{outcome="text_not_exact"\} 1/);
  const tools = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }];
  const a = await send(ids, { model: "m", max_tokens: 3, tools, messages: [{ role: "user", content: "call f" }] });
  assert.equal(a.status, 200);
  assert.equal(a.input, "text", "tools: the chat endpoint parses tool calls, so text");
  assert.match(await ids.router.metrics(), /infera_router_token_id_requests_total\{outcome="text_ineligible"\} 1/);
});
