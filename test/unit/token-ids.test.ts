// runtime/token-ids.ts: which requests can go as ids and how, and the
// completions answer rewritten back to chat, whole and streamed in pieces.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { ChatFromCompletions, tokenIdRequest } from "../../runtime/token-ids";

const ids = Uint32Array.from([1, 22, 333]);
const buf = (o: unknown) => Buffer.from(JSON.stringify(o));

test("chat goes to /v1/completions with the ids as prompt; rendered fields dropped, max_completion_tokens mapped", () => {
  const p = tokenIdRequest(
    "chat",
    buf({
      model: "m",
      messages: [{ role: "user", content: "hi" }],
      max_completion_tokens: 7,
      stream: true,
      stream_options: { include_usage: true },
      chat_template_kwargs: { enable_thinking: false },
      temperature: 0,
      tool_choice: null,
    }),
    ids,
  );
  assert.ok(!("text" in p));
  assert.equal(p.path, "/v1/completions");
  assert.equal(p.chat, true);
  assert.deepEqual(JSON.parse(p.body.toString()), {
    model: "m",
    max_tokens: 7,
    stream: true,
    stream_options: { include_usage: true },
    temperature: 0,
    prompt: [1, 22, 333],
  });
});

test("the chat endpoint's own work goes as text: tools, logprobs, response_format, a custom template, unknown fields", () => {
  const base = { model: "m", max_tokens: 8, messages: [{ role: "user", content: "hi" }] };
  for (const [k, v] of [
    ["tools", [{ type: "function", function: { name: "f" } }]],
    ["logprobs", true],
    ["response_format", { type: "json_object" }],
    ["chat_template", "{{ x }}"],
    ["something_new", 1],
  ] as [string, unknown][])
    assert.deepEqual(tokenIdRequest("chat", buf({ ...base, [k]: v }), ids), { text: k });
  assert.deepEqual(tokenIdRequest("messages", buf(base), ids), { text: "endpoint" });
  // No bound: the chat endpoint's default (up to the context's end) is not completions' (16 tokens).
  assert.deepEqual(tokenIdRequest("chat", buf({ ...base, max_tokens: null }), ids), { text: "max_tokens" });
  assert.deepEqual(tokenIdRequest("chat", Buffer.from("{"), ids), { text: "body" });
});

test("completions: only the prompt changes, the path stays; a batch of prompts goes as text", () => {
  const p = tokenIdRequest("completions", buf({ model: "m", prompt: "hello", max_tokens: 2, echo: false }), ids);
  assert.ok(!("text" in p));
  assert.equal(p.path, null);
  assert.equal(p.chat, false);
  assert.deepEqual(JSON.parse(p.body.toString()), { model: "m", max_tokens: 2, echo: false, prompt: [1, 22, 333] });
  assert.deepEqual(tokenIdRequest("completions", buf({ model: "m", prompt: ["a", "b"] }), ids), { text: "prompt" });
});

test("a whole completions answer becomes a chat.completion, sent at its end; an error passes as it is", () => {
  const t = new ChatFromCompletions(false);
  const whole = JSON.stringify({
    id: "cmpl-1",
    object: "text_completion",
    created: 5,
    model: "m",
    choices: [{ index: 0, text: "hello there", logprobs: null, finish_reason: "stop", stop_reason: null }],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  });
  assert.equal(t.push(Buffer.from(whole.slice(0, 20)), false).length, 0);
  const out = JSON.parse(t.push(Buffer.from(whole.slice(20)), true).toString());
  assert.deepEqual(out, {
    id: "chatcmpl-1",
    object: "chat.completion",
    created: 5,
    model: "m",
    choices: [
      {
        index: 0,
        message: { role: "assistant", content: "hello there" },
        logprobs: null,
        finish_reason: "stop",
        stop_reason: null,
      },
    ],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  });
  const err = '{"error":{"message":"bad","code":400}}';
  assert.equal(new ChatFromCompletions(false).push(Buffer.from(err), true).toString(), err);
});

test("a streamed answer becomes chat.completion.chunk events, split anywhere; the role on the first delta", () => {
  const ev = (text: string, finish: string | null, usage?: object) =>
    "data: " +
    JSON.stringify({
      id: "cmpl-2",
      object: "text_completion",
      created: 1,
      model: "m",
      choices: [{ index: 0, text, logprobs: null, finish_reason: finish }],
      ...(usage ? { usage } : {}),
    }) +
    "\n\n";
  const all = ev("a", null) + ev(" b", null) + ev("", "length", { prompt_tokens: 1 }) + "data: [DONE]\n\n";
  const t = new ChatFromCompletions(true);
  let out = "";
  // Cut into 7-byte pieces: events arrive split across chunks.
  for (let i = 0; i < all.length; i += 7) out += t.push(Buffer.from(all.slice(i, i + 7)), i + 7 >= all.length);
  const evs = out.split("\n\n").filter(Boolean);
  assert.equal(evs[evs.length - 1], "data: [DONE]");
  const js = evs.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
  assert.deepEqual(
    js.map((j) => [j.id, j.object, j.choices[0].delta, j.choices[0].finish_reason, j.usage ?? null]),
    [
      ["chatcmpl-2", "chat.completion.chunk", { role: "assistant", content: "a" }, null, null],
      ["chatcmpl-2", "chat.completion.chunk", { content: " b" }, null, null],
      ["chatcmpl-2", "chat.completion.chunk", {}, "length", { prompt_tokens: 1 }],
    ],
  );
});

test("a character whose UTF-8 bytes are split across chunks comes through whole, streamed and not", () => {
  const text = "héllo, 世界 🎉 ünï";
  const ev = (t: string, finish: string | null) =>
    "data: " +
    JSON.stringify({
      id: "cmpl-3",
      object: "text_completion",
      created: 1,
      model: "m",
      choices: [{ index: 0, text: t, logprobs: null, finish_reason: finish }],
    }) +
    "\n\n";
  const bytes = Buffer.from(ev(text, null) + ev("", "stop") + "data: [DONE]\n\n", "utf8");
  // 5-byte pieces cut two-, three- and four-byte characters apart.
  const pieces = (b: Buffer) => Array.from({ length: Math.ceil(b.length / 5) }, (_, k) => b.subarray(k * 5, k * 5 + 5));
  const t = new ChatFromCompletions(true);
  const parts = pieces(bytes);
  const out = Buffer.concat(parts.map((p, k) => t.push(p, k === parts.length - 1))).toString("utf8");
  assert.ok(!out.includes("\uFFFD"), "no replacement characters");
  const first = JSON.parse(out.split("\n\n")[0].slice(6));
  assert.equal(first.choices[0].delta.content, text);

  const whole = Buffer.from(
    JSON.stringify({
      id: "cmpl-4",
      object: "text_completion",
      created: 5,
      model: "m",
      choices: [{ index: 0, text, logprobs: null, finish_reason: "stop" }],
    }),
    "utf8",
  );
  const w = new ChatFromCompletions(false);
  const wp = pieces(whole);
  const got = Buffer.concat(wp.map((p, k) => w.push(p, k === wp.length - 1))).toString("utf8");
  assert.equal(JSON.parse(got).choices[0].message.content, text);
});
