// The composition root: builds the pieces a router process holds and wires
// them together. Each piece is its own module:
//   tokenizers.ts  the default and per-model tokenizers, the tokenizer threads
//   fleet.ts       workers joining and leaving, models, health checks, render probes, readiness
//   kv-intake.ts   KV event subscriptions and the mirror they feed
//   routing.ts     parse -> features -> pick, prefill admission; director.ts decides per request
// App keeps the methods its callers (cli, admin, tests) use, each delegating to its piece.
// Transports (gRPC ext_proc, admin HTTP) sit on top of this.
import { createRouter, Pick, Router, Worker, WorkerSpec } from "../core/router";
import { memoryState } from "../core/state/memory";
import { RouterState } from "../core/state/types";
import { EpochKey } from "../core/types";
import { Endpoint } from "../core/request";
import { PrefillAdmission } from "../core/admission";
import { Objective } from "../core/objectives";
import { KvEvent } from "../core/kvevents";
import { memoryModelTable, ModelTable, withModels } from "../core/models";
import { LoraTable, memoryLoraTable, withLora } from "../core/lora";
import { HealthChecker } from "./health-check";
import { TokenizerPool } from "./tokenpool";
import { LoadedTokenizer } from "./tokenizer";
import { EngineMetrics } from "./engine-metrics";
import { SaturationFeed } from "./saturation";
import { createMetrics, Metrics } from "./metrics";
import { Options } from "./config";
import { BatchInfo } from "./events";
import { RenderProbes } from "./probe";
import { defaultReplicaId, ReplicaSync } from "./replicas";
import { Director, Refused } from "./director";
import { Logger } from "./log";
import { Tokenizers } from "./tokenizers";
import { Fleet } from "./fleet";
import { EventSource, eventSourceFor, KvIntake, zmqEventSource } from "./kv-intake";
import { Routing } from "./routing";
import { timingDump } from "./timing-dump";

export { Logger, makeLogger } from "./log";
export { tokenizerPaths } from "./tokenizers";
export { fetchModels } from "./fleet";
export { KV_REFUSED_LOG, eventSourceFor } from "./kv-intake";
export type { EventSource } from "./kv-intake";

export class App {
  /** Which models each worker serves (GET /v1/models); the router's model filter reads it. */
  readonly models: ModelTable = memoryModelTable();
  /** Each worker's LoRA adapters (GET /metrics); the lora-slots filter and lora-affinity scorer read it. */
  readonly lora: LoraTable = memoryLoraTable();
  readonly state: RouterState = withLora(withModels(memoryState(), this.models), this.lora);
  readonly router: Router;
  readonly metrics: Metrics;
  /** Each worker's KV capacity and headroom from its /metrics (runtime/engine-metrics.ts; startEngineMetrics). */
  readonly engineMetrics: EngineMetrics;
  /** --replica-sync nats: in-flight load shared with the other router replicas. */
  readonly replicas: ReplicaSync | null = null;
  readonly tok: Tokenizers;
  readonly intake: KvIntake;
  readonly fleet: Fleet;
  readonly routing: Routing;

  constructor(
    readonly opts: Options,
    readonly log: Logger,
    eventSource?: EventSource,
  ) {
    this.tok = new Tokenizers(opts, log);
    this.metrics = createMetrics(
      () => this.router,
      () => this.tok.cacheStats(),
      (id) => this.intake.eventStatus(id),
      (id) => this.fleet.passed(id),
    );
    if (opts.replica && opts.replica.sync === "nats") {
      const r = opts.replica;
      this.replicas = new ReplicaSync(
        this.state.load,
        this.state.workers,
        { id: r.id || defaultReplicaId(), subject: r.subject, heartbeatMs: r.heartbeatMs, ttlMs: r.ttlMs },
        log,
      );
      this.state.load = this.replicas.ledger;
      this.replicas.register(this.metrics.registry);
    }
    this.router = createRouter(this.state, opts.router, {
      log: (l, msg, fields) => log(l, msg, fields),
      // Epoch milliseconds at performance.now()'s resolution: speed learning
      // times first tokens of a few milliseconds, which Date.now()'s whole
      // milliseconds would round by up to one either way.
      now: () => performance.timeOrigin + performance.now(),
      onPick: (role, p) => {
        this.metrics.picks.inc({ worker: p.worker, role, policy: p.policy });
        this.intake.picked(p.worker);
        this.metrics.hitBlocks.inc({ worker: p.worker, role }, p.hits);
        this.metrics.reqBlocks.inc({ role }, p.blocks);
      },
      onDemand: (d) => this.metrics.decisions.inc({ mode: d.mode, input: d.input, agrees: String(d.agrees) }),
      onPdPath: (path) => this.metrics.pdPaths.inc({ path }),
      onTiming: (worker, predicted, ms, inputs) => {
        if (predicted !== null && ms > 0)
          this.metrics.ttftPredictionError.observe({ worker }, Math.abs(predicted - ms) / ms);
        timingDump(worker, predicted, ms, inputs);
      },
    });
    // A dropped event stream is often the engine dying: probe it now, not at the next interval.
    this.intake = new KvIntake(
      opts,
      log,
      this.metrics,
      this.router,
      this.state,
      eventSource ?? zmqEventSource(opts, log),
      (id) => {
        if (this.fleet.health.running) void this.fleet.health.probe(id, true);
      },
    );
    this.fleet = new Fleet(opts, log, this.metrics, this.router, this.models, this.lora, this.tok, this.intake);
    this.routing = new Routing(opts, log, this.metrics, this.router, this.state, this.tok, this.fleet);
    this.engineMetrics = new EngineMetrics(() => this.router, {
      intervalMs: opts.engineMetrics ? opts.engineMetrics.intervalMs : 0,
      timeoutMs: 2000,
      blockSize: opts.router.blockSize,
      capacityOverride: opts.engineMetrics ? opts.engineMetrics.capacity : {},
      log: (l, line, f) => log(l, line, f),
      lora: this.lora,
      saturation: new SaturationFeed(
        () => this.routing.admission,
        (opts.engineMetrics && opts.engineMetrics.saturation) || { queueDepth: 0, kvUsage: 0 },
        (l, line, f) => log(l, line, f),
      ),
    });
    this.engineMetrics.register(this.metrics.registry);
  }

  /** Builds the app with the event transport named by --kv-event-transport. */
  static async create(opts: Options, log: Logger): Promise<App> {
    const app = new App(opts, log, await eventSourceFor(opts, log));
    if (app.replicas) {
      const { natsConnect } = await import("./nats");
      await app.replicas.start(await natsConnect(opts.natsUrl, log, `infera-gate-router ${app.replicas.opts.id}`));
      log("info", "replica load sync on", {
        replica_id: app.replicas.opts.id,
        subject: opts.replica.subject,
        nats: opts.natsUrl,
      });
    }
    return app;
  }

  // ---- tokenizers
  /** The default tokenizer (models without their own). */
  get tokenizer(): LoadedTokenizer | null {
    return this.tok.tokenizer;
  }
  /** Starts the one /metrics scrape (capacity, headroom, LoRA state, saturation) and applies --kv-capacity-blocks. */
  startEngineMetrics(): void {
    this.engineMetrics.start();
  }
  /** Per-model tokenizers from --router-tokenizer-path model=path,... */
  get tokenizers(): Record<string, LoadedTokenizer | null> {
    return this.tok.byModel;
  }
  tokenizerFor(model: string): LoadedTokenizer | null {
    return this.tok.tokenizerFor(model);
  }
  cacheStats(): { hitTokens: number; missTokens: number; pieces: number; chars: number } | null {
    return this.tok.cacheStats();
  }
  tokenizerPool(): TokenizerPool | null {
    return this.tok.pool();
  }
  warmTokenizers(): Promise<void> {
    return this.tok.warm();
  }

  // ---- fleet and health
  get health(): HealthChecker {
    return this.fleet.health;
  }
  get probes(): RenderProbes | null {
    return this.fleet.probes;
  }
  get draining(): boolean {
    return this.fleet.draining;
  }
  set draining(v: boolean) {
    this.fleet.draining = v;
  }
  get discoveryState(): { ok: boolean; detail: string } {
    return this.fleet.discoveryState;
  }
  set discoveryState(v: { ok: boolean; detail: string }) {
    this.fleet.discoveryState = v;
  }
  startHealthChecks(): void {
    this.fleet.startHealthChecks();
  }
  refreshModels(id: string, address: string): Promise<void> {
    return this.fleet.refreshModels(id, address);
  }
  startRenderProbes(): void {
    this.fleet.startRenderProbes();
  }
  addWorker(spec: WorkerSpec): void {
    this.fleet.addWorker(spec);
  }
  removeWorker(id: string): void {
    this.fleet.removeWorker(id);
  }
  listWorkerCount(): number {
    return this.fleet.listWorkerCount();
  }
  setWorkers(list: WorkerSpec[]): void {
    this.fleet.setWorkers(list);
  }
  setDiscoveryState(ok: boolean, detail: string): void {
    this.fleet.setDiscoveryState(ok, detail);
  }
  setSynced(v: boolean): void {
    this.fleet.setSynced(v);
  }
  readiness(): ReturnType<Fleet["readiness"]> {
    return this.fleet.readiness();
  }

  // ---- KV event intake
  get kv(): KvIntake["kv"] {
    return this.intake.kv;
  }
  eventStatus(id: string): { kv_event_age_s: number | null; kv_events_silent: boolean } {
    return this.intake.eventStatus(id);
  }
  onEvents(id: string, epochKey: EpochKey, seq: number, events: KvEvent[], info?: BatchInfo): void {
    this.intake.onEvents(id, epochKey, seq, events, info);
  }

  // ---- routing
  get admission(): PrefillAdmission {
    return this.routing.admission;
  }
  get director(): Director {
    return this.routing.director;
  }
  route(endpoint: Endpoint, body: Buffer, sessionHeader: string | null, allow?: (w: Worker) => boolean): Pick {
    return this.routing.route(endpoint, body, sessionHeader, allow);
  }
  routeAsync(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    allow?: (w: Worker) => boolean,
  ): Promise<Pick> {
    return this.routing.routeAsync(endpoint, body, sessionHeader, allow);
  }
  /**
   * Resolves when the pick may be sent (null: every admitter let it go, or the
   * wait bound ran out) or with the refusal to answer instead (queue full,
   * evicted by a higher band, expired): runtime/director.ts.
   */
  admit(pick: Pick, objective?: Objective, bytes?: number): Promise<Refused | null> {
    return this.director.admit(pick, objective, bytes);
  }

  async close(): Promise<void> {
    this.fleet.close();
    this.engineMetrics.stop();
    await this.replicas?.close();
    await this.intake.close();
    await this.tok.close();
  }
}
