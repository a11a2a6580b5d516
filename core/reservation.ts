// Load held by a pick, given back exactly once: at the first token (queued
// prefill, and the PD prefill worker's load in first-token mode) and at the
// end of the response, a reset or cancel, an error, or a pick never used.
import { RouterState } from "./state/types";
import { Guard, RouterConfig } from "./types";

export interface Reservation {
  /** Response started streaming (first token): releases queued prefill, and prefill load unless held to completion. */
  firstToken(): void;
  /** Response EOF, cancellation, failure, or a pick that was never used. Idempotent. */
  finish(): void;
  readonly open: boolean;
  /**
   * The held guards, for callers that release across VMs: prefill (PD only),
   * main, and queued (prefill work waiting for the first token; null when none).
   */
  guards(): { prefill: Guard | null; main: Guard; queued: Guard | null };
}

export function reservations(state: RouterState, cfg: RouterConfig, log: (level: "warn", line: string) => void) {
  function release(g: Guard | null): void {
    if (!g || g.done) return;
    g.done = true;
    try {
      state.load.release(g);
    } catch (e) {
      // Release must never throw into a response path; the log says what broke.
      log("warn", "release failed for " + g.epochKey + ": " + String(e));
    }
  }
  return {
    open(pre: Guard | null, main: Guard, queued: Guard | null): Reservation {
      const r = {
        open: true,
        guards() {
          return { prefill: pre, main: main, queued: queued };
        },
        firstToken() {
          release(queued);
          if (cfg.pdPrefillGuardRelease === "first-token") release(pre);
        },
        finish() {
          r.open = false;
          release(queued);
          release(pre);
          release(main);
        },
      };
      return r;
    },
    /** Releases a guard rebuilt from its data (njs: popped from a shared dict, so once). */
    releaseCopy(g: Guard): void {
      release({ epochKey: g.epochKey, blocks: g.blocks, tokens: g.tokens, requests: g.requests, pending: g.pending || 0, done: false });
    },
  };
}
