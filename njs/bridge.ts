// infera-bridge: feeds NGINX's njs router. It runs discovery and subscribes to
// KV events exactly like the ext_proc server, but instead of a local mirror it
// pushes the fleet and every event batch, in order, to nginx's internal push
// location, where njs applies them to its shared dicts.
//
// It never drops: besides the push queue it keeps a shadow of each worker's
// resident blocks in every storage tier (the raw BlockStored data, in store order). Any failed push,
// a queue over --bridge-queue-max, or nginx found empty (restarted) marks
// nginx dirty; the bridge then backs off exponentially and, once nginx
// answers, replaces nginx's whole state (fleet, then per worker: clear + every
// resident block) before it resumes streaming live batches.
import * as http from "http";
import { sameWorker } from "../core/fleet";
import { Counter, Gauge, Registry } from "prom-client";
import { Options, optionsFrom } from "../runtime/config";
import { EventSource, eventSourceFor, fetchModels, KV_REFUSED_LOG } from "../runtime/app";
import { rateLimitedLog } from "../runtime/ratelog";
import { HealthChecker } from "../runtime/health-check";
import { Discovery, Fleet, startDiscovery } from "../runtime/discovery";
import { Subscription } from "../runtime/events";
import { KvEvent, tierOf } from "../core/kvevents";
import { EnginePage } from "../core/engine-readings";
import { scrapeRound } from "../runtime/engine-metrics";
import { WorkerSpec } from "../core/router";
import { backoff, Logger, makeLogger, stateLogger } from "../runtime/log";
import { spec } from "../runtime/metrics";
import { listenError, runCommand, version } from "../runtime/args";
import { CLOSE_BUDGET_MS, closeStep, onShutdown } from "../runtime/shutdown";
import { tokenizeHelper, TokenizeHelper } from "./tokenize-helper";
import { KvAnnotator, splitBatch } from "./kv-annotate";
import { RenderProbes } from "../runtime/probe";

interface ShadowBlock {
  parent: string | null;
  tokens: number[];
  blockSize: number;
  loraId: number | null;
  loraName: string | null;
  /** This block's extra_keys entry (salt, adapter, multimodal ids). */
  extra: unknown[] | null;
  /**
   * The storage tiers holding it (core/kvevents.ts TIERS: GPU, CPU, DISK,
   * EXTERNAL). Empty = evicted from every tier, kept only because a resident
   * block chains from it.
   */
  tiers: string[];
  /** Resident or ghost blocks whose parent this is. */
  kids: number;
}

/**
 * One worker's blocks as nginx should see them, every tier of the mirrored
 * (full-attention) KV-cache group. A block's mirror hash chains from its
 * parent's, in whatever tier the parent sits (core looks the parent up in
 * every tier), so an evicted parent whose children are still resident is kept
 * as a ghost: a replay stores it (so the children can chain) and then removes
 * it, leaving nginx with exactly what live streaming would have.
 */
export class Shadow {
  seq: number | null = null;
  blocks = new Map<string, ShadowBlock>();
  /** Blocks resident in at least one tier. */
  live = 0;

  /** The learned full-attention KV-cache group (core/kvevents.ts rule); null until a store names one. */
  private fullGroup: number | null = null;

  /** Follows a batch the way core's applyBatch does; restart: the engine restarted, start over. */
  apply(seq: number, events: KvEvent[], restart = false): void {
    this.seq = seq;
    if (restart) this.clear(null);
    for (const ev of events) {
      if (ev.type === "Snapshot") this.retain(ev.hashes);
      else if (ev.type === "AllBlocksCleared") this.clear(ev.medium ? tierOf(ev.medium) : null);
      else if (ev.type === "BlockRemoved") {
        if (ev.groupIdx != null && ev.groupIdx !== (this.fullGroup ?? 0)) continue;
        const tier = tierOf(ev.medium);
        for (const h of ev.hashes) this.remove(h, tier);
      } else if ((ev.slidingWindow ?? 0) > 0 || (ev.specKind && !/full|mla|^attention$/i.test(ev.specKind))) continue;
      else if (!ev.specKind && ev.groupIdx != null && ev.groupIdx !== (this.fullGroup ?? 0)) continue;
      else if (ev.tokens.length === ev.hashes.length * ev.blockSize) {
        if (ev.specKind && ev.groupIdx != null) this.fullGroup = ev.groupIdx;
        const tier = tierOf(ev.medium);
        let parent = ev.parent;
        ev.hashes.forEach((h, j) => {
          const had = this.blocks.get(h);
          if (had) {
            if (!had.tiers.length) this.live++;
            if (!had.tiers.includes(tier)) had.tiers.push(tier);
          } else {
            this.blocks.set(h, {
              parent,
              tokens: ev.tokens.slice(j * ev.blockSize, (j + 1) * ev.blockSize),
              blockSize: ev.blockSize,
              loraId: ev.loraId ?? null,
              loraName: ev.loraName ?? null,
              extra: ev.extraKeys ? (ev.extraKeys[j] ?? null) : null,
              tiers: [tier],
              kids: 0,
            });
            this.live++;
            const p: ShadowBlock | undefined = parent === null ? undefined : this.blocks.get(parent);
            if (p) p.kids++;
          }
          parent = h;
        });
      }
    }
  }

  /** Resident blocks per tier. */
  tierCounts(): Record<string, number> {
    const out: Record<string, number> = { GPU: 0, CPU: 0, DISK: 0, EXTERNAL: 0 };
    for (const b of this.blocks.values()) for (const t of b.tiers) out[t] = (out[t] ?? 0) + 1;
    return out;
  }

  /** A placement snapshot (core/kvevents.ts "Snapshot"): every block the engine no longer holds leaves every tier. */
  private retain(hashes: string[]): void {
    const keep = new Set(hashes);
    for (const [h, b] of [...this.blocks]) if (!keep.has(h)) for (const t of [...b.tiers]) this.remove(h, t);
  }

  /** AllBlocksCleared: one tier (medium given) or all of them. */
  private clear(tier: string | null): void {
    if (tier === null) {
      this.blocks.clear();
      this.live = 0;
      return;
    }
    for (const h of [...this.blocks.keys()]) this.remove(h, tier);
  }

  private remove(h: string, tier: string): void {
    let b = this.blocks.get(h);
    if (!b) return;
    const i = b.tiers.indexOf(tier);
    if (i < 0) return;
    b.tiers.splice(i, 1);
    if (b.tiers.length) return;
    this.live--;
    // Drop ghosts nothing chains from any more, up the chain.
    let key: string | null = h;
    while (b && !b.tiers.length && b.kids === 0 && key !== null) {
      this.blocks.delete(key);
      const parentKey: string | null = b.parent;
      const p: ShadowBlock | undefined = parentKey === null ? undefined : this.blocks.get(parentKey);
      if (!p) break;
      p.kids--;
      key = parentKey;
      b = p;
    }
  }

  /**
   * The state as event batches: clear, the blocks in store order (chains of
   * one tier merged, each tier with its medium), then the ghosts removed; at
   * most maxBlocks stores per batch.
   */
  replay(maxBlocks: number): KvEvent[][] {
    const batches: KvEvent[][] = [[{ type: "AllBlocksCleared" }]];
    // The open store per tier and the last block it holds, so a chain continues in one event.
    let cur: Record<string, KvEvent & { type: "BlockStored" }> = {};
    let last: Record<string, string> = {};
    let inBatch = 0;
    const ghosts: string[] = [];
    const group = this.fullGroup === null ? {} : { groupIdx: this.fullGroup, specKind: "full_attention" };
    for (const [h, b] of this.blocks) {
      const tiers = b.tiers.length ? b.tiers : ["GPU"];
      if (!b.tiers.length) ghosts.push(h);
      for (const t of tiers) {
        if (inBatch >= maxBlocks) {
          batches.push([]);
          inBatch = 0;
          cur = {};
          last = {};
        }
        const c = cur[t];
        if (
          c &&
          b.parent === last[t] &&
          b.blockSize === c.blockSize &&
          (b.loraId ?? null) === (c.loraId ?? null) &&
          b.loraName === (c.loraName ?? null)
        ) {
          c.hashes.push(h);
          for (const x of b.tokens) c.tokens.push(x);
          (c.extraKeys as (unknown[] | null)[]).push(b.extra);
        } else {
          cur[t] = {
            type: "BlockStored",
            hashes: [h],
            parent: b.parent,
            tokens: b.tokens.slice(),
            blockSize: b.blockSize,
            loraId: b.loraId,
            loraName: b.loraName,
            extraKeys: [b.extra],
            medium: t,
            ...group,
          };
          batches[batches.length - 1].push(cur[t]);
        }
        last[t] = h;
        inBatch++;
      }
    }
    if (ghosts.length)
      batches[batches.length - 1].push({
        type: "BlockRemoved",
        hashes: ghosts,
        medium: "GPU",
        ...(this.fullGroup === null ? {} : { groupIdx: this.fullGroup }),
      });
    return batches;
  }
}

type Push = Record<string, unknown>;

export class Bridge implements Fleet {
  private fleet: Record<string, WorkerSpec> = {};
  /** Each worker's GET /v1/models ids, pushed with the fleet so njs routes by model. */
  private models: Record<string, string[]> = {};
  /** Of those, the LoRA adapters (entries with a parent model), pushed with the fleet for njs's LoRA table. */
  private adapters: Record<string, string[]> = {};
  /**
   * What each worker's /metrics said at the last scrape (KV capacity and
   * headroom, LoRA state), as last pushed; null: the scrape failed.
   */
  private pages: Record<string, EnginePage | null> = {};
  private scrapeTimer: NodeJS.Timeout | null = null;
  private scraping = false;
  private subs: Record<string, Subscription> = {};
  private shadows: Record<string, Shadow> = {};
  private annotator: KvAnnotator;
  private queue: Push[] = [];
  private pumping = false;
  private closed = false;
  private lastPseq = 0;
  /** nginx's bundle checks the parts of a cut batch (post). */
  private nginxParts = false;
  private attempt = 0;
  private heartbeat: NodeJS.Timeout | null = null;
  /** nginx may hold less than we pushed: the next successful contact is a full resync. */
  dirty = true;
  /** Discovery's state (for readiness). */
  discoveryState = { ok: true, detail: "static" };
  readonly nginxState: ReturnType<typeof stateLogger>;
  readonly registry = new Registry();
  readonly m = {
    pushes: new Counter({
      ...spec("infera_bridge_pushes_total"),
      registers: [this.registry],
    }),
    resyncs: new Counter({
      ...spec("infera_bridge_resyncs_total"),
      registers: [this.registry],
    }),
    overflow: new Counter({
      ...spec("infera_bridge_queue_overflows_total"),
      registers: [this.registry],
    }),
    queue: new Gauge({ ...spec("infera_bridge_queue_depth"), registers: [this.registry] }),
    dirty: new Gauge({
      ...spec("infera_bridge_nginx_dirty"),
      registers: [this.registry],
    }),
    blocks: new Gauge({
      ...spec("infera_bridge_shadow_blocks"),
      registers: [this.registry],
    }),
    eventErrors: new Counter({
      ...spec("infera_bridge_kv_event_errors_total"),
      registers: [this.registry],
    }),
  };
  /**
   * Active health checks, as the router runs them (runtime/health-check.ts):
   * nginx gets each worker's verdict with the fleet, so a dead worker stops
   * getting picks there within two --health-interval-ms, or at once when its
   * KV event stream drops.
   */
  readonly health: HealthChecker;
  private healthy: Record<string, boolean> = {};
  /** Refused KV-event frames: every one counted, a few logged per minute (as the router does). */
  private readonly kvRefused = rateLimitedLog((l, m, f) => this.log(l, m, f), KV_REFUSED_LOG);
  stats = { pushed: 0, refused: 0, failed: 0, resyncs: 0 };
  /** POST /v1/tokenize on the admin port: nginx's long prompts tokenized and hashed here (njs/tokenize-helper.ts). */
  readonly tokenize: TokenizeHelper;
  /**
   * --send-token-ids exact: the render-parity probe of every worker, run here
   * as the ext_proc server runs it (runtime/probe.ts) with the helper's
   * tokenizer; each worker's status rides in the fleet push, where njs reads
   * whether the picked worker may get ids. Null otherwise.
   */
  readonly probes: RenderProbes | null;

  constructor(
    readonly opts: Options,
    readonly log: Logger,
    private events: EventSource,
  ) {
    this.nginxState = stateLogger(log, `nginx push (${opts.nginxPushUrl})`);
    const ids = opts.sendTokenIds === "exact" && opts.renderProbeApi !== "off";
    this.tokenize = tokenizeHelper(this.registry, 5000, () => !!this.probes && this.anyExact());
    this.probes = !ids
      ? null
      : new RenderProbes(
          (id) => {
            const ms = this.models[id];
            return { tok: this.tokenize.tokenizer(), model: ms && ms.length ? ms[0] : null };
          },
          { intervalMs: opts.renderProbeIntervalMs, api: opts.renderProbeApi as "vllm" | "sglang", timeoutMs: 5000 },
          (l, m, f) => this.log(l, m, f),
          this.registry,
          () => this.enqueue(this.fleetBody()),
        );
    this.annotator = new KvAnnotator(opts.maxMirrorBlocks);
    this.m.dirty.set(1);
    const target = (w: WorkerSpec | undefined) => (w ? { id: w.id, address: w.address, key: JSON.stringify(w) } : null);
    this.health = new HealthChecker({
      intervalMs: opts.healthIntervalMs,
      targets: () => Object.values(this.fleet).map((w) => target(w)!),
      target: (id) => target(this.fleet[id]),
      verdict: (id, ok) => {
        if ((this.healthy[id] !== false) === ok) return;
        this.healthy[id] = ok;
        this.log(
          ok ? "info" : "warn",
          ok ? "worker healthy again" : "worker failed health checks: nginx stops picking it",
          { worker: id },
        );
        this.enqueue(this.fleetBody());
      },
    });
  }

  static async create(opts: Options, log: Logger): Promise<Bridge> {
    return new Bridge(opts, log, await eventSourceFor(opts, log));
  }

  // Push sequence numbers only grow, across bridge restarts too (time based), so nginx can refuse stale pushes.
  private pseq(): number {
    this.lastPseq = Math.max(this.lastPseq + 1, Date.now() * 1000);
    return this.lastPseq;
  }

  /**
   * One push, or an events batch of more than --bridge-push-max-blocks blocks
   * as several: each part is its own push and so its own step of the nginx
   * worker, which serves other requests between them (the pump waits for each
   * answer). Parts carry the batch's seq and their place in it (part, partOf);
   * njs applies a part only after the part before it, else it answers gap.
   * A gap on a later part is ours to repair (a part lost), so it resyncs. Batches
   * are cut only once nginx's bundle says it checks parts (parts: true in a
   * fleet or events answer): an older bundle would take a later part for a gap.
   */
  private async post(body: Push): Promise<void> {
    if (body.type !== "events") return void (await this.send(body));
    const events = body.events as KvEvent[];
    const parts = this.nginxParts ? splitBatch(events, this.opts.bridgePushMaxBlocks) : [events];
    for (let k = 0; k < parts.length; k++) {
      const part: Push = { type: "events", worker: body.worker, seq: body.seq, events: parts[k] };
      if (k === 0 && body.restart) part.restart = true;
      if (parts.length > 1) {
        part.part = k;
        part.partOf = parts.length;
      }
      // Our block hashes ride with the part, so njs stores them without hashing (njs/kv-annotate.ts).
      try {
        this.annotator.annotate(
          String(body.worker),
          Number(body.seq),
          parts[k],
          k === 0 && !!body.restart,
          k,
          parts.length,
        );
      } catch (e) {
        /* no hashes: njs hashes the tokens itself */
      }
      const res = await this.send(part);
      // A gap on the first part is the engine's (njs cleared, as for a whole batch); on a later one, ours.
      if (parts.length > 1 && ((k > 0 && res.gap === true) || res.parts !== true))
        throw new Error(`nginx did not take part ${k + 1} of ${parts.length} of batch ${body.seq} in order: resyncing`);
    }
  }

  private async send(body: Push): Promise<Record<string, unknown>> {
    const r = await fetch(this.opts.nginxPushUrl, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-push-token": this.opts.pushToken },
      body: JSON.stringify({ ...body, pseq: this.pseq() }),
      signal: AbortSignal.timeout(10000),
    });
    const text = await r.text();
    if (!r.ok) {
      this.m.pushes.inc({ type: String(body.type), result: String(r.status) });
      throw new Error(`nginx answered ${r.status}: ${text.slice(0, 200)}`);
    }
    this.m.pushes.inc({ type: String(body.type), result: "ok" });
    this.stats.pushed++;
    // The fleet and events answers say whether the bundle checks parts (the fleet push comes first in a resync).
    if (body.type !== "events" && body.type !== "workers") return {};
    let res: Record<string, unknown> = {};
    try {
      res = JSON.parse(text) as Record<string, unknown>;
    } catch (e) {
      /* not JSON: something in front of nginx that we do not know; no parts */
    }
    this.nginxParts = res.parts === true;
    return res;
  }

  private fleetBody(): Push {
    return {
      type: "workers",
      workers: Object.values(this.fleet).map((w) => ({
        id: w.id,
        address: w.address,
        role: w.role,
        blockSize: w.blockSize,
        dpRank: w.dpRank,
        engine: w.engine,
        models: this.models[w.id] ?? null,
        adapters: this.adapters[w.id] ?? [],
        healthy: this.healthy[w.id] !== false,
        // --send-token-ids exact: njs sends ids only to a worker pushed as exact.
        ...(this.probes ? { parity: this.probes.state(w.id).status } : {}),
      })),
    };
  }

  private anyExact(): boolean {
    for (const id of Object.keys(this.fleet)) if (this.probes?.state(id).status === "exact") return true;
    return false;
  }

  private enqueue(p: Push): void {
    if (this.dirty) return void this.pump(); // the coming resync carries it
    if (this.queue.length >= this.opts.bridgeQueueMax) {
      this.m.overflow.inc();
      this.log("warn", "push queue passed --bridge-queue-max: resyncing nginx in full instead", {
        bridge_queue_max: this.opts.bridgeQueueMax,
      });
      this.markDirty();
    } else this.queue.push(p);
    this.m.queue.set(this.queue.length);
    void this.pump();
  }

  private markDirty(): void {
    this.dirty = true;
    this.queue = [];
    this.m.queue.set(0);
    this.m.dirty.set(1);
  }

  /** Replaces nginx's state with ours: the fleet, then per worker a clear and every resident block. */
  private async resync(): Promise<void> {
    // Snapshot synchronously: batches arriving from now on queue behind it, in order.
    const bodies: Push[] = [this.fleetBody()];
    const engine = this.engineBody();
    if (engine) bodies.push(engine);
    for (const id of Object.keys(this.fleet)) {
      const sh = this.shadows[id];
      if (!sh || sh.seq === null) continue;
      // Each replayed batch is one push, one step of the nginx worker: at most --bridge-push-max-blocks blocks.
      const batches = sh.replay(
        this.opts.bridgePushMaxBlocks > 0 ? Math.min(2000, this.opts.bridgePushMaxBlocks) : 2000,
      );
      // Sequence numbers end at the shadow's, so the next live batch follows on.
      batches.forEach((events, i) =>
        bodies.push({ type: "events", worker: id, seq: (sh.seq as number) - (batches.length - 1 - i), events }),
      );
    }
    this.queue = [];
    this.dirty = false;
    for (const b of bodies) await this.post(b);
    this.stats.resyncs++;
    this.m.resyncs.inc();
    this.m.dirty.set(0);
    this.log("info", "nginx resynced", {
      workers: Object.keys(this.fleet).length,
      blocks: Object.values(this.shadows).reduce((a, s) => a + s.live, 0),
    });
  }

  private async pump(): Promise<void> {
    if (this.pumping || this.closed) return;
    this.pumping = true;
    try {
      while (!this.closed && (this.dirty || this.queue.length)) {
        try {
          if (this.dirty) await this.resync();
          else {
            await this.post(this.queue[0]);
            this.queue.shift();
            this.m.queue.set(this.queue.length);
          }
          this.nginxState.ok();
          this.attempt = 0;
        } catch (e) {
          this.stats.failed++;
          this.markDirty();
          this.nginxState.fail((e as Error).message.split("\n")[0]);
          const wait = backoff(this.attempt++, this.opts.bridgeBackoffMaxMs);
          await new Promise((r) => setTimeout(r, wait));
        }
      }
    } finally {
      this.pumping = false;
    }
  }

  /** The engine push: every scraped worker's page (null: its scrape failed); null when no page said anything. */
  private engineBody(): Push | null {
    const ids = Object.keys(this.pages);
    if (!ids.some((id) => this.pages[id] !== null)) return null;
    const pages: Record<string, EnginePage | null> = {};
    for (const id of ids) pages[id] = this.pages[id];
    return { type: "engine", pages };
  }

  /**
   * One round of scrapes: each worker's /metrics once per address, read as
   * the router's engine-metrics reads it (KV capacity in tokens, KV usage,
   * queue, running; vllm:lora_requests_info), and pushed to nginx. While any
   * page says something every round is pushed, changed or not: njs's LoRA
   * table clears the sends it noted since the last scrape on each push, as
   * the router's does on each scrape. A failed scrape pushes null for the
   * worker: unknown, as in the router.
   */
  async scrapeEngines(): Promise<void> {
    if (this.scraping || this.closed) return;
    this.scraping = true;
    try {
      let any = false;
      await scrapeRound(Object.values(this.fleet), 2000, true, (w, read) => {
        if (this.fleet[w.id] !== w) return; // replaced while the page was in flight
        const page: EnginePage | null = read
          ? {
              capacityTokens: read.figures.capacityTokens,
              kvUsage: read.figures.kvUsage,
              waitingRequests: read.figures.waitingRequests,
              runningRequests: read.figures.runningRequests,
              lora: read.lora,
            }
          : null;
        if (page !== null || this.pages[w.id]) any = true;
        this.pages[w.id] = page;
      });
      const body = any ? this.engineBody() : null;
      if (body) this.enqueue(body);
    } finally {
      this.scraping = false;
    }
  }

  /** Scrapes every worker's /metrics every --engine-metrics-interval-ms (0: off). */
  startEngineScrapes(everyMs: number): void {
    if (!everyMs || this.scrapeTimer) return;
    this.scrapeTimer = setInterval(() => void this.scrapeEngines(), everyMs);
    this.scrapeTimer.unref();
  }

  /**
   * Notices an nginx that restarted (empty fleet) or went away while nothing
   * was being pushed, so the fleet is back without waiting for an event.
   */
  startHeartbeat(everyMs = 1000): void {
    const url = new URL("/v1/admin/workers", this.opts.nginxPushUrl).toString();
    this.heartbeat = setInterval(async () => {
      if (this.pumping || this.dirty) return;
      try {
        const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
        const ws = (await r.json()) as unknown[];
        if (r.ok && Array.isArray(ws) && ws.length !== Object.keys(this.fleet).length) {
          this.log("warn", "nginx holds another number of workers than the fleet (nginx restarted?): resyncing", {
            nginx_workers: ws.length,
            fleet_workers: Object.keys(this.fleet).length,
          });
          this.markDirty();
          void this.pump();
        }
      } catch (e) {
        this.nginxState.fail(`nginx unreachable: ${(e as Error).message}`);
        this.markDirty();
        void this.pump();
      }
    }, everyMs);
    this.heartbeat.unref();
  }

  readiness(): { ready: boolean; degraded: string[]; checks: Record<string, { ok: boolean; detail: string }> } {
    const checks = {
      nginx: {
        ok: !this.dirty && !this.nginxState.failing,
        detail: this.dirty ? "resync pending (nginx unreachable or refused a push)" : "in sync",
      },
      discovery: { ok: this.discoveryState.ok, detail: this.discoveryState.detail },
      workers: {
        ok: this.routable() > 0,
        detail: `${this.routable()} of ${Object.keys(this.fleet).length} worker(s) routable${this.health.running ? " (healthy, through a health check)" : ""}`,
      },
    };
    // Discovery that lost its registry keeps feeding nginx the last known fleet: degraded, not unready.
    const degraded = !checks.discovery.ok && checks.workers.ok ? ["discovery"] : [];
    return {
      ready: checks.nginx.ok && checks.workers.ok && (checks.discovery.ok || degraded.length > 0),
      degraded,
      checks,
    };
  }

  /** Workers nginx may pick: with health checks on, those that passed one and are not failing. */
  private routable(): number {
    const ids = Object.keys(this.fleet);
    return this.health.running
      ? ids.filter((id) => this.healthy[id] !== false && this.health.hasPassed(id)).length
      : ids.length;
  }

  setDiscoveryState(ok: boolean, detail: string): void {
    this.discoveryState = { ok, detail };
  }

  listWorkerCount(): number {
    return Object.keys(this.fleet).length;
  }

  setWorkers(list: WorkerSpec[]): void {
    const want = new Set(list.map((w) => w.id));
    let changed = false;
    for (const id of Object.keys(this.fleet)) if (!want.has(id)) changed = this.drop(id) || changed;
    for (const w of list) changed = this.track(w) || changed;
    if (changed || this.dirty) this.enqueue(this.fleetBody());
  }

  addWorker(w: WorkerSpec): void {
    if (this.track(w)) this.enqueue(this.fleetBody());
  }

  removeWorker(id: string): void {
    if (this.drop(id)) this.enqueue(this.fleetBody());
  }

  private track(w: WorkerSpec): boolean {
    const old = this.fleet[w.id];
    if (old && sameWorker(old, w)) return false;
    this.drop(w.id);
    this.fleet[w.id] = w;
    this.health.join(w.id);
    void fetchModels(w.address).then((m) => {
      if (this.fleet[w.id] !== w) return;
      if (m) {
        this.models[w.id] = m.ids;
        this.adapters[w.id] = Object.keys(m.parent);
        this.enqueue(this.fleetBody());
      }
      // Models first: the probe names one the worker serves.
      if (this.probes) void this.probes.join(w.id, w.address);
    });
    const shadow = new Shadow();
    this.shadows[w.id] = shadow;
    if (w.events)
      try {
        this.subs[w.id] = this.events.subscribe(
          w,
          (seq, evs: KvEvent[], info) => {
            if (this.fleet[w.id] !== w) return;
            shadow.apply(seq, evs, !!info?.restart);
            this.m.blocks.set({ worker: w.id }, shadow.live);
            // restart: njs drops the worker's mirror (every tier) before applying the batch.
            this.enqueue(
              info?.restart
                ? { type: "events", worker: w.id, seq, events: evs, restart: true }
                : { type: "events", worker: w.id, seq, events: evs },
            );
          },
          (reason) => {
            this.m.eventErrors.inc({
              worker: w.id,
              reason: reason.startsWith("subscriber") ? "transport" : "malformed",
            });
            this.kvRefused(w.id, `kv-events worker=${w.id} refused frame: ${reason}`);
          },
          (up) => {
            // A dropped event stream is often the engine dying: probe it now, not at the next interval.
            if (!up && this.fleet[w.id] === w && this.health.running) void this.health.probe(w.id, true);
          },
        );
      } catch (e) {
        this.log("warn", "kv-events: cannot subscribe", {
          worker: w.id,
          endpoint: w.events,
          error: (e as Error).message,
        });
      }
    return true;
  }

  private drop(id: string): boolean {
    if (!this.fleet[id]) return false;
    this.subs[id]?.close();
    delete this.subs[id];
    delete this.fleet[id];
    delete this.models[id];
    delete this.adapters[id];
    delete this.pages[id];
    delete this.healthy[id];
    this.health.leave(id);
    this.probes?.leave(id);
    delete this.shadows[id];
    this.annotator.forget(id);
    this.m.blocks.remove({ worker: id });
    return true;
  }

  /** Resolves once nothing is queued and nginx is in sync (or after timeoutMs). */
  async flush(timeoutMs = 30000): Promise<void> {
    const end = Date.now() + timeoutMs;
    while ((this.pumping || this.dirty || this.queue.length) && Date.now() < end)
      await new Promise((r) => setTimeout(r, 20));
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.heartbeat) clearInterval(this.heartbeat);
    if (this.scrapeTimer) clearInterval(this.scrapeTimer);
    this.health.stop();
    this.probes?.stop();
    this.tokenize.close();
    for (const id of Object.keys(this.subs)) this.subs[id].close();
    this.kvRefused.close();
    await this.events.close();
  }
}

function serveAdmin(b: Bridge, host: string, port: number): Promise<http.Server> {
  const server = http.createServer(async (req, res) => {
    const send = (status: number, body: unknown) => {
      const s = JSON.stringify(body);
      res.writeHead(status, { "content-type": "application/json" });
      res.end(s);
    };
    const p = new URL(req.url || "/", "http://x").pathname;
    if (p === "/metrics") {
      res.writeHead(200, { "content-type": b.registry.contentType });
      return res.end(await b.registry.metrics());
    }
    if (p === "/livez") return send(200, { status: "alive" });
    if (p === "/v1/tokenize") return b.tokenize.handle(req, res);
    if (p === "/readyz" || p === "/healthz") {
      const r = b.readiness();
      return send(r.ready ? 200 : 503, {
        status: r.ready ? "ready" : "not_ready",
        degraded: r.degraded,
        checks: r.checks,
      });
    }
    send(404, { error: { message: "not found", type: "not_found", code: 404 } });
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve(server));
  });
}

export function startBridge(argv: string[]): Promise<void> {
  return runCommand("bridge", argv, async (p) => {
    const opts = optionsFrom(p.values, "bridge");
    const log = makeLogger(opts.logLevel, opts.logFormat, { component: "bridge" });
    const b = await Bridge.create(opts, log);
    const admin = await serveAdmin(b, opts.host, opts.adminPort).catch((e) =>
      Promise.reject(listenError("--admin-port", opts.host, opts.adminPort, e)),
    );
    // Read now: a signal during the start-up below closes the server, and a closed server has no address.
    const adminAt = `${opts.host}:${(admin.address() as { port: number }).port}`;
    // Nothing to drain (nginx keeps its state): each close step is bounded, a
    // second signal exits at once. Handled from here on, discovery still starting included.
    let d: Discovery | null = null;
    onShutdown(log, CLOSE_BUDGET_MS + 1000, async () => {
      admin.close();
      const dd = d;
      if (dd) await closeStep(log, "discovery close", () => dd.close(), CLOSE_BUDGET_MS / 2);
      await closeStep(log, "bridge close", () => b.close(), CLOSE_BUDGET_MS / 2);
    });
    d = await startDiscovery(b);
    b.startHeartbeat();
    b.startEngineScrapes(opts.engineMetrics ? opts.engineMetrics.intervalMs : 0);
    b.health.start();
    b.probes?.start();
    await b.tokenize.warm();
    log("info", "bridge started", {
      version: version(),
      push_url: opts.nginxPushUrl,
      admin: adminAt,
    });
  });
}

if (require.main === module) void startBridge(process.argv.slice(2));
