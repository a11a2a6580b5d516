// Structured logs: one JSON object per line on stderr by default (time, level,
// msg, then the fields), or --log-format text for humans: "time level msg
// k=v ..." (logfmt fields). Messages are stable; what varies goes in fields.
// Lines logged while a request is being handled carry its x-request-id,
// through AsyncLocalStorage, so callers need not thread it.
import { AsyncLocalStorage } from "async_hooks";

export type Level = "debug" | "info" | "warn" | "error";

export interface Logger {
  (level: Level, msg: string, fields?: Record<string, unknown>): void;
}

const RANK: Record<Level, number> = { debug: 0, info: 1, warn: 2, error: 3 };

const requestScope = new AsyncLocalStorage<{ requestId: string }>();

/** Runs fn with every log line inside it tagged with this request id. */
export function withRequestId<T>(requestId: string | undefined, fn: () => T): T {
  return requestId ? requestScope.run({ requestId }, fn) : fn();
}

export function currentRequestId(): string | undefined {
  return requestScope.getStore()?.requestId;
}

export function makeLogger(
  level: Level = "info",
  format: "json" | "text" = "json",
  base: Record<string, unknown> = {},
  out: (line: string) => void = (l) => process.stderr.write(l),
): Logger {
  const min = RANK[level] ?? 1;
  return (l, msg, fields) => {
    if ((RANK[l] ?? 3) < min) return;
    const rid = currentRequestId();
    if (format === "text") {
      let line = `${new Date().toISOString()} ${l}${rid ? ` [${rid}]` : ""} ${msg}`;
      if (fields) for (const k of Object.keys(fields)) line += ` ${k}=${logfmtValue(fields[k])}`;
      out(line + "\n");
      return;
    }
    const rec: Record<string, unknown> = { time: new Date().toISOString(), level: l, msg, ...base };
    if (rid) rec.request_id = rid;
    if (fields) Object.assign(rec, fields);
    out(JSON.stringify(rec) + "\n");
  };
}

/**
 * A field value as logfmt writes it: bare when it is one token, else a quoted
 * JSON string (so spaces, quotes, '=' and newlines cannot split or forge a
 * field); objects as their JSON.
 */
export function logfmtValue(v: unknown): string {
  const s = typeof v === "string" ? v : v === undefined ? "" : (JSON.stringify(v) ?? String(v));
  return /^[^\s"=\\]+$/.test(s) ? s : JSON.stringify(s);
}

/**
 * Logs a condition once when it starts and once when it clears, however often
 * it is reported in between (retry loops must not print a line per attempt).
 */
export function stateLogger(
  log: Logger,
  what: string,
): {
  fail(reason: string, fields?: Record<string, unknown>): void;
  ok(fields?: Record<string, unknown>): void;
  readonly failing: boolean;
  readonly since: number;
} {
  let failing = false;
  let since = 0;
  let count = 0;
  return {
    fail(reason, fields) {
      count++;
      if (failing) return;
      failing = true;
      since = Date.now();
      log("warn", `${what}: ${reason}; retrying with backoff`, fields);
    },
    ok(fields) {
      if (!failing) return;
      log(
        "info",
        `${what}: recovered after ${((Date.now() - since) / 1000).toFixed(1)}s and ${count} failed attempt(s)`,
        fields,
      );
      failing = false;
      count = 0;
    },
    get failing() {
      return failing;
    },
    get since() {
      return since;
    },
  };
}

/** Exponential backoff with jitter: 50 ms, 100 ms, ... up to maxMs. */
export function backoff(attempt: number, maxMs: number, baseMs = 50): number {
  const d = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 20));
  return Math.round(d / 2 + Math.random() * (d / 2));
}
