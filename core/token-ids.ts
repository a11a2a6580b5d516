// --send-token-ids: an engine's completions answer rewritten back into the
// chat answer the client asked for (docs/rendering.md, "Token ids to
// engines"). One translator for both gateways: the ext_proc server runs it in
// its response phase (runtime/token-ids.ts ChatFromCompletions), nginx in the
// proxy location's js_body_filter (njs/phases.ts). A streamed answer is cut
// into events on its bytes (chatEvents), only where a whole event ends
// ("\n\n", ASCII), so no UTF-8 sequence is decoded split; the rest is strings
// in, strings out. Anything that is not a text_completion (an error, an
// unknown shape) passes unchanged.

type Json = { [k: string]: unknown };

/** Per answer: which choices have had their first delta (the role goes on it). */
export interface ChatRewrite {
  stream: boolean;
  started: { [index: string]: boolean };
}

export function chatRewrite(stream: boolean): ChatRewrite {
  return { stream: stream, started: {} };
}

function chatId(id: unknown): unknown {
  return typeof id === "string" && id.indexOf("cmpl-") === 0 ? "chat" + id : id;
}

/**
 * A text_completion answer (whole or one streamed event) in the chat shape:
 * its id and object renamed, each choice mapped, every other field as it is;
 * null for anything else.
 */
function asChat(j: Json, object: string, choice: (c: Json) => Json): Json | null {
  if (!j || typeof j !== "object" || j.object !== "text_completion" || !Array.isArray(j.choices)) return null;
  const out: Json = {};
  const keys = Object.keys(j);
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i];
    if (k === "id") out.id = chatId(j.id);
    else if (k === "object") out.object = object;
    else if (k === "choices") {
      const cs = j.choices as Json[];
      const mapped: Json[] = [];
      for (let n = 0; n < cs.length; n++) mapped.push(choice(cs[n]));
      out.choices = mapped;
    } else out[k] = j[k];
  }
  return out;
}

/** A text_completion choice as a chat.completion choice. */
function wholeChoice(c: Json): Json {
  const out: Json = {};
  const keys = Object.keys(c);
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i];
    if (k === "text") out.message = { role: "assistant", content: c.text };
    else if (k === "logprobs") out.logprobs = null;
    else if (k !== "prompt_token_ids" && k !== "token_ids") out[k] = c[k];
  }
  if (!("message" in out)) out.message = { role: "assistant", content: "" };
  return out;
}

/** A streamed text_completion choice as a chat delta: the role on each choice's first. */
function deltaChoice(s: ChatRewrite, c: Json): Json {
  const index = typeof c.index === "number" ? c.index : 0;
  const first = !s.started[index];
  s.started[index] = true;
  const text = typeof c.text === "string" ? c.text : "";
  const delta: Json = first ? { role: "assistant", content: text } : text || !c.finish_reason ? { content: text } : {};
  const out: Json = {};
  const keys = Object.keys(c);
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i];
    if (k === "text") out.delta = delta;
    else if (k === "logprobs") out.logprobs = null;
    else if (k !== "prompt_token_ids" && k !== "token_ids") out[k] = c[k];
  }
  if (!("delta" in out)) out.delta = delta;
  return out;
}

/** A whole (not streamed) completions answer as chat.completion; anything else unchanged. */
export function chatWhole(text: string): string {
  let j: Json;
  try {
    j = JSON.parse(text) as Json;
  } catch (e) {
    return text;
  }
  const out = asChat(j, "chat.completion", wholeChoice);
  return out ? JSON.stringify(out) : text;
}

/** One server-sent event (without its blank line) as a chat.completion.chunk event; anything else unchanged. */
export function chatEvent(s: ChatRewrite, ev: string): string {
  if (ev.indexOf("data: ") !== 0) return ev;
  const data = ev.slice(6);
  if (data === "[DONE]") return ev;
  let j: Json;
  try {
    j = JSON.parse(data) as Json;
  } catch (e) {
    return ev;
  }
  const out = asChat(j, "chat.completion.chunk", function (c: Json) {
    return deltaChoice(s, c);
  });
  return out ? "data: " + JSON.stringify(out) : ev;
}

/** An answer's bytes as either gateway holds them: Node's Buffer, njs's Buffer. */
export interface AnswerBytes {
  length: number;
  indexOf(s: string, from?: number): number;
  slice(start: number, end?: number): AnswerBytes;
  toString(encoding?: string): string;
}

/**
 * The whole events in buf, each rewritten (chatEvent) and ended with its blank
 * line, and the offset where the unfinished rest begins (buf.length when none):
 * the caller keeps those bytes for the next chunk.
 */
export function chatEvents(s: ChatRewrite, buf: AnswerBytes): { text: string; rest: number } {
  let out = "";
  let at = 0;
  let i: number;
  while ((i = buf.indexOf("\n\n", at)) >= 0) {
    out += chatEvent(s, buf.slice(at, i).toString("utf8")) + "\n\n";
    at = i + 2;
  }
  return { text: out, rest: at };
}
