// Session identity from the headers coding agents already send. Session
// affinity (core/scheduling/session.ts) needs a key per conversation; agents
// put one on every call without being configured, each under its own name:
//   x-claude-code-session-id  Claude Code (closed source; seen by every proxy in front of it)
//   session_id                OpenAI Codex CLI (codex-rs/codex-api/src/requests/headers.rs)
//   x-session-affinity        OpenCode, non-opencode providers (packages/opencode/src/session/llm/request.ts)
//   x-opencode-session        OpenCode, its own providers (same file)
//   x-dynamo-session-id       the header NVIDIA Dynamo's router reads for stickiness
// OpenCode also sends X-Session-Id, the router's own default --session-header.
// The configured --session-header is read first, then this list in order.
// Pure and ES5-safe: njs bundles this file.
import { utf8 } from "./util";
import { xxh3Hex } from "./xxh3";

export const DEFAULT_SESSION_HEADERS =
  "x-claude-code-session-id,session_id,x-session-affinity,x-opencode-session,x-dynamo-session-id";

// RFC 9110 token characters: anything else can never arrive as a header name.
const TOKEN = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;

/** The header names of a --session-headers value, lower-cased; "" or "none": none. */
export function parseSessionHeaders(v: string): string[] {
  const out: string[] = [];
  const s = (v || "").trim().toLowerCase();
  if (!s || s === "none") return out;
  const parts = s.split(",");
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i].trim();
    if (p && out.indexOf(p) < 0) out.push(p);
  }
  return out;
}

export function sessionHeadersProblem(v: string): string | null {
  const names = parseSessionHeaders(v);
  for (let i = 0; i < names.length; i++) if (!TOKEN.test(names[i])) return "'" + names[i] + "' is not a header name";
  return null;
}

/**
 * The request's session id: the primary header's value, else the first of
 * the list that is present and non-empty. get returns a header's value by
 * lower-case name (undefined/null/"" when absent).
 */
export function sessionFromHeaders(
  get: (name: string) => string | null | undefined,
  primary: string,
  list: string[],
): string | null {
  const v = primary ? get(primary) : null;
  if (typeof v === "string" && v) return v;
  for (let i = 0; i < list.length; i++) {
    const w = get(list[i]);
    if (typeof w === "string" && w) return w;
  }
  return null;
}

/**
 * What logs show instead of a session id: a 48-bit XXH3 tag. The same
 * session gets the same tag on every replica, so its requests can be
 * followed across logs without the id itself (often a bearer-like UUID)
 * being written anywhere.
 */
export function sessionTag(id: string): string {
  return "s-" + xxh3Hex(utf8(id)).slice(0, 12);
}
