// Which request paths the gateway forwards to a worker at all. Engines serve
// more than inference on the same port (vLLM: /reset_prefix_cache, /sleep,
// /v1/load_lora_adapter, /metrics; SGLang: /flush_cache, /update_weights...;
// the simulator: /sim/clear), so a gateway that forwards every path hands any
// client the fleet's admin API. Only the inference endpoints below, plus what
// the operator names in --extra-paths, reach a worker; anything else is a 404
// (a known path with another method a 405) in the API's error shape, answered
// before the body is read. Matching is on the exact path without its query
// string (one trailing slash tolerated): encodings, dot
// segments or doubled slashes never match, so they cannot smuggle a path past
// the list. ES5-safe: njs bundles this file.
import { Endpoint } from "./request";
import { httpError, HttpError } from "./util";

export interface PathRule {
  /** Upper-case method, or "" for any method. */
  method: string;
  path: string;
  /** The rule's path ended in "*": it matches every path that starts with it. */
  prefix: boolean;
  /** Routed by prompt cache; null = routed by load alone. */
  endpoint: Endpoint | null;
}

/** The inference endpoints every gateway forwards (OpenAI chat/completions/embeddings, Anthropic messages, model list). */
export const BUILTIN_PATHS: PathRule[] = [
  { method: "POST", path: "/v1/chat/completions", prefix: false, endpoint: "chat" },
  { method: "POST", path: "/v1/completions", prefix: false, endpoint: "completions" },
  { method: "POST", path: "/v1/messages", prefix: false, endpoint: "messages" },
  { method: "POST", path: "/v1/embeddings", prefix: false, endpoint: null },
  { method: "GET", path: "/v1/models", prefix: false, endpoint: null },
];

const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/** --extra-paths: comma-separated "[METHOD ]/path[*]"; the problem, or null. */
export function extraPathsProblem(spec: string): string | null {
  try {
    parseExtraPaths(spec);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

export function parseExtraPaths(spec: string): PathRule[] {
  const out: PathRule[] = [];
  const parts = (spec || "").split(",");
  for (let i = 0; i < parts.length; i++) {
    const item = parts[i].trim();
    if (!item) continue;
    const sp = item.indexOf(" ");
    const method = sp > 0 ? item.substring(0, sp).toUpperCase() : "";
    let path = sp > 0 ? item.substring(sp + 1).trim() : item;
    if (method && METHODS.indexOf(method) < 0)
      throw new Error("'" + item + "': unknown method " + method + " (one of " + METHODS.join(", ") + ")");
    const prefix = path.length > 1 && path.charAt(path.length - 1) === "*";
    if (prefix) path = path.substring(0, path.length - 1);
    if (path.charAt(0) !== "/" || path.indexOf("*") >= 0 || path.indexOf("?") >= 0 || /\s/.test(path))
      throw new Error(
        "'" + item + "': expected [METHOD ]/path or /prefix*, e.g. 'POST /v1/score' or 'GET /v1/models/*'",
      );
    out.push({ method: method, path: path, prefix: prefix, endpoint: null });
  }
  return out;
}

/** Built-ins first, so an extra rule can add methods or paths but never turn a cache-routed endpoint into a load-routed one. */
export function pathRules(extra: string): PathRule[] {
  return BUILTIN_PATHS.concat(parseExtraPaths(extra));
}

function matches(rule: PathRule, p: string): boolean {
  if (rule.prefix) return p.indexOf(rule.path) === 0;
  return p === rule.path || p === rule.path + "/";
}

export type PathVerdict = { endpoint: Endpoint | null; error: null } | { endpoint: null; error: HttpError };

/** Whether METHOD path may reach a worker, and how it is routed. */
export function checkPath(rules: PathRule[], method: string, rawPath: string): PathVerdict {
  const q = rawPath.indexOf("?");
  const p = q >= 0 ? rawPath.substring(0, q) : rawPath;
  const m = (method || "GET").toUpperCase().substring(0, 16);
  let known = false;
  for (let i = 0; i < rules.length; i++) {
    if (!matches(rules[i], p)) continue;
    if (rules[i].method === "" || rules[i].method === m) return { endpoint: rules[i].endpoint, error: null };
    known = true;
  }
  // The path is the client's: quoted short, never echoed whole.
  const shown = p.length > 120 ? p.substring(0, 120) + "..." : p;
  if (known)
    return {
      endpoint: null,
      error: httpError(405, "method " + m + " is not allowed on " + shown, "method_not_allowed"),
    };
  return {
    endpoint: null,
    error: httpError(
      404,
      "path " +
        shown +
        " is not served by this gateway (inference endpoints only; operators add paths with --extra-paths)",
      "not_found",
    ),
  };
}
