// A chat (or completions) request's answer as the token-id tests read it,
// through either gateway: what the simulator says it was given (its input kind
// and prompt digest), the body parsed when it is not streamed, and the raw text.
import * as assert from "node:assert/strict";

export interface Answer {
  status: number;
  input: string | null;
  digest: string | null;
  worker: string | null;
  length: string | null;
  body: Record<string, unknown>;
  raw: string;
}

export async function sendJson(
  base: string,
  body: Record<string, unknown>,
  path = "/v1/chat/completions",
): Promise<Answer> {
  const r = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const raw = await r.text();
  let j: Record<string, unknown> = {};
  if (!body.stream) j = JSON.parse(raw) as Record<string, unknown>;
  return {
    status: r.status,
    input: r.headers.get("x-sim-prompt-input"),
    digest: r.headers.get("x-sim-prompt-digest"),
    worker: r.headers.get("x-infera-worker"),
    length: r.headers.get("content-length"),
    body: j,
    raw,
  };
}

export const cachedOf = (a: Answer) =>
  (a.body.usage as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens;

/** A streamed answer's events, parsed; throws on anything that is not a data event. */
export function chunks(raw: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const ev of raw.split("\n\n")) {
    if (!ev) continue;
    assert.match(ev, /^data: /);
    if (ev === "data: [DONE]") continue;
    out.push(JSON.parse(ev.slice(6)) as Record<string, unknown>);
  }
  return out;
}
