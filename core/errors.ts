// One error shape per API, for every component that answers (the ext_proc
// server's immediate responses, njs, and the gateway configs' own error
// pages): OpenAI's {"error":{message,type,code}} everywhere except Anthropic's
// /v1/messages, which gets {"type":"error","error":{type,message}}, so each
// SDK can parse what it receives. ES5-safe (njs bundles it).
import { errorPayload } from "./util";

/** Anthropic's error type for an HTTP status. */
export function anthropicType(status: number): string {
  if (status === 400) return "invalid_request_error";
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 413) return "request_too_large";
  if (status === 429) return "rate_limit_error";
  if (status === 503 || status === 529) return "overloaded_error";
  return status >= 500 ? "api_error" : "invalid_request_error";
}

export function isAnthropicPath(path: string): boolean {
  const q = path.indexOf("?");
  const p = q >= 0 ? path.substring(0, q) : path;
  return p === "/v1/messages" || p.indexOf("/v1/messages/") === 0;
}

/** The JSON error body for a request path. type is our (OpenAI-style) error type. */
export function errorJson(path: string, status: number, message: string, type: string, param?: string): string {
  if (isAnthropicPath(path))
    return JSON.stringify({ type: "error", error: { type: anthropicType(status), message: message } });
  return JSON.stringify(errorPayload(status, message, type, param));
}
