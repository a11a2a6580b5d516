// Tokenization off the event loop: a small pool of worker threads
// (runtime/tokenize-worker.ts), a bounded queue and a time bound per request.
// A running job past its bound cannot be interrupted inside the thread, so
// the thread is terminated and replaced: the bound frees the CPU, not only
// the caller. Each thread keeps its own piece cache; a prompt goes to the
// thread its opening text hashes to, so a growing conversation keeps hitting
// the cache that holds its earlier turns.
import * as os from "os";
import * as path from "path";
import { Worker } from "worker_threads";
import { httpError } from "../core/util";
import { LoadOptions } from "./tokenizer";
import type { TokenizeJob, TokenizeResult } from "./tokenize-worker";

export interface PoolOptions extends LoadOptions {
  /** Tokenizer keys every thread loads at start ("" = the default tokenizer). */
  keys?: string[];
  threads: number;
  queueMax: number;
  timeoutMs: number;
}

export interface CacheStats {
  hitTokens: number;
  missTokens: number;
  pieces: number;
  chars: number;
}

/** Adds s's counters into t. */
export function addStats(t: CacheStats, s: CacheStats): void {
  t.hitTokens += s.hitTokens;
  t.missTokens += s.missTokens;
  t.pieces += s.pieces;
  t.chars += s.chars;
}

/** A job's answer: token count, block hashes, and the ids themselves when asked for. */
export interface PoolResult {
  tokens: number;
  blocks: string[];
  ids?: Uint32Array;
}

/** What a rejected job counts as in infera_router_tokenize_jobs_total. */
export type JobOutcome = "timeout" | "queue_full" | "error";

/** An httpError that also names its outcome, so callers count it without reading the message. */
function rejection(status: number, message: string, type: string, outcome: JobOutcome): Error {
  return Object.assign(httpError(status, message, type), { outcome });
}

/** Threads when --tokenizer-threads is unset: leave a core to the event loop, at most 4. */
export function defaultThreads(
  cpus = typeof os.availableParallelism === "function" ? os.availableParallelism() : os.cpus().length,
): number {
  return Math.max(1, Math.min(4, cpus - 1));
}

interface Pending {
  job: TokenizeJob;
  resolve(r: PoolResult): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
  slot: Slot | null;
  started: number;
}

interface Slot {
  worker: Worker;
  queue: Pending[];
  running: Pending | null;
  stats: Record<string, CacheStats>;
  ready: Promise<void>;
}

function affinity(text: string): number {
  // FNV-1a over the opening characters: the system prompt and first turn.
  let h = 0x811c9dc5;
  const n = Math.min(text.length, 512);
  for (let i = 0; i < n; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return h >>> 0;
}

export class TokenizerPool {
  private slots: Slot[] = [];
  private pending = new Map<number, Pending>();
  private nextId = 1;
  private closed = false;
  /** Counters of threads that were replaced, so totals never go backwards. */
  private retired: CacheStats = { hitTokens: 0, missTokens: 0, pieces: 0, chars: 0 };
  readonly counts = { worker: 0, timeout: 0, queueFull: 0, restarts: 0, errors: 0 };

  constructor(
    readonly opts: PoolOptions,
    private log: (level: "info" | "warn", msg: string, fields?: Record<string, string | number>) => void = () =>
      undefined,
  ) {
    for (let i = 0; i < opts.threads; i++) this.slots.push(this.spawn());
  }

  private spawn(replacing = false): Slot {
    const file = path.join(__dirname, "tokenize-worker" + path.extname(__filename));
    const workerData = {
      backend: this.opts.backend,
      pieceCacheChars: this.opts.pieceCacheChars,
      keys: this.opts.keys || [],
    };
    // From TypeScript sources (tsx: tests, benches) the thread registers tsx itself; dist/ runs plain JS.
    const worker = file.endsWith(".ts")
      ? new Worker(`require("tsx/cjs"); require(${JSON.stringify(file)});`, { eval: true, workerData })
      : new Worker(file, { workerData });
    let isReady = () => undefined as void;
    const slot: Slot = { worker, queue: [], running: null, stats: {}, ready: new Promise<void>((r) => (isReady = r)) };
    worker.unref();
    worker.on("message", (r: TokenizeResult) => {
      if (r.ready) {
        isReady();
        if (replacing) this.log("info", "tokenizer thread replaced and ready");
        return;
      }
      this.done(slot, r);
    });
    worker.on("error", (e) => {
      this.log("warn", "tokenizer thread failed; replacing it", { error: e.message });
      this.replace(slot, new Error("tokenizer thread failed: " + e.message));
    });
    return slot;
  }

  /** Resolves once every thread has loaded its tokenizers. */
  ready(): Promise<void> {
    return Promise.all(this.slots.map((s) => s.ready)).then(() => undefined);
  }

  /** Jobs waiting or running. */
  depth(): number {
    return this.pending.size;
  }

  threads(): number {
    return this.slots.length;
  }

  /** Piece-cache counters over every thread (and every thread replaced so far). */
  stats(): CacheStats {
    const t = { ...this.retired, pieces: 0, chars: 0 };
    for (const s of this.slots) for (const k of Object.keys(s.stats)) addStats(t, s.stats[k]);
    return t;
  }

  /**
   * Token count and chained block hashes of text, computed on a thread.
   * Rejects with 503 when the queue is full or the job waited past the bound,
   * 413 when its own encoding ran past it.
   */
  encode(
    key: string,
    text: string,
    special: boolean,
    blockSize: number,
    salt: string | null,
    ids = false,
  ): Promise<PoolResult> {
    if (this.closed)
      return Promise.reject(rejection(503, "the router is shutting down", "service_unavailable", "error"));
    if (this.pending.size >= this.opts.queueMax) {
      this.counts.queueFull++;
      return Promise.reject(
        rejection(
          503,
          `tokenizer queue is full (${this.opts.queueMax} prompts, --tokenize-queue); retry later`,
          "service_unavailable",
          "queue_full",
        ),
      );
    }
    const id = this.nextId++;
    const job: TokenizeJob = { id, key, text, special, blockSize, salt, ids };
    return new Promise((resolve, reject) => {
      const p: Pending = {
        job,
        resolve,
        reject,
        slot: null,
        started: 0,
        timer: setTimeout(() => this.expire(p), this.opts.timeoutMs),
      };
      p.timer.unref();
      this.pending.set(id, p);
      const pref = this.slots[affinity(text) % this.slots.length];
      let slot = pref;
      const load = (s: Slot) => s.queue.length + (s.running ? 1 : 0);
      // The cache-holding thread unless it is backed up and another is freer.
      if (load(pref) > 1) for (const s of this.slots) if (load(s) < load(slot)) slot = s;
      p.slot = slot;
      slot.queue.push(p);
      this.pump(slot);
    });
  }

  private pump(slot: Slot): void {
    if (slot.running || !slot.queue.length) return;
    const p = slot.queue.shift()!;
    slot.running = p;
    p.started = performance.now();
    slot.worker.postMessage(p.job);
  }

  private done(slot: Slot, r: TokenizeResult): void {
    const p = this.pending.get(r.id);
    if (slot.running && slot.running.job.id === r.id) slot.running = null;
    if (r.stats && p) slot.stats[p.job.key] = r.stats;
    if (p) {
      this.pending.delete(r.id);
      clearTimeout(p.timer);
      this.counts.worker++;
      if (r.error) {
        this.counts.errors++;
        p.reject(new Error(r.error));
      } else {
        const joined = r.blocks!;
        const blocks: string[] = new Array(joined.length >> 4);
        for (let i = 0; i < blocks.length; i++) blocks[i] = joined.substr(i << 4, 16);
        p.resolve(r.ids ? { tokens: r.tokens!, blocks, ids: r.ids } : { tokens: r.tokens!, blocks });
      }
    }
    this.pump(slot);
  }

  private expire(p: Pending): void {
    if (!this.pending.has(p.job.id)) return;
    this.pending.delete(p.job.id);
    this.counts.timeout++;
    const slot = p.slot!;
    const ms = this.opts.timeoutMs;
    if (slot.running === p) {
      const ran = Math.round(performance.now() - p.started);
      p.reject(
        rejection(
          413,
          `prompt took over ${ms} ms to tokenize (ran ${ran} ms, --tokenize-timeout-ms); send a shorter prompt`,
          "request_too_large",
          "timeout",
        ),
      );
      this.log("warn", "tokenization ran past its time bound: thread replaced", {
        chars: p.job.text.length,
        timeout_ms: ms,
      });
      this.replace(slot, null);
    } else {
      const i = slot.queue.indexOf(p);
      if (i >= 0) slot.queue.splice(i, 1);
      p.reject(
        rejection(
          503,
          `prompt waited over ${ms} ms for a tokenizer thread (--tokenize-timeout-ms); retry later`,
          "service_unavailable",
          "timeout",
        ),
      );
    }
  }

  /** Terminates a thread (its running job is already settled or gets err) and starts a fresh one with its queue. */
  private replace(slot: Slot, err: Error | null): void {
    const i = this.slots.indexOf(slot);
    if (i < 0) return;
    for (const k of Object.keys(slot.stats)) {
      this.retired.hitTokens += slot.stats[k].hitTokens;
      this.retired.missTokens += slot.stats[k].missTokens;
    }
    const running = slot.running;
    slot.running = null;
    if (running && err && this.pending.has(running.job.id)) {
      this.pending.delete(running.job.id);
      clearTimeout(running.timer);
      running.reject(err);
    }
    void slot.worker.terminate();
    this.counts.restarts++;
    if (this.closed) return;
    const fresh = this.spawn(true);
    fresh.queue = slot.queue;
    for (const q of fresh.queue) q.slot = fresh;
    this.slots[i] = fresh;
    this.pump(fresh);
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(rejection(503, "the router is shutting down", "service_unavailable", "error"));
    }
    this.pending.clear();
    await Promise.all(this.slots.map((s) => s.worker.terminate()));
  }
}
