// A pick's reservation: the request lifecycle's first-token and completion
// hooks, each run once, with a release that gives every guard back exactly once.
import { RouterState } from "./state/types";
import { Guard } from "./types";
import { LogHook } from "./log";
import { LifecyclePlugin, PickResult, Release } from "./scheduling/framework";

export interface Reservation {
  /** Response started streaming (first token): releases queued prefill, and prefill load unless held to completion. */
  firstToken(): void;
  /** A later chunk of the streamed response came back (after the first token): a step of its worker ended. */
  chunk(): void;
  /** The request left for its worker (after any wait at the router): speed learning times the first token from here. */
  dispatched(): void;
  /** Response EOF, cancellation, failure, or a pick that was never used. Idempotent. */
  finish(): void;
  readonly open: boolean;
  /**
   * The held guards, for callers that release across VMs: prefill (PD only),
   * main, and queued (prefill work waiting for the first token; null when none).
   */
  guards(): { prefill: Guard | null; main: Guard; queued: Guard | null };
}

export function reservations(state: RouterState, log: LogHook) {
  const release: Release = (g) => {
    if (!g || g.done) return;
    g.done = true;
    try {
      state.load.release(g);
    } catch (e) {
      // Release must never throw into a response path; the log says what broke.
      log("warn", "release failed", { epoch_key: String(g.epochKey), error: String(e) });
    }
  };
  function each(plugins: LifecyclePlugin[], hook: "firstToken" | "chunk" | "complete", result: PickResult): void {
    for (let i = 0; i < plugins.length; i++) {
      const f = plugins[i][hook];
      if (!f) continue;
      try {
        f(result, release);
      } catch (e) {
        log("warn", "lifecycle hook failed", { plugin: plugins[i].name, hook: hook, error: String(e) });
      }
    }
  }
  return {
    open(result: PickResult, plugins: LifecyclePlugin[]): Reservation {
      let started = false;
      const r = {
        open: true,
        guards() {
          return { prefill: result.guards.prefill, main: result.guards.main as Guard, queued: result.guards.queued };
        },
        dispatched() {
          const t = result.timing;
          // Finished (late binding moved the pick, or it ended): nothing of it reaches a worker.
          if (!t || started || !r.open) return;
          const now = t.now();
          // What is ahead of it in the engine is known now; after a wait at
          // the router (prefill admission) the prefill it waited for has run
          // and the inputs read at the pick no longer describe the worker.
          if (t.refresh) t.refresh(now - t.start >= 1);
          t.start = now;
        },
        firstToken() {
          if (started || !r.open) return;
          started = true;
          each(plugins, "firstToken", result);
        },
        chunk() {
          if (started && r.open) each(plugins, "chunk", result);
        },
        finish() {
          if (!r.open) return;
          r.open = false;
          each(plugins, "complete", result);
        },
      };
      return r;
    },
    /** Releases a guard rebuilt from its data (njs: popped from a shared dict, so once). */
    releaseCopy(g: Guard): void {
      const copy: Guard = {
        epochKey: g.epochKey,
        blocks: g.blocks,
        tokens: g.tokens,
        requests: g.requests,
        pending: g.pending || 0,
        done: false,
      };
      // A compact guard's marks (core/state/marks.ts) go with it.
      if (g.at) copy.at = g.at;
      if (g.n !== undefined) copy.n = g.n;
      release(copy);
    },
  };
}
