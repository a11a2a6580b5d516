// A log line that can repeat per input (one per refused KV-event frame) must
// not let a broken or hostile publisher flood the log: at most `perWindow`
// lines per window, the rest counted per key (worker) and reported in one
// summary line when the window closes. Metrics count every occurrence; the
// log only has to say that it happens, where, and how often.
import { Level, Logger } from "./log";

export interface RateLimitedLog {
  /** Logs `msg` for `key` (a worker id) unless this window's budget is spent. */
  (key: string, msg: string): void;
  /** Writes the pending summary now (shutdown) and stops the timer. */
  close(): void;
}

export interface RateLimitOptions {
  level: Level;
  /** Lines written per window before the rest are only counted. */
  perWindow: number;
  windowMs: number;
  /** What the summary line calls the suppressed lines, e.g. "kv-events refused frame". */
  what: string;
}

export function rateLimitedLog(log: Logger, o: RateLimitOptions): RateLimitedLog {
  let windowStart = 0;
  let written = 0;
  let suppressed = 0;
  let perKey: Record<string, number> = {};
  let timer: NodeJS.Timeout | null = null;

  const summary = (): void => {
    if (suppressed > 0) {
      const keys = Object.keys(perKey).sort((a, b) => perKey[b] - perKey[a]);
      const top = keys
        .slice(0, 10)
        .map((k) => `${k}: ${perKey[k]}`)
        .join(", ");
      const secs = Math.max(1, Math.round((Date.now() - windowStart) / 1000));
      log(
        o.level,
        `${o.what}: ${suppressed} more line(s) suppressed in the last ${secs}s (${top}${keys.length > 10 ? `, +${keys.length - 10} more` : ""}); counters in /metrics`,
        { suppressed, per_key: perKey },
      );
    }
    suppressed = 0;
    perKey = {};
  };

  const tick = (): void => {
    summary();
    // Nothing happened in the window that just ended: stop until the next line.
    if (written === 0 && timer) {
      clearInterval(timer);
      timer = null;
    }
    windowStart = Date.now();
    written = 0;
  };

  const f = ((key: string, msg: string) => {
    if (!timer) {
      windowStart = Date.now();
      written = 0;
      timer = setInterval(tick, o.windowMs);
      timer.unref();
    }
    if (written < o.perWindow) {
      written++;
      log(
        o.level,
        written === o.perWindow
          ? `${msg} (further lines like this are counted, not logged, for ${Math.round(o.windowMs / 1000)}s)`
          : msg,
      );
      return;
    }
    suppressed++;
    perKey[key] = (perKey[key] ?? 0) + 1;
  }) as RateLimitedLog;
  f.close = () => {
    summary();
    if (timer) clearInterval(timer);
    timer = null;
  };
  return f;
}
