// The fleet as the router serves it: workers joining and leaving (with their
// models, health checks, render probes and KV event subscriptions), discovery's
// state, and readiness. (LoRA adapter state comes from the engine scrape: engine-metrics.ts.)
import { Router, WorkerSpec } from "../core/router";
import { diffFleet } from "../core/fleet";
import { ModelTable } from "../core/models";
import { LoraTable } from "../core/lora";
import { HealthChecker } from "./health-check";
import { LoadedTokenizer } from "./tokenizer";
import { RenderProbes } from "./probe";
import { Options } from "./config";
import { Metrics } from "./metrics";
import { Logger } from "./log";
import { KvIntake } from "./kv-intake";
import { Tokenizers } from "./tokenizers";

/** GET <worker>/v1/models: served model ids (base models and LoRA adapters) and each adapter's parent. */
export async function fetchModels(
  address: string,
  timeoutMs = 3000,
): Promise<{ ids: string[]; parent: Record<string, string> } | null> {
  try {
    const r = await fetch(`http://${address}/v1/models`, { signal: AbortSignal.timeout(timeoutMs) });
    if (!r.ok) {
      await r.arrayBuffer().catch(() => undefined);
      return null;
    }
    const j = (await r.json()) as { data?: { id?: unknown; parent?: unknown; root?: unknown }[] };
    if (!Array.isArray(j.data)) return null;
    const ids: string[] = [];
    const parent: Record<string, string> = {};
    for (const m of j.data) {
      if (typeof m.id !== "string") continue;
      ids.push(m.id);
      if (typeof m.parent === "string" && m.parent) parent[m.id] = m.parent;
    }
    return { ids, parent };
  } catch {
    return null;
  }
}

export class Fleet {
  /** Active health checks (startHealthChecks): with them on, a worker counts for readiness once it has passed one. */
  readonly health: HealthChecker;
  /** Render-parity probe per worker (null with --render-probe-api off). */
  readonly probes: RenderProbes | null;
  private modelTimer: NodeJS.Timeout | null = null;
  private discoverySynced = false;
  /** Set on SIGTERM: readiness goes false so load balancers stop sending. */
  draining = false;
  /** Discovery's connection state (static discovery is always connected). */
  discoveryState: { ok: boolean; detail: string } = { ok: true, detail: "connected" };

  constructor(
    opts: Options,
    private readonly log: Logger,
    metrics: Metrics,
    private readonly router: Router,
    private readonly models: ModelTable,
    private readonly lora: LoraTable,
    private readonly tok: Tokenizers,
    private readonly intake: KvIntake,
  ) {
    const target = (id: string) => {
      const w = this.router.worker(id);
      return w ? { id: w.id, address: w.address, key: String(w.epochKey) } : null;
    };
    this.health = new HealthChecker({
      intervalMs: opts.healthIntervalMs,
      targets: () => this.router.workers().map((w) => ({ id: w.id, address: w.address, key: String(w.epochKey) })),
      target,
      verdict: (id, ok) => this.router.setHealthy(id, ok),
    });
    this.probes =
      opts.renderProbeApi === "off"
        ? null
        : new RenderProbes(
            (id) => this.probeTarget(id),
            { intervalMs: opts.renderProbeIntervalMs, api: opts.renderProbeApi, timeoutMs: 5000 },
            (l, line, f) => log(l, line, f),
            metrics.registry,
          );
  }

  /** Whether the worker counts for readiness: health checks off, or it passed one since it joined. */
  passed(id: string): boolean {
    return !this.health.running || this.health.hasPassed(id);
  }

  /** Discovery has delivered its first view. */
  get synced(): boolean {
    return this.discoverySynced;
  }

  /** Starts the active health checks (runtime/health-check.ts) every --health-interval-ms; 0 = off. */
  startHealthChecks(): void {
    this.health.start();
  }

  /** Asks a worker which models it serves; workers without /v1/models serve anything. */
  async refreshModels(id: string, address: string): Promise<void> {
    const m = await fetchModels(address);
    const w = this.router.worker(id);
    if (!w || w.address !== address || !m) return;
    this.models.set(id, m.ids);
    for (const k of Object.keys(m.parent)) this.tok.modelParent[k] = m.parent[k];
    for (const k of Object.keys(m.parent)) this.lora.markAdapter(k);
  }

  private probeTarget(id: string): { tok: LoadedTokenizer | null; model: string | null } {
    const ms = this.models.get(id);
    const model = ms && ms.length ? ms[0] : null;
    return { tok: model ? this.tok.tokenizerFor(model) : this.tok.tokenizer, model };
  }

  startRenderProbes(): void {
    this.probes?.start();
    // Model lists change when adapters are loaded/unloaded; refresh them every 30 s.
    if (!this.modelTimer) {
      this.modelTimer = setInterval(() => {
        for (const w of this.router.workers()) void this.refreshModels(w.id, w.address);
      }, 30000);
      this.modelTimer.unref();
    }
  }

  /** Adds or updates a worker and (re)subscribes to its KV events. */
  addWorker(spec: WorkerSpec): void {
    const before = this.router.worker(spec.id);
    const w = this.router.addWorker(spec);
    // A new or changed worker is not known to serve until a probe passes (readiness waits for one).
    if (this.health.running && (!before || before.epochKey !== w.epochKey)) this.health.join(spec.id);
    // Models first: the probe names one the worker serves and uses its tokenizer.
    void this.refreshModels(spec.id, w.address).then(() => this.probes?.join(spec.id, w.address));
    this.intake.subscribe(spec, w, before);
  }

  removeWorker(id: string): void {
    this.probes?.leave(id);
    this.models.set(id, null);
    this.intake.leave(id);
    this.health.leave(id);
    if (this.router.removeWorker(id))
      this.log("info", `worker ${id} left; mirror dropped, in-flight reservations kept`);
  }

  listWorkerCount(): number {
    return this.router.workers().length;
  }

  setWorkers(list: WorkerSpec[]): void {
    const d = diffFleet(this.router.workers(), list);
    for (const id of d.remove) this.removeWorker(id);
    for (const w of d.add) this.addWorker(w);
  }

  /** Discovery reports whether it can see the registry (etcd up, watch live). */
  setDiscoveryState(ok: boolean, detail: string): void {
    this.discoveryState = { ok, detail };
  }

  setSynced(v: boolean): void {
    this.discoverySynced = v;
  }

  /**
   * Readiness, for /readyz and gRPC health, means "can route": not draining;
   * discovery has delivered its first view; some worker can take a pick
   * (healthy, not excluded, and, with health checks on, has passed a probe
   * since it joined); and KV events flow: every worker naming an event
   * endpoint has its subscription open, and among routable ones at least one
   * stream is not reported down by its transport. An idle engine publishes
   * nothing, so "flowing" is judged by the connection, not by a recent event
   * (that would keep an idle fleet unready forever).
   *
   * Discovery that lost its registry after the first view (etcd down, a watch
   * broken) keeps routing on the last known fleet: that is reported in
   * `degraded`, not as unready, or a probe would take the only replica out of
   * its Service while it still routes.
   */
  readiness(): {
    ready: boolean;
    degraded: string[];
    reason: string;
    checks: Record<string, { ok: boolean; detail: string }>;
  } {
    const ws = this.router.workers();
    const usable = ws.filter((w) => this.router.healthy(w.id) && !this.router.excluded(w.id));
    const routable = this.health.running ? usable.filter((w) => this.health.hasPassed(w.id)) : usable;
    const unprobed = usable.length - routable.length;
    const withEvents = routable.filter((w) => w.events);
    const flowing = withEvents.filter((w) => this.intake.flowing(w.id));
    const noSub = ws.filter((w) => w.events && !this.intake.subscribed(w.id));
    const checks = {
      draining: { ok: !this.draining, detail: this.draining ? "shutting down" : "no" },
      discovery: {
        ok: this.discoverySynced && this.discoveryState.ok,
        detail: this.discoverySynced ? this.discoveryState.detail : "discovery has not synced",
      },
      workers: {
        ok: routable.length > 0,
        detail: ws.length
          ? `${routable.length} routable of ${ws.length}${unprobed ? ` (${unprobed} not yet through a health check)` : ""}`
          : "no workers known",
      },
      events: {
        ok: noSub.length === 0 && (withEvents.length === 0 || flowing.length > 0),
        detail: noSub.length
          ? `no KV-event subscription for ${noSub.map((w) => w.id).join(",")}`
          : withEvents.length === 0
            ? "no worker publishes KV events (load-only routing)"
            : `${flowing.length} of ${withEvents.length} streams up`,
      },
    };
    // Discovery after its first view: routing goes on on the cached fleet.
    const degraded = this.discoverySynced && !this.discoveryState.ok ? ["discovery"] : [];
    const failing = Object.entries(checks).find(([k, c]) => !c.ok && degraded.indexOf(k) < 0);
    const reason = failing
      ? `${failing[0]}: ${failing[1].detail}`
      : `${routable.length} worker(s)${degraded.length ? `; degraded: discovery: ${checks.discovery.detail}` : ""}`;
    return { ready: !failing, degraded, reason, checks };
  }

  close(): void {
    this.health.stop();
    this.probes?.stop();
    if (this.modelTimer) clearInterval(this.modelTimer);
  }
}
