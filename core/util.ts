// Small helpers that work the same under Node and njs (no Map/Set/Node APIs).

/** UTF-8 bytes of a JS string (surrogate pairs joined, lone ones become U+FFFD). */
export function utf8(s: string): Uint8Array {
  const out: number[] = [];
  for (let i = 0; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        i++;
      } else c = 0xfffd;
    } else if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return new Uint8Array(out);
}

// Any character outside ASCII. The regex scan is native code in njs too; the
// charCodeAt loop below runs in njs's interpreter on the nginx worker's event
// loop, a step per character of a long prompt. But each regex call takes
// memory that njs frees only when the request ends (kilobytes of match
// state), so short strings, of which a body has thousands, keep the loop.
const NON_ASCII = /[^\x00-\x7f]/;
const REGEX_FROM = 4096;

/** UTF-8 byte length of s without building the bytes (size estimates of multi-MB prompts). */
export function utf8Length(s: string): number {
  // ASCII: one byte per character, no loop.
  if (s.length >= REGEX_FROM && !NON_ASCII.test(s)) return s.length;
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n++;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}

/** o's own property k (not one from its prototype, e.g. "constructor" or "__proto__"). */
export function hasOwn(o: object, k: string | number): boolean {
  return Object.prototype.hasOwnProperty.call(o, k);
}

/** Equal strings in time that depends on their lengths only, not on where they differ (secrets). */
export function sameSecret(a: string, b: string): boolean {
  let diff = a.length ^ b.length;
  const n = a.length > b.length ? a.length : b.length;
  for (let i = 0; i < n; i++) diff |= (i < a.length ? a.charCodeAt(i) : 0) ^ (i < b.length ? b.charCodeAt(i) : 0);
  return diff === 0;
}

/** A Prometheus label value: backslash, double quote and newline escaped, so a worker id cannot forge lines. */
export function promLabel(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/** An error that becomes an HTTP answer: status and an OpenAI-style error type. */
export interface HttpError extends Error {
  status: number;
  type: string;
  /** The request field at fault, when there is one (vLLM's 404 for an unknown model names "model"). */
  param?: string;
}

export function httpError(status: number, message: string, type?: string): HttpError {
  const e = new Error(message) as HttpError;
  e.status = status;
  e.type = type || "invalid_request_error";
  return e;
}

/** Any thrown value as an HttpError: ours keep their status, anything else is a 500. */
export function asHttpError(e: unknown): HttpError {
  if (e instanceof Error && typeof (e as HttpError).status === "number") return e as HttpError;
  return httpError(500, e instanceof Error ? e.message : String(e), "internal_error");
}

/** The OpenAI error body every JSON error of ours uses. */
export function errorPayload(
  status: number,
  message: string,
  type: string,
  param?: string,
): { error: { message: string; type: string; param?: string; code: number } } {
  if (param) return { error: { message: message, type: type, param: param, code: status } };
  return { error: { message: message, type: type, code: status } };
}
