// The log hook core calls (router, reservations, plugins): a level, a stable
// message, and fields. Adapters render it: the Node logger as JSON or text,
// njs as one logfmt line through r.log. ES5-safe: njs bundles this file.

export type LogLevel = "debug" | "info" | "warn" | "error";

export interface LogFields {
  [k: string]: string | number | boolean;
}

export type LogHook = (level: LogLevel, msg: string, fields?: LogFields) => void;

/** "msg k=v k=v": a value with a space, a quote or an equals sign is quoted. */
export function logfmt(msg: string, fields?: LogFields): string {
  let out = msg;
  if (!fields) return out;
  for (const k in fields) {
    const v = String(fields[k]);
    out += " " + k + "=" + (/[\s"=]/.test(v) || v === "" ? JSON.stringify(v) : v);
  }
  return out;
}
