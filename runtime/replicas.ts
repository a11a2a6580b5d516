// Router replicas sharing in-flight load over NATS (--replica-sync nats).
//
// Every replica subscribes to every worker's KV events itself, so the mirror
// needs no sharing; what one replica cannot see is the load the others have
// just booked. This wraps the local LoadLedger: each local hold/release is
// published, and the other replicas' holds are applied to the local ledger as
// remote guards, so every replica scores with the fleet's whole load.
//
// Wire (JSON on one subject, default infera.load):
//   {r, t:"o", ts, ops:[["h", gid, worker, blocks, tokens, requests, pending] | ["r", gid]]}
//   {r, t:"s", ts, n, last, g:[[gid, worker, blocks, tokens, requests, pending]]}  heartbeat: every open guard
//   {r, t:"bye"}                                                                 clean shutdown
// r is --replica-id plus a per-process nonce; gids count up per process.
// Workers are named by their stable id, never by the per-process epoch key
// (`id#n`), and mapped to the local epoch key on arrival. NATS keeps one
// publisher's messages in order, so a heartbeat is the sender's exact state at
// that point of its stream: a newcomer converges on the first one, and drift
// (a lost message during a reconnect) is corrected by the next. A replica silent
// for --replica-ttl-ms has all its remote load dropped: a dead replica leaves
// no phantom load.
import * as crypto from "crypto";
import * as os from "os";
import type { NatsConnection, Subscription } from "nats";
import * as client from "prom-client";
import { spec } from "./metrics";
import { LoadLedger, WorkerRegistry } from "../core/state/types";
import { BlockHash, EpochKey, Guard } from "../core/types";
import { Logger } from "./log";

export interface ReplicaOptions {
  id: string;
  subject: string;
  heartbeatMs: number;
  ttlMs: number;
}

type GuardData = [gid: number, worker: string, blocks: BlockHash[], tokens: number, requests: number, pending: number];
type Op = ["h", ...GuardData] | ["r", number];
type Msg =
  | { r: string; t: "o"; ts: number; ops: Op[] }
  | { r: string; t: "s"; ts: number; n: number; last: boolean; g: GuardData[] }
  | { r: string; t: "bye" };

interface Remote {
  worker: string;
  blocks: BlockHash[];
  tokens: number;
  requests: number;
  pending: number;
  /** The hold on the local ledger; null while the worker is unknown here. */
  applied: Guard | null;
}

interface Peer {
  lastSeen: number;
  guards: Map<number, Remote>;
  /** Guard ids seen in the heartbeat being received (parts until `last`). */
  snap: { n: number; seen: Set<number> } | null;
}

/** A message (heartbeat part or batch of ops) stays well under NATS's default 1 MB max_payload. */
const PART_BYTES = 256 * 1024;
const sizeOf = (worker: string, blocks: BlockHash[]) => 48 + worker.length + blocks.length * 20;

export function defaultReplicaId(): string {
  return `${os.hostname()}-${process.pid}`;
}

/** Worker id of an epoch key (`id#n`, core/state/memory.ts). */
function workerOf(ek: EpochKey): string {
  const i = ek.lastIndexOf("#");
  return i < 0 ? ek : ek.slice(0, i);
}

export class ReplicaSync {
  readonly ledger: LoadLedger;
  private local = new Map<Guard, number>();
  private localData = new Map<number, GuardData>();
  private nextGid = 1;
  private outboxBytes = 0;
  /** --replica-id plus a per-process nonce: a restarted replica under the same id is a new peer, its guard ids never collide with its previous life's. */
  readonly self: string;
  private peers = new Map<string, Peer>();
  private outbox: Op[] = [];
  private flushQueued = false;
  private nc: NatsConnection | null = null;
  private sub: Subscription | null = null;
  private timer: NodeJS.Timeout | null = null;
  private snapNo = 0;
  private remoteApplied = 0;
  private metrics: {
    messages: client.Counter<"direction" | "kind">;
    publishErrors: client.Counter<string>;
    expired: client.Counter<string>;
    dropped: client.Counter<"reason">;
    lag: client.Histogram<string>;
  } | null = null;

  constructor(
    private inner: LoadLedger,
    private workers: WorkerRegistry,
    readonly opts: ReplicaOptions,
    private log: Logger,
  ) {
    const self = this;
    this.self = `${opts.id}#${crypto.randomBytes(4).toString("hex")}`;
    this.ledger = {
      hold(ek, blocks, tokens, requests, pending = 0) {
        const g = inner.hold(ek, blocks, tokens, requests, pending);
        const gid = self.nextGid++;
        const d: GuardData = [gid, workerOf(ek), blocks, tokens, requests, pending];
        self.local.set(g, gid);
        self.localData.set(gid, d);
        self.send(["h", ...d]);
        return g;
      },
      release(g) {
        inner.release(g);
        let gid = self.local.get(g);
        // The ext_proc server releases by copy (router.releaseGuard): same
        // epoch key and the same blocks array as the held one.
        if (gid === undefined) {
          for (const [h, id] of self.local) {
            if (
              h.epochKey === g.epochKey &&
              h.blocks === g.blocks &&
              h.tokens === g.tokens &&
              h.requests === g.requests &&
              (h.pending || 0) === (g.pending || 0)
            ) {
              g = h;
              gid = id;
              break;
            }
          }
        }
        if (gid === undefined) return;
        self.local.delete(g);
        self.localData.delete(gid);
        self.send(["r", gid]);
      },
      activeBlocks: (ek) => inner.activeBlocks(ek),
      heldGuards: (ek) => inner.heldGuards(ek),
      pendingBlocks: (ek) => inner.pendingBlocks(ek),
      activePrefix: (blocks, eks) => inner.activePrefix(blocks, eks),
      queuedShared: (blocks, upto) => inner.queuedShared(blocks, upto),
      demand: (ek) => inner.demand(ek),
      // This process's own requests only: drain waits for them, not for other replicas'.
      openGuards: () => inner.openGuards() - self.remoteApplied,
    };
  }

  /** Registers the replica metrics (gauges read at scrape time). */
  register(registry: client.Registry): void {
    const self = this;
    new client.Gauge({
      ...spec("infera_router_replica_peers"),
      registers: [registry],
      collect() {
        this.set(self.peers.size);
      },
    });
    new client.Gauge({
      ...spec("infera_router_replica_remote_guards"),
      registers: [registry],
      collect() {
        const s = self.remoteStats();
        this.set({ state: "applied" }, s.applied);
        this.set({ state: "unknown_worker" }, s.unknown);
      },
    });
    new client.Gauge({
      ...spec("infera_router_replica_local_guards"),
      registers: [registry],
      collect() {
        this.set(self.local.size);
      },
    });
    this.metrics = {
      messages: new client.Counter({
        ...spec("infera_router_replica_messages_total"),
        registers: [registry],
      }),
      publishErrors: new client.Counter({
        ...spec("infera_router_replica_publish_errors_total"),
        registers: [registry],
      }),
      expired: new client.Counter({
        ...spec("infera_router_replica_expired_total"),
        registers: [registry],
      }),
      dropped: new client.Counter({
        ...spec("infera_router_replica_dropped_total"),
        registers: [registry],
      }),
      lag: new client.Histogram({
        ...spec("infera_router_replica_sync_lag_seconds"),
        registers: [registry],
      }),
    };
  }

  remoteStats(): { peers: number; applied: number; unknown: number } {
    let unknown = 0;
    for (const p of this.peers.values()) for (const r of p.guards.values()) if (!r.applied) unknown++;
    return { peers: this.peers.size, applied: this.remoteApplied, unknown };
  }

  async start(nc: NatsConnection): Promise<void> {
    this.nc = nc;
    this.sub = nc.subscribe(this.opts.subject);
    const sub = this.sub;
    (async () => {
      for await (const m of sub) {
        try {
          this.receive(JSON.parse(new TextDecoder().decode(m.data)) as Msg);
        } catch (e) {
          this.metrics?.dropped.inc({ reason: "bad" });
          this.log("warn", "replica sync: bad message", { error: (e as Error).message });
        }
      }
    })().catch(() => undefined);
    // Say what we hold now, so peers that were up before us converge at once.
    this.heartbeat();
    this.timer = setInterval(() => {
      this.heartbeat();
      this.expire(Date.now());
      this.reapply();
    }, this.opts.heartbeatMs);
    this.timer.unref();
  }

  /** Clean shutdown: peers drop our load now instead of after the TTL. */
  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (!this.nc) return;
    this.flush();
    this.publish({ r: this.self, t: "bye" });
    await this.nc.drain().catch(() => undefined);
    this.nc = null;
  }

  private send(op: Op): void {
    if (!this.nc) return;
    this.outbox.push(op);
    this.outboxBytes += op[0] === "h" ? sizeOf(op[2], op[3]) : 16;
    if (this.flushQueued) return;
    this.flushQueued = true;
    // One message per turn of the event loop: picks that land together share
    // it. (A longer window cut messages but gained no throughput in
    // bench/replicas.ts, at a longer sync lag: docs/benchmarks/2026-12-03-replicas.md.)
    setImmediate(() => this.flush());
  }

  private flush(): void {
    this.flushQueued = false;
    if (!this.outbox.length) return;
    const all = this.outbox;
    this.outbox = [];
    this.outboxBytes = 0;
    const ts = Date.now();
    let ops: Op[] = [];
    let bytes = 0;
    for (const op of all) {
      const size = op[0] === "h" ? sizeOf(op[2], op[3]) : 16;
      if (ops.length && bytes + size > PART_BYTES) {
        this.publish({ r: this.self, t: "o", ts, ops });
        ops = [];
        bytes = 0;
      }
      ops.push(op);
      bytes += size;
    }
    this.publish({ r: this.self, t: "o", ts, ops });
  }

  private publish(m: Msg): void {
    if (!this.nc || this.nc.isClosed()) return;
    try {
      this.nc.publish(this.opts.subject, new TextEncoder().encode(JSON.stringify(m)));
      this.metrics?.messages.inc({ direction: "sent", kind: m.t === "o" ? "ops" : m.t === "s" ? "heartbeat" : "bye" });
    } catch (e) {
      // Disconnected: the next heartbeat after the reconnect says it all again.
      this.metrics?.publishErrors.inc();
      this.log("debug", "replica sync: publish failed", { error: (e as Error).message });
    }
  }

  /** Every open local guard, in parts that fit a NATS message. */
  heartbeat(): void {
    this.flush();
    const n = ++this.snapNo;
    let part: GuardData[] = [];
    let bytes = 0;
    const ts = Date.now();
    for (const d of this.localData.values()) {
      const size = sizeOf(d[1], d[2]);
      if (part.length && bytes + size > PART_BYTES) {
        this.publish({ r: this.self, t: "s", ts, n, last: false, g: part });
        part = [];
        bytes = 0;
      }
      part.push(d);
      bytes += size;
    }
    this.publish({ r: this.self, t: "s", ts, n, last: true, g: part });
  }

  private receive(m: Msg): void {
    if (!m || typeof m.r !== "string" || m.r === this.self) return;
    this.metrics?.messages.inc({
      direction: "received",
      kind: m.t === "o" ? "ops" : m.t === "s" ? "heartbeat" : "bye",
    });
    if (m.t === "bye") {
      this.dropPeer(m.r, "bye");
      return;
    }
    let p = this.peers.get(m.r);
    if (!p) {
      this.peers.set(m.r, (p = { lastSeen: 0, guards: new Map(), snap: null }));
      this.log("info", "replica joined load sync", { replica: m.r });
    }
    p.lastSeen = Date.now();
    if (m.t === "o") {
      for (const op of m.ops) {
        if (op[0] === "h") this.add(p, op.slice(1) as GuardData);
        else this.remove(p, op[1]);
      }
      this.metrics?.lag.observe(Math.max(0, Date.now() - m.ts) / 1000);
      return;
    }
    if (m.t === "s") {
      if (!p.snap || p.snap.n !== m.n) p.snap = { n: m.n, seen: new Set() };
      for (const d of m.g) {
        p.snap.seen.add(d[0]);
        this.add(p, d);
      }
      if (!m.last) return;
      // The heartbeat is the sender's whole state: anything else we hold for it is stale.
      const seen = p.snap.seen;
      p.snap = null;
      for (const gid of [...p.guards.keys()]) {
        if (seen.has(gid)) continue;
        this.remove(p, gid);
        this.metrics?.dropped.inc({ reason: "resync" });
      }
    }
  }

  private epochOf(worker: string): EpochKey | null {
    const w = this.workers.get(worker);
    return w ? w.epochKey : null;
  }

  private add(p: Peer, d: GuardData): void {
    const [gid, worker, blocks, tokens, requests, pending] = d;
    if (p.guards.has(gid)) return;
    const r: Remote = { worker, blocks, tokens, requests, pending, applied: null };
    p.guards.set(gid, r);
    this.apply(r);
  }

  private apply(r: Remote): void {
    const ek = this.epochOf(r.worker);
    if (!ek) return;
    r.applied = this.inner.hold(ek, r.blocks, r.tokens, r.requests, r.pending);
    this.remoteApplied++;
  }

  private unapply(r: Remote): void {
    if (!r.applied) return;
    this.inner.release(r.applied);
    r.applied = null;
    this.remoteApplied--;
  }

  private remove(p: Peer, gid: number): void {
    const r = p.guards.get(gid);
    if (!r) return;
    p.guards.delete(gid);
    this.unapply(r);
  }

  private dropPeer(id: string, reason: "bye" | "expired"): void {
    const p = this.peers.get(id);
    if (!p) return;
    const n = p.guards.size;
    for (const r of p.guards.values()) this.unapply(r);
    this.peers.delete(id);
    this.metrics?.dropped.inc({ reason }, n);
    if (reason === "expired") this.metrics?.expired.inc();
    this.log(
      reason === "expired" ? "warn" : "info",
      reason === "expired"
        ? "replica silent past --replica-ttl-ms: dropped its in-flight load entries"
        : "replica left: dropped its in-flight load entries",
      { replica: id, entries: n, ttl_ms: this.opts.ttlMs },
    );
  }

  /** Replicas silent past the TTL: their load goes (a dead replica leaves no phantom load). */
  expire(now: number): void {
    for (const [id, p] of [...this.peers]) if (now - p.lastSeen > this.opts.ttlMs) this.dropPeer(id, "expired");
  }

  /** Remote load on workers that joined (or re-joined under a new epoch) since it arrived. */
  private reapply(): void {
    for (const p of this.peers.values()) {
      for (const r of p.guards.values()) {
        const ek = this.epochOf(r.worker);
        if (r.applied && r.applied.epochKey === ek) continue;
        this.unapply(r);
        if (ek) this.apply(r);
      }
    }
  }
}
