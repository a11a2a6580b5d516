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
import { RenderProbes } from "./probe";

export interface Logger {
  (level: "debug" | "info" | "warn" | "error", line: string): void;
}

export function makeLogger(level: Options["logLevel"]): Logger {
  const rank = { debug: 0, info: 1, warn: 2, error: 3 };
  return (l, line) => {
    if (rank[l] >= rank[level]) process.stderr.write(`${new Date().toISOString()} ${l} ${line}\n`);
  };
}

export interface EventSource {
  subscribe(w: WorkerSpec, onBatch: (seq: number, events: KvEvent[]) => void, onError: (reason: string) => void): Subscription;
  close(): Promise<void>;
}

function zmqEventSource(opts: Options): EventSource {
  return {
    subscribe: (w, onBatch, onError) =>
      subscribeZmq(w.id, w.events as string, opts.kvEventTopic, (_id, seq, evs) => onBatch(seq, evs), (_id, r) => onError(r)),
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
  /** Render-parity probe per worker (null with --render-probe-api off). */
  readonly probes: RenderProbes | null;

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
    this.probes =
      opts.renderProbeApi === "off"
        ? null
        : new RenderProbes(this.tokenizer, { intervalMs: opts.renderProbeIntervalMs, api: opts.renderProbeApi, timeoutMs: 5000 }, (l, line) => log(l, line), this.metrics.registry);
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

  startRenderProbes(): void {
    this.probes?.start();
  }

  /** Adds or updates a worker and (re)subscribes to its KV events. */
  addWorker(spec: WorkerSpec): void {
    const before = this.router.worker(spec.id);
    const w = this.router.addWorker(spec);
    if (this.probes) void this.probes.join(spec.id, w.address);
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
    const sub = this.eventSource.subscribe(
      spec,
      (seq, evs) => this.onEvents(spec.id, epochKey, seq, evs),
      (reason) => {
        this.metrics.eventErrors.inc({ worker: spec.id, reason: reason.startsWith("subscriber") ? "transport" : "malformed" });
        this.log("warn", `kv-events worker=${spec.id} refused frame: ${reason}`);
      },
    );
    this.subs[spec.id] = { sub, epochKey };
    this.log("info", `worker ${spec.id} joined role=${w.role} address=${w.address} events=${spec.events}`);
  }

  removeWorker(id: string): void {
    this.probes?.leave(id);
    if (this.subs[id]) this.subs[id].sub.close();
    delete this.subs[id];
    delete this.failures[id];
    if (this.router.removeWorker(id)) this.log("info", `worker ${id} left; mirror dropped, in-flight reservations kept`);
  }

  setWorkers(list: WorkerSpec[]): void {
    const d = diffFleet(this.router.workers(), list);
    for (const id of d.remove) this.removeWorker(id);
    for (const w of d.add) this.addWorker(w);
  }

  onEvents(id: string, epochKey: EpochKey, seq: number, events: KvEvent[]): void {
    const w = this.router.worker(id);
    if (!w || w.epochKey !== epochKey) return; // a frame from a worker that already left
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
   * gRPC readiness: discovery has delivered its first view, some worker can
   * take a pick, and every worker that names a KV-event endpoint has its
   * subscription open. An idle engine publishes nothing, so "events flow" is
   * judged by the subscription, not by a recent event (that would keep an
   * idle fleet unready forever: no traffic, no events).
   */
  readiness(): { ready: boolean; reason: string } {
    if (!this.discoverySynced) return { ready: false, reason: "discovery has not synced" };
    const ws = this.router.workers();
    const usable = ws.filter((w) => this.router.healthy(w.id) && !this.router.excluded(w.id));
    if (!usable.length) return { ready: false, reason: ws.length ? "no worker is healthy" : "no workers known" };
    const noSub = ws.filter((w) => w.events && !this.subs[w.id]);
    if (noSub.length) return { ready: false, reason: `no KV-event subscription for ${noSub.map((w) => w.id).join(",")}` };
    return { ready: true, reason: `${usable.length} worker(s)` };
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
    this.metrics.pickLatency.observe(Number(process.hrtime.bigint() - t0) / 1e9);
    return pick;
  }

  async close(): Promise<void> {
    if (this.healthTimer) clearInterval(this.healthTimer);
    this.probes?.stop();
    for (const id of Object.keys(this.subs)) this.subs[id].sub.close();
    this.subs = {};
    await this.eventSource.close();
  }
}
