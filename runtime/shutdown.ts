// Bounded shutdown for the long-running commands (router, bridge).
//
// Every close path waits on something outside the process (an etcd watch
// cancel, a NATS drain, an informer stop, tokenizer threads), and any of those
// can hang: a watch cancel waits for etcd's answer, which a paused or
// partitioned etcd never sends. So each step is awaited with a deadline, and a
// backstop timer armed at the first signal ends the process even if a step
// ignores its deadline. A second SIGTERM/SIGINT ends the process at once.
import { Logger } from "./log";

/** Waits for p, at most ms: true if it settled in time (resolved or rejected), false on the deadline. */
export function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const t = setTimeout(() => resolve(false), ms);
    t.unref();
    p.then(
      () => (clearTimeout(t), resolve(true)),
      () => (clearTimeout(t), resolve(true)),
    );
  });
}

/** Time the close steps after a drain get, all together, before the backstop exits. */
export const CLOSE_BUDGET_MS = 4000;

/** One close step: awaited with its deadline; a step that overruns is logged and left behind. */
export async function closeStep(log: Logger, what: string, run: () => Promise<unknown>, ms: number): Promise<void> {
  let p: Promise<unknown>;
  try {
    p = run();
  } catch (e) {
    log("warn", "shutdown: a step failed", { step: what, error: (e as Error).message });
    return;
  }
  if (!(await within(p, ms)))
    log("warn", "shutdown: a step did not finish in time; going on without it", { step: what, timeout_ms: ms });
}

/**
 * Installs the SIGTERM/SIGINT handlers. The first signal runs graceful(),
 * then the process exits 0; backstopMs after that signal the
 * process exits 1 whatever graceful() is waiting on. A second signal exits 1 at once.
 */
export function onShutdown(log: Logger, backstopMs: number, graceful: (signal: string) => Promise<void>): void {
  let stopping = false;
  const stop = (sig: string) => {
    if (stopping) {
      log("warn", `second ${sig}: exiting now`, { signal: sig });
      process.exit(1);
    }
    stopping = true;
    // Not unref'd: it is what guarantees the exit.
    setTimeout(() => {
      log("warn", "shutdown did not finish in time: exiting now", { signal: sig, timeout_ms: backstopMs });
      process.exit(1);
    }, backstopMs);
    graceful(sig).then(
      () => process.exit(0),
      (e) => {
        log("error", "shutdown failed", { error: (e as Error).message });
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
}
