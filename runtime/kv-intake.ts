// KV event intake: one subscription per worker (tagged with the epoch it
// feeds), each batch applied to the mirror, and what readiness and the admin
// views say of each stream (connected, last event, silent while picked).
import { Router, Worker, WorkerSpec } from "../core/router";
import { RouterState } from "../core/state/types";
import { EpochKey } from "../core/types";
import { applyBatch, forgetMirror, KvEvent } from "../core/kvevents";
import { nativeHasher } from "./hasher";
import { Metrics } from "./metrics";
import { Options } from "./config";
import { BatchInfo, subscribeZmq, Subscription } from "./events";
import { rateLimitedLog } from "./ratelog";
import { Logger } from "./log";

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

export function zmqEventSource(opts: Options, log?: Logger): EventSource {
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
          log: log ? (l, line, f) => log(l, line, f) : undefined,
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

export class KvIntake {
  /** KV-event subscription per worker, tagged with the epoch it feeds. */
  private subs: Record<string, { sub: Subscription; epochKey: EpochKey }> = {};
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
  /** Per worker: is its KV event transport connected (absent = unknown yet). */
  private eventsUp: Record<string, boolean> = {};
  /** Per worker: has a KV event batch arrived (transports without connection state). */
  private eventsSeen: Record<string, boolean> = {};

  constructor(
    private readonly opts: Options,
    private readonly log: Logger,
    private readonly metrics: Metrics,
    private readonly router: Router,
    private readonly state: RouterState,
    private readonly eventSource: EventSource,
    /** A stream that was up went down: often the engine dying (the fleet probes it now). */
    private readonly onDisconnect: (id: string) => void,
  ) {}

  /** (Re)subscribes to a worker's events after it joined or changed (before: its entry until now). */
  subscribe(spec: WorkerSpec, w: Worker, before: Worker | null): void {
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
          if (was === true && !up) this.onDisconnect(spec.id);
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

  /** A worker left: its subscription and stream state go. */
  leave(id: string): void {
    delete this.eventsUp[id];
    delete this.eventsSeen[id];
    if (this.subs[id]) this.subs[id].sub.close();
    delete this.subs[id];
    delete this.kv[id];
  }

  /** A pick went to the worker (the silence check counts picks since its last event). */
  picked(id: string): void {
    const k = this.kv[id];
    if (k) k.picksSinceEvent++;
  }

  subscribed(id: string): boolean {
    return !!this.subs[id];
  }

  /** A stream counts until its transport reports it down (an endpoint still connecting is not known to be broken); one that delivered counts anyway. */
  flowing(id: string): boolean {
    return this.eventsUp[id] !== false || this.eventsSeen[id] === true;
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

  async close(): Promise<void> {
    if (this.silenceTimer) clearInterval(this.silenceTimer);
    this.kvRefused.close();
    this.kvGaps.close();
    for (const id of Object.keys(this.subs)) this.subs[id].sub.close();
    this.subs = {};
    await this.eventSource.close();
  }
}
