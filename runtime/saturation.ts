// Engine saturation -> flow control. After every /metrics scrape
// (runtime/engine-metrics.ts) each worker's reading goes through
// core/admission.ts's engineSaturated: a worker whose engine reports
// waiting requests >= --saturation-queue-depth, or KV usage >=
// --saturation-kv-usage, is marked saturated on prefill admission
// (PrefillAdmission.setSaturated), so flow control holds the cold prompts
// picked for it at the router, in their bands and flows, instead of piling
// them onto an engine that already queues; the first scrape that finds it
// under both thresholds clears the mark and its queue drains at once.
//
// This is the Inference Extension's utilization detector applied per worker
// rather than to the pool's average: its score per endpoint is
// max(waiting / queue threshold, KV usage / KV threshold), saturated at 1 or
// more (a queue exactly at the threshold counts), defaults 5 and 0.8 there.
// Here both thresholds are off (0) unless set, so a router that does not ask
// for it behaves as before. Two choices differ from the detector:
// - a worker without figures (a failed or not yet done scrape, an engine that
//   does not export the series) counts as having headroom, where the detector
//   counts stale metrics as saturated: a worker that serves but whose /metrics
//   page fails would otherwise take no cold prompt at all, and a worker that
//   is down is the health checks' business (it leaves the pool);
// - what is held is what prefill admission holds: cold prompts (more than
//   --prefill-admission-warm-tokens uncached) on the kv-aware policy. Warm
//   ones never wait there, saturated or not: their prefill is short and
//   their blocks are cached where they go.
// A held request still goes at --prefill-admission-max-wait-ms, or gets 503
// at --queue-ttl-ms (runtime/flow.ts), and with --queue-late-binding moves to
// a worker that has headroom. The signal is a scrape late: requests sent in
// the meantime are not in the figures yet.
import { engineSaturated, PrefillAdmission } from "../core/admission";
import type { EngineReading } from "../core/engine-readings";
import { LogHook } from "../core/log";

export interface SaturationOptions {
  /** Engine waiting requests at which a worker is saturated; 0 = this signal off. */
  queueDepth: number;
  /** Engine KV usage (0..1) at which a worker is saturated; 0 = this signal off. */
  kvUsage: number;
}

export class SaturationFeed {
  /** Worker ids marked saturated on admission now. */
  private marked: { [id: string]: boolean } = {};

  constructor(
    private readonly admission: () => PrefillAdmission,
    readonly o: SaturationOptions,
    private readonly log: LogHook,
  ) {}

  /** Whether any threshold is set. */
  get on(): boolean {
    return this.o.queueDepth > 0 || this.o.kvUsage > 0;
  }

  /** Whether the worker is marked saturated now. */
  saturated(id: string): boolean {
    return this.marked[id] === true;
  }

  /** One worker's reading after a scrape (null: no figures). */
  update(id: string, r: EngineReading | null): void {
    if (!this.on) return;
    const load = {
      waiting: r && r.waitingRequests !== null ? r.waitingRequests : undefined,
      kvUsage: r && r.kvUsage !== null ? r.kvUsage : undefined,
    };
    const now = engineSaturated(load, this.o.queueDepth, this.o.kvUsage);
    if (now === this.saturated(id)) return;
    if (now) this.marked[id] = true;
    else delete this.marked[id];
    const fields: { [k: string]: string | number } = { worker: id };
    if (load.waiting !== undefined) fields.engine_waiting = load.waiting;
    if (load.kvUsage !== undefined) fields.kv_usage = load.kvUsage;
    this.log("info", now ? "worker saturated: cold prompts wait at the router" : "worker has headroom again", fields);
    this.admission().setSaturated(id, now);
  }

  /** Drops the marks of workers no longer in the fleet (a worker that comes back starts with headroom). */
  retain(ids: string[]): void {
    const live: { [id: string]: boolean } = {};
    for (const id of ids) live[id] = true;
    for (const id of Object.keys(this.marked))
      if (!live[id]) {
        delete this.marked[id];
        this.admission().setSaturated(id, false);
      }
  }
}
