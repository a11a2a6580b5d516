// Composes core with Node: tokenizer, native hash, KV event intake, metrics.
// Transports (gRPC ext_proc, admin HTTP) sit on top of this.
import { createRouter, Pick, Router, Worker, WorkerSpec } from "../core/router";
import { memoryState } from "../core/state/memory";
import { RouterState } from "../core/state/types";
import { EpochKey } from "../core/types";
import { diffFleet } from "../core/fleet";
import { checkSessionId } from "../core/limits";
import { computeFeatures, Endpoint, parseRequest } from "../core/request";
import { applyBatch, KvEvent } from "../core/kvevents";
import { nativeHasher } from "./hasher";
import { loadTokenizer, LoadedTokenizer } from "./tokenizer";
import { createMetrics, Metrics } from "./metrics";
import { Options } from "./config";
import { subscribeZmq, Subscription } from "./events";
import { Logger } from "../runtime/log";

export { Logger, makeLogger } from "../runtime/log";

export interface EventSource {
  /** onState reports the transport's connection state for this subscription, when the transport knows it. */
  subscribe(w: WorkerSpec, onBatch: (seq: number, events: KvEvent[]) => void, onError: (reason: string) => void, onState?: (connected: boolean) => void): Subscription;
  close(): Promise<void>;
}

function zmqEventSource(opts: Options): EventSource {
  return {
    subscribe: (w, onBatch, onError, onState) =>
      subscribeZmq(w.id, w.events as string, opts.kvEventTopic, (_id, seq, evs) => onBatch(seq, evs), (_id, r) => onError(r), onState),
    close: async () => undefined,
  };
}

/** The KV event transport --kv-event-transport names (shared by the ext_proc app and the nginx bridge). */
export async function eventSourceFor(opts: Options, log: Logger): Promise<EventSource> {
  if (opts.kvEventTransport === "nats") return (await import("./nats")).natsEventSource(opts.natsUrl, log);
  return zmqEventSource(opts);
}

export class App {
  readonly state: RouterState = memoryState();
  readonly router: Router;
  readonly metrics: Metrics;
  readonly tokenizer: LoadedTokenizer | null;
  /** KV-event subscription per worker, tagged with the epoch it feeds. */
  private subs: Record<string, { sub: Subscription; epochKey: EpochKey }> = {};
  private healthTimer: NodeJS.Timeout | null = null;
  private failures: Record<string, number> = {};
  private eventSource: EventSource;
  private discoverySynced = false;
  /** Per worker: is its KV event transport connected (absent = unknown yet). */
  private eventsUp: Record<string, boolean> = {};
  /** Per worker: has a KV event batch arrived (transports without connection state). */
  private eventsSeen: Record<string, boolean> = {};
  /** Set on SIGTERM: readiness goes false so load balancers stop sending. */
  draining = false;
  /** Discovery's connection state (static discovery is always connected). */
  discoveryState: { ok: boolean; detail: string } = { ok: true, detail: "connected" };

  constructor(readonly opts: Options, readonly log: Logger, eventSource?: EventSource) {
    this.tokenizer = loadTokenizer(opts.tokenizerPath);
    this.metrics = createMetrics(() => this.router);
    this.router = createRouter(this.state, opts.router, {
      log: (l, line) => log(l, line),
      onPick: (role, p) => {
        this.metrics.picks.inc({ worker: p.worker, role, policy: p.policy });
        this.metrics.hitBlocks.inc({ worker: p.worker, role }, p.hits);
        this.metrics.reqBlocks.inc({ role }, p.blocks);
      },
      onDemand: (d) => this.metrics.decisions.inc({ mode: d.mode, input: d.input, agrees: String(d.agrees) }),
    });
    this.eventSource = eventSource ?? zmqEventSource(opts);
  }

  /** Builds the app with the event transport named by --kv-event-transport. */
  static async create(opts: Options, log: Logger): Promise<App> {
    return new App(opts, log, await eventSourceFor(opts, log));
  }

  /** Starts active health checks (vLLM and SGLang both serve GET /health). */
  startHealthChecks(): void {
    if (!this.opts.healthIntervalMs || this.healthTimer) return;
    const tick = async () => {
      await Promise.all(
        this.router.workers().map(async (w) => {
          let ok = false;
          try {
            const r = await fetch(`http://${w.address}/health`, { signal: AbortSignal.timeout(Math.max(200, this.opts.healthIntervalMs)) });
            ok = r.ok;
            await r.arrayBuffer().catch(() => undefined);
          } catch {
            ok = false;
          }
          this.failures[w.id] = ok ? 0 : (this.failures[w.id] ?? 0) + 1;
          if (ok) this.router.setHealthy(w.id, true);
          else if (this.failures[w.id] >= 2) this.router.setHealthy(w.id, false);
        }),
      );
    };
    this.healthTimer = setInterval(() => void tick(), this.opts.healthIntervalMs);
    this.healthTimer.unref();
  }

  /** Adds or updates a worker and (re)subscribes to its KV events. */
  addWorker(spec: WorkerSpec): void {
    const before = this.router.worker(spec.id);
    const w = this.router.addWorker(spec);
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
    let sub: Subscription;
    try {
      sub = this.eventSource.subscribe(
        spec,
        (seq, evs) => this.onEvents(spec.id, epochKey, seq, evs),
        (reason) => {
          this.metrics.eventErrors.inc({ worker: spec.id, reason: reason.startsWith("subscriber") ? "transport" : "malformed" });
          this.log("warn", `kv-events worker=${spec.id} refused frame: ${reason}`);
        },
        (up) => {
          if (this.subs[spec.id]?.epochKey !== epochKey) return;
          if (this.eventsUp[spec.id] !== up) this.log(up ? "info" : "warn", `kv-events worker=${spec.id} ${up ? "connected" : "disconnected"}`, { worker: spec.id, events: spec.events });
          this.eventsUp[spec.id] = up;
        },
      );
    } catch (e) {
      // A transport refusing the endpoint must not take the process down: route by load.
      this.metrics.eventErrors.inc({ worker: spec.id, reason: "transport" });
      this.log("warn", `kv-events worker=${spec.id} cannot subscribe to ${spec.events}: ${(e as Error).message}; routing to it by load only`);
      return;
    }
    this.subs[spec.id] = { sub, epochKey };
    this.log("info", `worker ${spec.id} joined role=${w.role} address=${w.address} events=${spec.events}`);
  }

  removeWorker(id: string): void {
    delete this.eventsUp[id];
    delete this.eventsSeen[id];
    if (this.subs[id]) this.subs[id].sub.close();
    delete this.subs[id];
    delete this.failures[id];
    if (this.router.removeWorker(id)) this.log("info", `worker ${id} left; mirror dropped, in-flight reservations kept`);
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

  onEvents(id: string, epochKey: EpochKey, seq: number, events: KvEvent[]): void {
    const w = this.router.worker(id);
    if (!w || w.epochKey !== epochKey) return; // a frame from a worker that already left
    this.eventsSeen[id] = true;
    const r = applyBatch(this.state.mirror, epochKey, seq, events, this.opts.router.blockSize, nativeHasher);
    if (r.gap) {
      this.metrics.eventErrors.inc({ worker: id, reason: "sequence_gap" });
      this.log("warn", `kv-events worker=${id} sequence gap at seq=${seq}: mirror cleared, resyncing from live events`);
    }
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
   * Readiness, for /readyz and gRPC health: not draining; discovery has
   * delivered its first view and is connected (etcd watch live; static always);
   * some worker can take a pick (healthy, not excluded); and KV events flow:
   * every worker naming an event endpoint has its subscription open, and among
   * routable ones at least one stream is not reported down by its transport. An idle
   * engine publishes nothing, so "flowing" is judged by the connection, not by
   * a recent event (that would keep an idle fleet unready forever).
   */
  readiness(): { ready: boolean; reason: string; checks: Record<string, { ok: boolean; detail: string }> } {
    const ws = this.router.workers();
    const routable = ws.filter((w) => this.router.healthy(w.id) && !this.router.excluded(w.id));
    const withEvents = routable.filter((w) => w.events);
    // A stream counts until its transport reports it down (an endpoint still
    // connecting is not known to be broken); one that delivered counts anyway.
    const flowing = withEvents.filter((w) => this.eventsUp[w.id] !== false || this.eventsSeen[w.id] === true);
    const noSub = ws.filter((w) => w.events && !this.subs[w.id]);
    const checks = {
      draining: { ok: !this.draining, detail: this.draining ? "shutting down" : "no" },
      discovery: { ok: this.discoverySynced && this.discoveryState.ok, detail: this.discoverySynced ? this.discoveryState.detail : "discovery has not synced" },
      workers: { ok: routable.length > 0, detail: ws.length ? `${routable.length} routable of ${ws.length}` : "no workers known" },
      events: {
        ok: noSub.length === 0 && (withEvents.length === 0 || flowing.length > 0),
        detail: noSub.length
          ? `no KV-event subscription for ${noSub.map((w) => w.id).join(",")}`
          : withEvents.length === 0
            ? "no worker publishes KV events (load-only routing)"
            : `${flowing.length} of ${withEvents.length} streams up`,
      },
    };
    const failing = Object.entries(checks).find(([, c]) => !c.ok);
    return { ready: !failing, reason: failing ? `${failing[0]}: ${failing[1].detail}` : `${routable.length} worker(s)`, checks };
  }

  /** Parse, tokenize once, pick. Throws httpError(4xx/503) for the caller to render. */
  route(endpoint: Endpoint, body: Buffer, sessionHeader: string | null, allow?: (w: Worker) => boolean): Pick {
    const t0 = process.hrtime.bigint();
    const req = parseRequest(endpoint, body.length <= this.opts.maxBodyBytes ? body.toString("utf8") : "", body.length, { maxBodyBytes: this.opts.maxBodyBytes }, sessionHeader);
    let feats;
    try {
      feats = computeFeatures(req, this.tokenizer, this.opts.router.blockSize, nativeHasher);
    } catch (e) {
      // A tokenizer failure must not fail the request: fall back to the estimate.
      this.log("warn", `tokenize failed (${(e as Error).message}); routing on estimated tokens`);
      feats = computeFeatures(req, null, this.opts.router.blockSize, nativeHasher);
    }
    checkSessionId(req.sessionId, this.opts.maxSessionIdBytes);
    const pick = this.router.pick(feats, req.sessionId, allow);
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    this.metrics.pickLatency.observe(secs);
    // Costs and counts only: prompt text never reaches the logs.
    if (this.opts.logLevel === "debug") this.log("debug", "pick", {
      endpoint,
      worker: pick.target.id,
      prefill: pick.prefill?.id ?? null,
      blocks: feats.blocks.length,
      input_tokens: feats.inputTokens,
      candidates: pick.candidates.map((c) => ({ id: c.id, cost: c.cost, hits: c.hits, active: c.active })),
      decode_candidates: pick.decodeCandidates?.map((c) => ({ id: c.id, cost: c.cost, hits: c.hits, active: c.active })) ?? null,
      pick_ms: +(secs * 1000).toFixed(3),
    });
    return pick;
  }

  async close(): Promise<void> {
    if (this.healthTimer) clearInterval(this.healthTimer);
    for (const id of Object.keys(this.subs)) this.subs[id].sub.close();
    this.subs = {};
    await this.eventSource.close();
  }
}
