// Render parity against the reference: every request of a seeded corpus is
// rendered + tokenized by HF transformers (test/render_reference.py, vLLM's
// preprocessing) and by the router's own code; the token ids must be equal.
import { test } from "node:test";
import assert from "node:assert/strict";
import { corpus, CorpusItem, FAMILIES, reference, RefResult } from "../render-corpus";
import { parseRequest, promptTokenIds } from "../../core/request";
import { ChatInput } from "../../core/chat";
import { loadTokenizer, LoadedTokenizer } from "../../runtime/tokenizer";
import { needs, pythonMissing } from "../tools";

type Renderer = (it: CorpusItem, tok: LoadedTokenizer) => number[];

const routerIds: Renderer = (it, tok) => {
  const b = JSON.stringify(it.body);
  return promptTokenIds(parseRequest(it.endpoint, b, Buffer.byteLength(b), { maxBodyBytes: 1 << 30 }), tok) as number[];
};

// The pre-parity router: messages flattened to {role, text} before the template.
const flattened: Renderer = (it, tok) => {
  const b = JSON.stringify(it.body);
  const req = parseRequest(it.endpoint, b, Buffer.byteLength(b), { maxBodyBytes: 1 << 30 });
  if (!req.chat) return promptTokenIds(req, tok) as number[];
  const text = (c: any): string =>
    typeof c === "string"
      ? c
      : Array.isArray(c)
        ? c.map((p) => (typeof p === "string" ? p : p && p.text) || "").join("")
        : "";
  const flat: ChatInput = {
    ...req.chat,
    tools: null,
    kwargs: {},
    messages: req.chat.messages.map((m: any) => ({ role: m.role, content: text(m.content) })),
  };
  return tok.encode(tok.renderChat(flat));
};

export function compare(
  items: CorpusItem[],
  ref: Map<string, RefResult>,
  render: Renderer,
  toks: Record<string, LoadedTokenizer>,
) {
  const rates: Record<string, { n: number; exact: number; firstMisses: string[] }> = {};
  for (const it of items) {
    const s = (rates[it.family] ??= { n: 0, exact: 0, firstMisses: [] });
    s.n++;
    const want = ref.get(it.id);
    assert.ok(want, "reference has no result for " + it.id);
    let got: number[] | null = null;
    let err = "";
    try {
      got = render(it, toks[it.family]);
    } catch (e) {
      err = (e as Error).message;
    }
    // A request the engine rejects (template error) must be rejected by the router too.
    const ok = want.error
      ? err !== ""
      : err === "" && got !== null && got.length === want.ids!.length && got.every((x, i) => x === want.ids![i]);
    if (ok) s.exact++;
    else if (s.firstMisses.length < 5) {
      let d = 0;
      while (got && want.ids && d < got.length && got[d] === want.ids[d]) d++;
      s.firstMisses.push(
        `${it.id} (${it.endpoint}): ${want.error ? "engine rejects: " + want.error : err ? "router error: " + err : "first differing token at " + d}`,
      );
    }
  }
  return rates;
}

test(
  "render parity: router token ids equal transformers' for the seeded corpus (Qwen3 100%, Llama 3.1, DeepSeek-V3, Gemma 3)",
  { skip: needs(pythonMissing(["transformers", "jinja2"], "'transformers>=5.24' 'jinja2>=3.1.6'")) },
  () => {
    const items = corpus();
    assert.ok(items.length >= 300);
    const ref = reference(items);
    const toks: Record<string, LoadedTokenizer> = {};
    for (const f in FAMILIES) toks[f] = loadTokenizer(FAMILIES[f])!;
    const rates = compare(items, ref, routerIds, toks);
    const lines = Object.keys(rates).map(
      (f) => `${f}: ${rates[f].exact}/${rates[f].n} exact (${((100 * rates[f].exact) / rates[f].n).toFixed(1)}%)`,
    );
    process.stderr.write("render parity\n  " + lines.join("\n  ") + "\n");
    for (const f in rates)
      assert.equal(
        rates[f].exact,
        rates[f].n,
        `${f} render parity ${rates[f].exact}/${rates[f].n}; first misses:\n${rates[f].firstMisses.join("\n")}`,
      );
    // The corpus exercises what the old flattening lost; the same comparison must catch it.
    const old = compare(items, ref, flattened, toks);
    process.stderr.write(`  flattened {role, content} (pre-parity router): qwen3 ${old.qwen3.exact}/${old.qwen3.n}\n`);
    assert.ok(old.qwen3.exact < old.qwen3.n * 0.6, "the corpus must catch flattened rendering");
  },
);

test("corpus covers the shapes that matter", () => {
  const items = corpus();
  const qwen = items.filter((i) => i.family === "qwen3");
  const count = (p: (i: CorpusItem) => boolean) => qwen.filter(p).length;
  const msgs = (i: CorpusItem) => (i.body.messages || []) as any[];
  assert.ok(count((i) => msgs(i).some((m) => m.tool_calls && m.tool_calls.length > 1)) >= 30, "parallel tool calls");
  assert.ok(count((i) => msgs(i).some((m) => m.role === "tool")) >= 30, "tool results");
  assert.ok(count((i) => msgs(i).some((m) => m.reasoning)) >= 30, "reasoning");
  assert.ok(count((i) => !!i.body.chat_template_kwargs) >= 30, "chat_template_kwargs");
  assert.ok(count((i) => msgs(i).some((m) => Array.isArray(m.content))) >= 30, "content-part arrays");
  assert.ok(count((i) => i.endpoint === "messages") >= 30, "Anthropic shape");
  assert.ok(count((i) => i.body.continue_final_message === true) >= 5, "continue_final_message");
  assert.ok(
    count((i) => msgs(i).some((m) => typeof m.content === "string" && m.content.length > 1000)) >= 10,
    "long system prompts",
  );
  assert.ok(count((i) => /[^\x00-\x7f]/.test(JSON.stringify(i.body))) >= 100, "non-ASCII");
  assert.deepEqual(
    corpus().map((i) => i.id),
    items.map((i) => i.id),
    "seeded",
  );
  assert.equal(JSON.stringify(corpus()), JSON.stringify(items), "seeded");
});
