// Composes core with Node: tokenizer, native hash, KV event intake, metrics.
// Transports (gRPC ext_proc, admin HTTP) sit on top of this.
import { createRouter, Pick, Router, Worker, WorkerSpec } from "../core/router";
import { memoryState } from "../core/state/memory";
import { RouterState } from "../core/state/types";
import { EpochKey } from "../core/types";
import { diffFleet } from "../core/fleet";
import { checkSessionId } from "../core/limits";
import { httpError } from "../core/util";
import {
  computeFeatures,
  Endpoint,
  featuresOf,
  mediaSalt,
  parseRequest,
  ParsedRequest,
  promptTokenIds,
} from "../core/request";
import { prefixHashes } from "./prefix-hashes";
import { Features } from "../core/types";
import { prefillAdmission, PrefillAdmission } from "../core/admission";
import { Objective } from "../core/objectives";
import { HealthChecker } from "./health-check";
import { Gauge } from "prom-client";
import { addStats, defaultThreads, JobOutcome, TokenizerPool } from "./tokenpool";
import { applyBatch, forgetMirror, KvEvent, requestRoot } from "../core/kvevents";
import { nativeHasher } from "./hasher";
import { loadTokenizer, LoadedTokenizer } from "./tokenizer";
import { createMetrics, Metrics } from "./metrics";
import { Options } from "./config";
import { BatchInfo, subscribeZmq, Subscription } from "./events";
import { rateLimitedLog } from "./ratelog";
import { RenderProbes } from "./probe";
import { memoryModelTable, ModelTable, withModels } from "../core/models";
import { defaultReplicaId, ReplicaSync } from "./replicas";

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

/** --router-tokenizer-path: one path (every model) or "model=path,model=path[,path]" (a bare path is the default). */
export function tokenizerPaths(v: string | null): { byModel: Record<string, string>; dflt: string | null } {
  if (!v || v.indexOf("=") < 0) return { byModel: {}, dflt: v };
  const byModel: Record<string, string> = {};
  let dflt: string | null = null;
  for (const part of v.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) dflt = part.trim();
    else byModel[part.slice(0, eq).trim()] = part.slice(eq + 1).trim();
  }
  return { byModel, dflt };
}
import { Logger } from "./log";
import { CliError } from "./args";

export { Logger, makeLogger } from "./log";

/**
 * A tokenizer the operator named that cannot be loaded (missing, unreadable,
 * not a tokenizer.json) is a bad flag value: one line naming the flag, exit 2
 * like every other flag error, not a crash's exit 1.
 */
function tokenizerFromFlag(p: string | null, lo: Parameters<typeof loadTokenizer>[1]): LoadedTokenizer | null {
  try {
    return loadTokenizer(p, lo);
  } catch (e) {
    const m = (e as Error).message.split("\n")[0];
    throw new CliError(
      /^--(router-tokenizer-path|tokenizer-backend)\b/.test(m)
        ? m
        : `--router-tokenizer-path ${p ?? "(default)"}: ${m}`,
    );
  }
}

/** A few refused-frame lines per minute per process; the rest are counted (metrics) and summarised. */
export const KV_REFUSED_LOG = {
  level: "warn" as const,
  perWindow: 3,
  windowMs: 60000,
  what: "kv-events refused frame",
};

export interface EventSource {
  /** onState reports the transport's connection state for this subscription, when the transport knows it. */
  subscribe(
    w: WorkerSpec,
    onBatch: (seq: number, events: KvEvent[], info?: BatchInfo) => void,
    onError: (reason: string) => void,
    onState?: (connected: boolean) => void,
  ): Subscription;
  close(): Promise<void>;
}

function zmqEventSource(opts: Options, log?: Logger): EventSource {
  return {
    subscribe: (w, onBatch, onError, onState) =>
      subscribeZmq(
        w.id,
        w.events as string,
        opts.kvEventTopic,
        (_id, seq, evs, info) => onBatch(seq, evs, info),
        (_id, r) => onError(r),
        onState,
        {
          replay: w.replay,
          snapshot: w.snapshot,
          replayTimeoutMs: opts.kvReplayTimeoutMs,
          dpRank: w.dpEvents === "tagged" ? w.dpRank : undefined,
          log: log ? (l, line) => log(l, line) : undefined,
        },
      ),
    close: async () => undefined,
  };
}

/** The KV event transport --kv-event-transport names (shared by the ext_proc app and the nginx bridge). */
export async function eventSourceFor(opts: Options, log: Logger): Promise<EventSource> {
  if (opts.kvEventTransport === "nats")
    return (await import("./nats")).natsEventSource(opts.natsUrl, log, opts.kvReplayTimeoutMs);
  return zmqEventSource(opts, log);
}

export class App {
  /** Which models each worker serves (GET /v1/models); the router's model filter reads it. */
  readonly models: ModelTable = memoryModelTable();
  readonly state: RouterState = withModels(memoryState(), this.models);
  readonly router: Router;
  readonly metrics: Metrics;
  /** The default tokenizer (models without their own). */
  readonly tokenizer: LoadedTokenizer | null;
  /** Per-model tokenizers from --router-tokenizer-path model=path,... */
  readonly tokenizers: Record<string, LoadedTokenizer | null> = {};
  /** LoRA adapter -> base model, from the workers' /v1/models (an adapter renders like its base). */
  private modelParent: Record<string, string> = {};
  /** KV-event subscription per worker, tagged with the epoch it feeds. */
  private subs: Record<string, { sub: Subscription; epochKey: EpochKey }> = {};
  private modelTimer: NodeJS.Timeout | null = null;
  /** Active health checks (startHealthChecks): with them on, a worker counts for readiness once it has passed one. */
  readonly health: HealthChecker;
  private eventSource: EventSource;
  private discoverySynced = false;
  /** Per worker: when its events last arrived, picks since, whether it is flagged silent. */
  readonly kv: Record<string, { since: number; lastEvent: number | null; picksSinceEvent: number; silent: boolean }> =
    {};
  private silenceTimer: NodeJS.Timeout | null = null;
  /** Refused KV-event frames: every one counted, a few logged per minute (runtime/ratelog.ts). */
  private readonly kvRefused = rateLimitedLog((l, m, f) => this.log(l, m, f), KV_REFUSED_LOG);
  private readonly kvGaps = rateLimitedLog((l, m, f) => this.log(l, m, f), {
    ...KV_REFUSED_LOG,
    what: "kv-events sequence gap",
  });
  /** Render-parity probe per worker (null with --render-probe-api off). */
  readonly probes: RenderProbes | null;
  /** Per worker: is its KV event transport connected (absent = unknown yet). */
  private eventsUp: Record<string, boolean> = {};
  /** Per worker: has a KV event batch arrived (transports without connection state). */
  private eventsSeen: Record<string, boolean> = {};
  /** --replica-sync nats: in-flight load shared with the other router replicas. */
  readonly replicas: ReplicaSync | null = null;
  /** Tokenizer threads for long prompts; started on first need (or by warmTokenizers). */
  private pool: TokenizerPool | null = null;
  /** The --router-tokenizer-path entry each loaded tokenizer came from (threads load their own copy). */
  private tokKeys = new Map<LoadedTokenizer, string>();
  /** Block hashes of recent prompts, so a conversation's next turn hashes only its new blocks. */
  private hashes = prefixHashes(nativeHasher);
  /** Cold prefills in flight per worker (core/admission.ts); kv-aware only: other policies do not know what is cold. */
  readonly admission: PrefillAdmission;
  /** Set on SIGTERM: readiness goes false so load balancers stop sending. */
  draining = false;
  /** Discovery's connection state (static discovery is always connected). */
  discoveryState: { ok: boolean; detail: string } = { ok: true, detail: "connected" };

  constructor(
    readonly opts: Options,
    readonly log: Logger,
    eventSource?: EventSource,
  ) {
    const tp = tokenizerPaths(opts.tokenizerPath);
    const lo = { backend: opts.tokenize.backend };
    this.tokenizer = tokenizerFromFlag(tp.dflt, lo);
    if (this.tokenizer) this.tokKeys.set(this.tokenizer, tp.dflt ?? "");
    for (const m of Object.keys(tp.byModel)) {
      const t = (this.tokenizers[m] = tokenizerFromFlag(tp.byModel[m], lo));
      if (t) this.tokKeys.set(t, tp.byModel[m]);
    }
    for (const t of this.tokKeys.keys())
      log(
        "info",
        `tokenizer ${t.source}: ${t.backend === "fast-bpe" ? "fast byte-level BPE (runtime/fastbpe.ts, the file's own merges; --tokenizer-backend hf for @huggingface/tokenizers)" : "@huggingface/tokenizers (fast BPE not used: " + t.fallbackReason + ")"}`,
      );
    this.admission = prefillAdmission({
      slots: opts.router.policy === "kv-aware" ? opts.admission.slots : 0,
      warmTokens: opts.admission.warmTokens,
    });
    this.metrics = createMetrics(
      () => this.router,
      () => this.cacheStats(),
      (id) => this.eventStatus(id),
      (id) => !this.health.running || this.health.hasPassed(id),
    );
    const admission = this.admission;
    new Gauge({
      name: "infera_router_admission_waiting",
      help: "Requests waiting at the router for a prefill slot, per priority band (--objectives)",
      labelNames: ["priority"],
      registers: [this.metrics.registry],
      collect() {
        this.reset();
        const w = admission.waitingByPriority();
        for (const p in w) this.set({ priority: p }, w[p]);
      },
    });
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
      log: (l, line) => log(l, line),
      onPick: (role, p) => {
        this.metrics.picks.inc({ worker: p.worker, role, policy: p.policy });
        const k = this.kv[p.worker];
        if (k) k.picksSinceEvent++;
        this.metrics.hitBlocks.inc({ worker: p.worker, role }, p.hits);
        this.metrics.reqBlocks.inc({ role }, p.blocks);
      },
      onDemand: (d) => this.metrics.decisions.inc({ mode: d.mode, input: d.input, agrees: String(d.agrees) }),
      onPdPath: (path) => this.metrics.pdPaths.inc({ path }),
      onTiming: (worker, predicted, ms) => {
        if (predicted !== null && ms > 0)
          this.metrics.ttftPredictionError.observe({ worker }, Math.abs(predicted - ms) / ms);
      },
    });
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
    this.eventSource = eventSource ?? zmqEventSource(opts, log);
    this.probes =
      opts.renderProbeApi === "off"
        ? null
        : new RenderProbes(
            (id) => this.probeTarget(id),
            { intervalMs: opts.renderProbeIntervalMs, api: opts.renderProbeApi, timeoutMs: 5000 },
            (l, line) => log(l, line),
            this.metrics.registry,
          );
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
    for (const k of Object.keys(m.parent)) this.modelParent[k] = m.parent[k];
  }

  private probeTarget(id: string): { tok: LoadedTokenizer | null; model: string | null } {
    const ms = this.models.get(id);
    const model = ms && ms.length ? ms[0] : null;
    return { tok: model ? this.tokenizerFor(model) : this.tokenizer, model };
  }

  /** The tokenizer for a model: its own, its base model's (LoRA), else the default. */
  tokenizerFor(model: string): LoadedTokenizer | null {
    if (model in this.tokenizers) return this.tokenizers[model];
    const base = this.modelParent[model];
    if (base !== undefined && base in this.tokenizers) return this.tokenizers[base];
    return this.tokenizer;
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
    const prev = this.subs[spec.id];
    if (prev && prev.epochKey === w.epochKey) return;
    // Unchanged and without events (setWorkers re-adds the whole fleet): nothing to (re)say.
    if (!prev && !spec.events && before && before.epochKey === w.epochKey) return;
    if (prev) prev.sub.close();
    delete this.subs[spec.id];
    if (!spec.events) {
      this.log("warn", `worker ${spec.id} has no KV event endpoint: routing to it by load only`);
      return;
    }
    const epochKey = w.epochKey;
    this.kv[spec.id] = { since: Date.now(), lastEvent: null, picksSinceEvent: 0, silent: false };
    this.startSilenceCheck();
    let sub: Subscription;
    try {
      sub = this.eventSource.subscribe(
        spec,
        (seq, evs, info) => this.onEvents(spec.id, epochKey, seq, evs, info),
        (reason) => {
          this.metrics.eventErrors.inc({
            worker: spec.id,
            reason: reason.startsWith("subscriber") ? "transport" : "malformed",
          });
          this.kvRefused(spec.id, `kv-events worker=${spec.id} refused frame: ${reason}`);
        },
        (up) => {
          if (this.subs[spec.id]?.epochKey !== epochKey) return;
          const was = this.eventsUp[spec.id];
          if (was !== up)
            this.log(up ? "info" : "warn", `kv-events worker=${spec.id} ${up ? "connected" : "disconnected"}`, {
              worker: spec.id,
              events: spec.events,
            });
          this.eventsUp[spec.id] = up;
          // A dropped event stream is often the engine dying: probe it now, not at the next interval.
          if (was === true && !up && this.health.running) void this.health.probe(spec.id, true);
        },
      );
    } catch (e) {
      // A transport refusing the endpoint must not take the process down: route by load.
      this.metrics.eventErrors.inc({ worker: spec.id, reason: "transport" });
      this.log(
        "warn",
        `kv-events worker=${spec.id} cannot subscribe to ${spec.events}: ${(e as Error).message}; routing to it by load only`,
      );
      return;
    }
    this.subs[spec.id] = { sub, epochKey };
    this.log("info", `worker ${spec.id} joined role=${w.role} address=${w.address} events=${spec.events}`);
  }

  removeWorker(id: string): void {
    this.probes?.leave(id);
    this.models.set(id, null);
    delete this.eventsUp[id];
    delete this.eventsSeen[id];
    if (this.subs[id]) this.subs[id].sub.close();
    delete this.subs[id];
    this.health.leave(id);
    delete this.kv[id];
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

  /** Flags workers whose events endpoint went quiet while they were being picked (--kv-event-silence-s). */
  private startSilenceCheck(): void {
    if (this.silenceTimer || !(this.opts.kvEventSilenceS > 0)) return;
    const limit = this.opts.kvEventSilenceS * 1000;
    this.silenceTimer = setInterval(
      () => {
        const now = Date.now();
        for (const id of Object.keys(this.kv)) {
          const k = this.kv[id];
          const quiet = now - (k.lastEvent ?? k.since);
          if (!k.silent && quiet >= limit && k.picksSinceEvent > 0) {
            k.silent = true;
            this.log(
              "warn",
              `kv-events worker=${id} sent nothing for ${Math.round(quiet / 1000)}s while serving ${k.picksSinceEvent} pick(s): check its --kv-events-config (endpoint, topic '${this.opts.kvEventTopic}')`,
            );
          }
        }
      },
      Math.min(1000, limit / 2),
    );
    this.silenceTimer.unref();
  }

  /** Seconds since the worker's last KV event batch (since it joined when none yet), and the silence flag. */
  eventStatus(id: string): { kv_event_age_s: number | null; kv_events_silent: boolean } {
    const k = this.kv[id];
    if (!k) return { kv_event_age_s: null, kv_events_silent: false };
    return { kv_event_age_s: (Date.now() - (k.lastEvent ?? k.since)) / 1000, kv_events_silent: k.silent };
  }

  onEvents(id: string, epochKey: EpochKey, seq: number, events: KvEvent[], info?: BatchInfo): void {
    const w = this.router.worker(id);
    if (!w || w.epochKey !== epochKey) return; // a frame from a worker that already left
    this.eventsSeen[id] = true;
    const k = this.kv[id];
    if (k) {
      if (k.silent) this.log("info", `kv-events worker=${id} events flowing again`);
      k.lastEvent = Date.now();
      k.picksSinceEvent = 0;
      k.silent = false;
    }
    if (info?.restart) {
      forgetMirror(this.state.mirror, epochKey);
      this.metrics.eventErrors.inc({ worker: id, reason: "engine_restart" });
    }
    if (info?.unknown) this.metrics.eventErrors.inc({ worker: id, reason: "unknown_event" }, info.unknown);
    if (info?.replayed) this.metrics.events.inc({ worker: id, type: "replayed_batch" });
    const r = applyBatch(this.state.mirror, epochKey, seq, events, this.opts.router.blockSize, {
      hasher: nativeHasher,
      maxBlocks: this.opts.maxMirrorBlocks,
      onEvict: (_t, n) => this.metrics.events.inc({ worker: id, type: "evicted" }, n),
    });
    if (r.gap) {
      this.metrics.eventErrors.inc({ worker: id, reason: "sequence_gap" });
      this.kvGaps(
        id,
        `kv-events worker=${id} sequence gap at seq=${info?.seqText ?? seq} that replay could not fill${w.replay ? "" : " (no replay endpoint)"}: mirror cleared, resyncing from live events`,
      );
    }
    if (r.resync) {
      this.metrics.events.inc({ worker: id, type: "snapshot_resync" });
      if (r.resync.unknown)
        this.metrics.eventErrors.inc({ worker: id, reason: "snapshot_unknown_block" }, r.resync.unknown);
      this.log(
        "info",
        `kv-events worker=${id} resynced from its snapshot at seq=${info?.seqText ?? seq}: ${r.resync.kept} mirrored block(s) kept, ${r.resync.unknown} never seen stored (left out until stored again)`,
      );
    }
    if (r.otherGroup) this.metrics.events.inc({ worker: id, type: "other_group" }, r.otherGroup);
    if (r.fatal) {
      this.metrics.eventErrors.inc({ worker: id, reason: "block_size_mismatch" });
      this.router.exclude(id, r.fatal);
      return;
    }
    if (r.stored) this.metrics.events.inc({ worker: id, type: "stored" }, r.stored);
    if (r.removed) this.metrics.events.inc({ worker: id, type: "removed" }, r.removed);
    if (r.cleared) this.metrics.events.inc({ worker: id, type: "cleared" });
    if (r.skipped) this.metrics.eventErrors.inc({ worker: id, reason: "unknown_parent" }, r.skipped);
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
    // A stream counts until its transport reports it down (an endpoint still
    // connecting is not known to be broken); one that delivered counts anyway.
    const flowing = withEvents.filter((w) => this.eventsUp[w.id] !== false || this.eventsSeen[w.id] === true);
    const noSub = ws.filter((w) => w.events && !this.subs[w.id]);
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

  /** Piece-cache counters of the event loop's tokenizer plus every tokenizer thread. */
  cacheStats(): { hitTokens: number; missTokens: number; pieces: number; chars: number } | null {
    if (!this.tokenizer) return null;
    const s = { ...this.tokenizer.cacheStats() };
    if (this.pool) addStats(s, this.pool.stats());
    return s;
  }

  /** The tokenizer threads (null with --tokenizer-threads 0 or no tokenizer). */
  tokenizerPool(): TokenizerPool | null {
    if (this.pool) return this.pool;
    const threads = this.opts.tokenize.threads ?? defaultThreads();
    if (!threads || !this.tokKeys.size) return null;
    this.pool = new TokenizerPool(
      {
        keys: [...new Set(this.tokKeys.values())],
        threads,
        queueMax: this.opts.tokenize.queue,
        timeoutMs: this.opts.tokenize.timeoutMs,
        backend: this.opts.tokenize.backend,
      },
      (l, m) => this.log(l, m),
    );
    return this.pool;
  }

  /** Starts the tokenizer threads and has each load every tokenizer now, not on the first long prompt. */
  async warmTokenizers(): Promise<void> {
    const pool = this.tokenizerPool();
    if (!pool) return;
    await pool.ready();
    this.log(
      "info",
      `tokenizer threads: ${pool.threads()} (prompts over ${this.opts.tokenize.inlineChars} chars; bound ${this.opts.tokenize.timeoutMs} ms, queue ${this.opts.tokenize.queue})`,
    );
  }

  private parse(endpoint: Endpoint, body: Buffer, sessionHeader: string | null): ParsedRequest {
    return parseRequest(
      endpoint,
      body.length <= this.opts.maxBodyBytes ? body.toString("utf8") : "",
      body.length,
      {
        maxBodyBytes: this.opts.maxBodyBytes,
        maxMessages: this.opts.maxMessages,
        maxMedia: this.opts.maxImages,
        maxJsonDepth: this.opts.maxJsonDepth,
      },
      sessionHeader,
    );
  }

  /** Features from the estimated token count, no blocks; failure: why tokenizing failed (logged). */
  private estimated(req: ParsedRequest, root: string | null, failure?: Error): Features {
    // A tokenizer failure must not fail the request: fall back to the estimate.
    if (failure) this.log("warn", `tokenize failed (${failure.message}); routing on estimated tokens`);
    return computeFeatures(req, null, this.opts.router.blockSize, nativeHasher, root);
  }

  /** text: the prompt already rendered by the caller (rendering twice costs as much as encoding a short one). */
  private featuresInline(req: ParsedRequest, root: string | null, text?: string): Features {
    try {
      const tok = this.tokenizerFor(req.model);
      const ids =
        text !== undefined && tok && !req.promptTokens
          ? req.addSpecialTokens && tok.encodeSpecial
            ? tok.encodeSpecial(text)
            : tok.encode(text)
          : promptTokenIds(req, tok);
      if (!ids) return this.estimated(req, root);
      const ms = mediaSalt(req, nativeHasher, root);
      return featuresOf(req, ids.length, this.hashes.hash(ids, this.opts.router.blockSize, ms.salt), ms.mediaHashes);
    } catch (e) {
      return this.estimated(req, root, e as Error);
    }
  }

  /** Parse, tokenize once, pick, all on the caller's turn. Throws httpError(4xx/503) for the caller to render. */
  route(endpoint: Endpoint, body: Buffer, sessionHeader: string | null, allow?: (w: Worker) => boolean): Pick {
    const t0 = process.hrtime.bigint();
    const req = this.parse(endpoint, body, sessionHeader);
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    return this.finishPick(req, this.featuresInline(req, root), t0, allow);
  }

  /**
   * route(), with a long prompt tokenized and hashed on a tokenizer thread so
   * the event loop keeps serving other picks and KV events meanwhile. A
   * prompt over the time bound or a full queue rejects with 413/503.
   */
  async routeAsync(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    allow?: (w: Worker) => boolean,
  ): Promise<Pick> {
    const t0 = process.hrtime.bigint();
    const req = this.parse(endpoint, body, sessionHeader);
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    const tok = req.promptTokens ? null : this.tokenizerFor(req.model);
    const key = tok ? this.tokKeys.get(tok) : undefined;
    let text: string | null = null;
    if (tok && key !== undefined) {
      try {
        text = req.chat ? tok.renderChat(req.chat) : (req.prompt as string);
      } catch (e) {
        text = null; // featuresInline reports it and falls back to the estimate
      }
    }
    const pool = text !== null && text.length > this.opts.tokenize.inlineChars ? this.tokenizerPool() : null;
    if (!pool || text === null)
      return this.finishPick(req, this.featuresInline(req, root, text ?? undefined), t0, allow);
    const ms = mediaSalt(req, nativeHasher, root);
    let feats: Features;
    try {
      const job = pool.encode(
        key!,
        text,
        !!(req.addSpecialTokens && tok!.encodeSpecial),
        this.opts.router.blockSize,
        ms.salt ?? null,
      );
      this.metrics.tokenizeQueue.set(pool.depth());
      const r = await job;
      this.metrics.tokenizeQueue.set(pool.depth());
      this.metrics.tokenizeJobs.inc({ outcome: "ok" });
      feats = featuresOf(req, r.tokens, r.blocks as Features["blocks"], ms.mediaHashes);
    } catch (e) {
      this.metrics.tokenizeQueue.set(pool.depth());
      const status = (e as { status?: number }).status;
      this.metrics.tokenizeJobs.inc({ outcome: (e as { outcome?: JobOutcome }).outcome ?? "error" });
      if (status) throw e;
      feats = this.estimated(req, root, e as Error);
    }
    return this.finishPick(req, feats, t0, allow);
  }

  private finishPick(req: ParsedRequest, feats: Features, t0: bigint, allow?: (w: Worker) => boolean): Pick {
    const endpoint = req.endpoint;
    checkSessionId(req.sessionId, this.opts.maxSessionIdBytes);
    // Before discovery's first view an empty fleet means "not yet", not "none".
    if (!this.discoverySynced && !this.router.workers().length)
      throw httpError(
        503,
        "no workers available: no worker yet (discovery has not delivered the fleet)",
        "service_unavailable",
      );
    // A worker that renders differently counts other tokens than ours: demand is then an estimate.
    if (feats.exact && this.probes && this.probes.anyDiverged()) feats = { ...feats, exact: false };
    const pick = this.router.pick(feats, req.sessionId, allow);
    pick.stream = req.stream;
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    this.metrics.pickLatency.observe(secs);
    // Costs and counts only: prompt text never reaches the logs.
    if (this.opts.logLevel === "debug")
      this.log("debug", "pick", {
        endpoint,
        worker: pick.target.id,
        prefill: pick.prefill?.id ?? null,
        blocks: feats.blocks.length,
        input_tokens: feats.inputTokens,
        candidates: pick.candidates.map((c) => ({ id: c.id, cost: c.cost, hits: c.hits, active: c.active })),
        decode_candidates:
          pick.decodeCandidates?.map((c) => ({ id: c.id, cost: c.cost, hits: c.hits, active: c.active })) ?? null,
        pick_ms: +(secs * 1000).toFixed(3),
      });
    return pick;
  }

  /**
   * Whether a sheddable request (priority < 0) is refused now: it would have
   * to wait for a prefill slot on its worker, so that worker is saturated
   * with cold prefills. Anything of priority 0 or more waits instead.
   */
  shed(pick: Pick, objective: Objective): boolean {
    if (objective.priority >= 0 || !this.admission.wouldWait((pick.prefill ?? pick.target).id, pick.uncachedTokens))
      return false;
    this.metrics.shed.inc({ priority: String(objective.priority) });
    return true;
  }

  /**
   * Resolves when the pick may be sent: at once, or when a cold prefill ahead
   * of it on its prefill worker reaches its first token, or after
   * --prefill-admission-max-wait-ms. The pick's reservation is wrapped so its
   * slot is given back at first token or at its end, whichever comes first;
   * finishing it while it waits (the client went away) resolves it too.
   */
  admit(pick: Pick, objective?: Objective): Promise<void> {
    const key = (pick.prefill ?? pick.target).id;
    const t0 = performance.now();
    let timer: NodeJS.Timeout | null = null;
    let resolve!: () => void;
    const ready = new Promise<void>((r) => (resolve = r));
    const ticket = this.admission.enter(
      key,
      pick.uncachedTokens,
      () => {
        // Its worker's first token is timed from here, not from the pick.
        pick.reservation.dispatched();
        if (timer) {
          clearTimeout(timer);
          this.metrics.admissionWait.observe((performance.now() - t0) / 1000);
        }
        resolve();
      },
      objective,
    );
    // Warm (or admission off): no slot to give back, nothing to wrap.
    if (ticket.admitted && !ticket.slot) return ready;
    if (!ticket.admitted) {
      timer = setTimeout(() => {
        this.metrics.admissionForced.inc();
        this.log(
          "info",
          `prefill admission: a request waited ${this.opts.admission.maxWaitMs} ms for ${key}; sent past the limit`,
        );
        ticket.force();
      }, this.opts.admission.maxWaitMs);
      timer.unref();
    }
    const inner = pick.reservation;
    pick.reservation = {
      get open() {
        return inner.open;
      },
      guards: () => inner.guards(),
      dispatched: () => inner.dispatched(),
      firstToken() {
        ticket.leave();
        inner.firstToken();
      },
      finish() {
        if (timer) clearTimeout(timer);
        ticket.leave();
        resolve();
        inner.finish();
      },
    };
    return ready;
  }

  async close(): Promise<void> {
    this.health.stop();
    if (this.silenceTimer) clearInterval(this.silenceTimer);
    this.kvRefused.close();
    this.kvGaps.close();
    this.probes?.stop();
    if (this.modelTimer) clearInterval(this.modelTimer);
    for (const id of Object.keys(this.subs)) this.subs[id].sub.close();
    this.subs = {};
    await this.replicas?.close();
    await this.eventSource.close();
    if (this.pool) await this.pool.close();
  }
}
