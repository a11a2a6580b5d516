// infera-bridge: feeds NGINX's njs router. It runs discovery and subscribes to
// KV events exactly like the ext_proc server, but instead of a local mirror it
// pushes the fleet and every event batch, in order, to nginx's internal push
// location, where njs applies them to its shared dicts.
import { sameWorker } from "../core/fleet";
import { parseArgs, Options } from "./config";
import { EventSource, eventSourceFor, fetchModels, Logger, makeLogger } from "./app";
import { Fleet, startDiscovery } from "./discovery";
import { Subscription } from "./events";
import { KvEvent } from "../core/kvevents";
import { WorkerSpec } from "../core/router";

export class Bridge implements Fleet {
  private fleet: Record<string, WorkerSpec> = {};
  /** Each worker's GET /v1/models ids, pushed with the fleet so njs routes by model. */
  private models: Record<string, string[]> = {};
  private subs: Record<string, Subscription> = {};
  private chain: Promise<void> = Promise.resolve();
  private lastPseq = 0;
  stats = { pushed: 0, refused: 0, failed: 0 };

  constructor(readonly opts: Options, readonly log: Logger, private events: EventSource) {}

  static async create(opts: Options, log: Logger): Promise<Bridge> {
    return new Bridge(opts, log, await eventSourceFor(opts, log));
  }

  // Push sequence numbers only grow, across bridge restarts too (time based), so nginx can refuse stale pushes.
  private pseq(): number {
    this.lastPseq = Math.max(this.lastPseq + 1, Date.now() * 1000);
    return this.lastPseq;
  }

  private post(body: Record<string, unknown>): Promise<Response> {
    return fetch(this.opts.nginxPushUrl, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-push-token": this.opts.pushToken },
      body: JSON.stringify({ ...body, pseq: this.pseq() }),
    });
  }

  private fleetBody(): Record<string, unknown> {
    return { type: "workers", workers: Object.values(this.fleet).map((w) => ({ id: w.id, address: w.address, role: w.role, blockSize: w.blockSize, models: this.models[w.id] ?? null })) };
  }

  private send(body: Record<string, unknown>): Promise<void> {
    const run = this.chain.then(async () => {
      for (let attempt = 0; attempt < 50; attempt++) {
        try {
          const r = await this.post(body);
          if (r.ok) {
            this.stats.pushed++;
            return;
          }
          const text = await r.text();
          if (r.status === 404 && body.type === "events") {
            // nginx restarted and lost the fleet: send it again, then this batch.
            await this.pushFleetNow();
            continue;
          }
          this.stats.refused++;
          this.log("warn", `push refused (${r.status}): ${text}`);
          return;
        } catch (e) {
          this.stats.failed++;
          if (attempt % 10 === 0) this.log("warn", `push to ${this.opts.nginxPushUrl} failed: ${(e as Error).message}; retrying`);
          await new Promise((res) => setTimeout(res, 200));
        }
      }
    });
    this.chain = run.catch(() => undefined);
    return run;
  }

  // Outside the push chain: called from inside it, when nginx has lost the fleet.
  private async pushFleetNow(): Promise<void> {
    const r = await this.post(this.fleetBody());
    if (!r.ok) throw new Error(`fleet push refused: ${r.status}`);
  }

  private pushFleet(): Promise<void> {
    return this.send(this.fleetBody());
  }

  setWorkers(list: WorkerSpec[]): void {
    const want = new Set(list.map((w) => w.id));
    for (const id of Object.keys(this.fleet)) if (!want.has(id)) this.drop(id);
    for (const w of list) this.track(w);
    void this.pushFleet();
  }

  addWorker(w: WorkerSpec): void {
    this.track(w);
    void this.pushFleet();
  }

  removeWorker(id: string): void {
    this.drop(id);
    void this.pushFleet();
  }

  private track(w: WorkerSpec): void {
    const old = this.fleet[w.id];
    if (old && sameWorker(old, w)) return;
    this.drop(w.id);
    this.fleet[w.id] = w;
    void fetchModels(w.address).then((m) => {
      if (!m || this.fleet[w.id] !== w) return;
      this.models[w.id] = m.ids;
      void this.pushFleet();
    });
    if (w.events)
      this.subs[w.id] = this.events.subscribe(
        w,
        (seq, evs: KvEvent[]) => void this.send({ type: "events", worker: w.id, seq, events: evs }),
        (reason) => this.log("warn", `kv-events worker=${w.id} refused frame: ${reason}`),
      );
  }

  private drop(id: string): void {
    this.subs[id]?.close();
    delete this.subs[id];
    delete this.fleet[id];
    delete this.models[id];
  }

  /** Resolves when every queued push has been sent. */
  flush(): Promise<void> {
    return this.chain;
  }

  async close(): Promise<void> {
    for (const id of Object.keys(this.subs)) this.subs[id].close();
    await this.events.close();
  }
}

if (require.main === module) {
  (async () => {
    let opts: Options;
    try {
      opts = parseArgs(process.argv.slice(2));
      if (!opts.pushToken) throw new Error("--push-token (or INFERA_PUSH_TOKEN) is required");
    } catch (e) {
      process.stderr.write(`infera-bridge: ${(e as Error).message}\n`);
      process.exit(2);
    }
    const log = makeLogger(opts.logLevel);
    const b = await Bridge.create(opts, log);
    const d = await startDiscovery(b);
    log("info", `bridge pushing to ${opts.nginxPushUrl}`);
    const stop = async () => {
      await d.close();
      await b.close();
      process.exit(0);
    };
    process.on("SIGTERM", stop);
    process.on("SIGINT", stop);
  })();
}
