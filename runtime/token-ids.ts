// --send-token-ids exact: the router's prompt token ids go to the engine in
// place of the text, so the engine neither renders nor tokenizes the prompt
// again (docs/routing.md, "Token ids to engines"). Only to a worker whose
// render-parity probe (runtime/probe.ts) says exact, decided per request by
// the director; every other request goes as the client sent it.
//
// The engines take ids today on their OpenAI completions endpoint: vLLM's and
// SGLang's /v1/completions accept `prompt` as a list of ints and answer in the
// text_completion shape. Neither chat endpoint takes ids, so a chat request is
// rewritten to /v1/completions with `prompt: [ids]` and its answer rewritten
// back to chat.completion (whole) or chat.completion.chunk (streamed) here.
// What the chat endpoint does after generation and completions does not
// (tool-call parsing, reasoning parsing, structured output from
// response_format, chat-shaped logprobs) cannot be kept, so a request that
// asks for any of it, or carries any field outside the list below, goes as
// text. A completions request with a text prompt keeps its endpoint and its
// answer: only `prompt` changes.
import { Endpoint } from "../core/request";
import { chatEvents, ChatRewrite, chatRewrite, chatWhole } from "../core/token-ids";

/**
 * Chat fields with the same meaning on the completions endpoint (vLLM's and
 * SGLang's CompletionRequest), copied as they are.
 */
const SAME = [
  "model",
  "stream",
  "stream_options",
  "max_tokens",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "n",
  "stop",
  "stop_token_ids",
  "seed",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "logit_bias",
  "user",
  "ignore_eos",
  "min_tokens",
  "skip_special_tokens",
  "spaces_between_special_tokens",
  "include_stop_str_in_output",
  "cache_salt",
  "priority",
  "request_id",
];
/** Chat fields the router's render already applied: they are in the ids, so they are dropped. */
const RENDERED = ["messages", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"];

/** The request rewritten to carry ids, or why it goes as text. */
export type TokenIdPlan = { body: Buffer; path: string | null; chat: boolean } | { text: string };

function jsonIds(ids: ArrayLike<number>): string {
  // JSON.stringify of a plain array is V8's fast path (several times a join's
  // speed); a typed array (from a tokenizer thread) is copied into a packed one first.
  if (Array.isArray(ids)) return JSON.stringify(ids);
  const a: number[] = [];
  for (let i = 0; i < ids.length; i++) a.push(ids[i]);
  return JSON.stringify(a);
}

/**
 * The request with the prompt's ids in place of its text, or the reason it
 * goes as text. path: the new :path (a chat request goes to completions), or
 * null when the path stays.
 */
export function tokenIdRequest(endpoint: Endpoint | null, body: Buffer, ids: ArrayLike<number>): TokenIdPlan {
  if (endpoint !== "chat" && endpoint !== "completions") return { text: "endpoint" };
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(body.toString("utf8")) as Record<string, unknown>;
  } catch {
    return { text: "body" };
  }
  if (!j || typeof j !== "object" || Array.isArray(j)) return { text: "body" };
  if (endpoint === "completions") {
    // One text prompt only (a list of prompts is a batch the router tokenized as one).
    if (typeof j.prompt !== "string") return { text: "prompt" };
    const parts: string[] = [];
    for (const k of Object.keys(j)) if (k !== "prompt") parts.push(JSON.stringify(k) + ":" + JSON.stringify(j[k]));
    parts.push('"prompt":' + jsonIds(ids));
    return { body: Buffer.from("{" + parts.join(",") + "}", "utf8"), path: null, chat: false };
  }
  // Without a bound the chat endpoint generates up to the context's end, completions 16 tokens: text.
  const bounded = (v: unknown) => v !== undefined && v !== null;
  if (!bounded(j.max_tokens) && !bounded(j.max_completion_tokens)) return { text: "max_tokens" };
  const parts: string[] = [];
  for (const k of Object.keys(j)) {
    const v = j[k];
    if (RENDERED.indexOf(k) >= 0 || v === null || v === undefined) continue;
    if (k === "max_completion_tokens") {
      if (!bounded(j.max_tokens)) parts.push('"max_tokens":' + JSON.stringify(v));
      continue;
    }
    // tools, tool_choice, logprobs, response_format, chat_template ...: the chat endpoint's own work.
    if (SAME.indexOf(k) < 0) return { text: k };
    parts.push(JSON.stringify(k) + ":" + JSON.stringify(v));
  }
  parts.push('"prompt":' + jsonIds(ids));
  return { body: Buffer.from("{" + parts.join(",") + "}", "utf8"), path: "/v1/completions", chat: true };
}

const EMPTY = Buffer.alloc(0);

/**
 * Rewrites an engine's completions answer into the chat answer the client
 * asked for, chunk by chunk as Envoy streams it (core/token-ids.ts does the
 * rewrite; nginx runs the same in its body filter). Anything that is not a
 * text_completion (an error, an unknown shape) passes unchanged.
 */
export class ChatFromCompletions {
  // Bytes, not text: a chunk may end inside a character's UTF-8 bytes, so an
  // event is decoded only once it is whole (as njs's toChat cuts its buffer).
  // A streamed answer keeps only its partial event; a whole one keeps its
  // chunks, joined once at its end.
  private buf: Buffer = EMPTY;
  private chunks: Buffer[] = [];
  private readonly s: ChatRewrite;

  constructor(private readonly stream: boolean) {
    this.s = chatRewrite(stream);
  }

  /** The bytes to send in place of this chunk (maybe empty: a whole answer is sent at its end). */
  push(chunk: Uint8Array, end: boolean): Buffer {
    if (!this.stream) {
      this.chunks.push(Buffer.from(chunk));
      if (!end) return EMPTY;
      const all = Buffer.concat(this.chunks);
      this.chunks = [];
      return Buffer.from(chatWhole(all.toString("utf8")), "utf8");
    }
    // A view of the chunk when nothing is carried: the rest is copied below.
    const buf = this.buf.length
      ? Buffer.concat([this.buf, chunk])
      : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    // Server-sent events end at a blank line; a partial event waits for its rest.
    const ev = chatEvents(this.s, buf);
    const out = ev.text;
    const rest = buf.subarray(ev.rest);
    if (end) {
      this.buf = EMPTY;
      // What is left is no event: it passes as it came.
      return rest.length ? Buffer.concat([Buffer.from(out, "utf8"), rest]) : Buffer.from(out, "utf8");
    }
    // A copy, so the rest does not keep the whole chunk alive.
    this.buf = Buffer.from(rest);
    return Buffer.from(out, "utf8");
  }
}
