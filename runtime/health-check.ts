// Active health checks of the workers (vLLM and SGLang both serve GET
// /health), shared by the router (runtime/app.ts) and the bridge that feeds
// nginx (njs/bridge.ts): every worker at start and each joining one at once,
// then every intervalMs. Two failures in a row take a worker out; one success
// puts it back. probe(id, true) is for a worker whose KV event stream just
// dropped: on a failure it probes once more shortly after, so a dead engine
// is out within a fraction of a second instead of one or two intervals.

export interface HealthTarget {
  id: string;
  address: string;
  /** Changes when the worker is replaced (a new stay, a new address): a probe of the old one then counts for nothing. */
  key: string;
}

export interface HealthOptions {
  intervalMs: number;
  /** The workers to probe now, and one of them by id (null once it left). */
  targets: () => HealthTarget[];
  target: (id: string) => HealthTarget | null;
  /** A probe's verdict: healthy after any success, unhealthy after two failures in a row. */
  verdict: (id: string, healthy: boolean) => void;
}

export class HealthChecker {
  private timer: NodeJS.Timeout | null = null;
  private failures: Record<string, number> = {};
  private passed: Record<string, boolean> = {};
  private down: Record<string, boolean> = {};

  constructor(private o: HealthOptions) {}

  /** Whether checks run (interval > 0 and started). */
  get running(): boolean {
    return this.timer !== null;
  }

  start(): void {
    if (!this.o.intervalMs || this.timer) return;
    const tick = () => {
      for (const t of this.o.targets()) void this.probe(t.id);
    };
    this.timer = setInterval(tick, this.o.intervalMs);
    this.timer.unref();
    tick();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** A new or replaced worker: not known to serve until a probe passes; probed at once when checks run. */
  join(id: string): void {
    this.leave(id);
    if (this.running) void this.probe(id);
  }

  leave(id: string): void {
    delete this.failures[id];
    delete this.passed[id];
    delete this.down[id];
  }

  /** Has a probe passed since the worker joined. */
  hasPassed(id: string): boolean {
    return this.passed[id] === true;
  }

  async probe(id: string, again = false): Promise<boolean> {
    const t = this.o.target(id);
    if (!t) return false;
    let ok = false;
    try {
      const r = await fetch(`http://${t.address}/health`, {
        signal: AbortSignal.timeout(Math.max(200, this.o.intervalMs)),
      });
      ok = r.ok;
      await r.arrayBuffer().catch(() => undefined);
    } catch {
      ok = false;
    }
    const now = this.o.target(id);
    if (!now || now.key !== t.key) return false;
    this.failures[id] = ok ? 0 : (this.failures[id] ?? 0) + 1;
    if (ok) {
      this.passed[id] = true;
      this.down[id] = false;
      this.o.verdict(id, true);
    } else if (this.failures[id] >= 2) {
      this.down[id] = true;
      this.o.verdict(id, false);
    }
    if (!ok && again && !this.down[id]) {
      await new Promise((r) => setTimeout(r, 300).unref());
      return this.probe(id);
    }
    return ok;
  }
}
