// Engine simulator: an OpenAI/Anthropic-compatible worker in front of a
// vLLM-like engine model (sim/model.ts: continuous batching with chunked
// prefill, KV blocks with a prefix cache and LRU eviction, step time from a
// cost model calibrated to Llama-3.1-8B on an H100). It publishes KV events
// exactly as vLLM does (ZMQ PUB, multipart [topic, seq u64 BE, msgpack
// EventBatch]) and serves vLLM's scheduler gauges on /metrics.
import * as http from "http";
import * as crypto from "crypto";
import * as zmq from "zeromq";
import "./flags";
import { KvPublisher } from "./kvpublisher";
import { KvExtras } from "./kvextras";
import { encode } from "@msgpack/msgpack";
import { loadTokenizer } from "../runtime/tokenizer";
import { endpointOf, parseRequest, Tokenizer } from "../core/request";
import { errorJson } from "../core/errors";
import { EngineModel, ModelConfig, ModelEvent, StepPlan, TokenOut } from "./model";
import { simRender, SimRender } from "./render";
import { LoraInfoSeries } from "./lora";
import { simDumpOn, simTimingDump, wallMs } from "./timing-dump";
import { CliError, listenError, parseCommand, Parsed, runCommand } from "../runtime/args";

export interface SimOptions {
  id: string;
  host: string;
  port: number;
  kvEventsPort: number | null;
  topic: string;
  blockSize: number;
  /** KV capacity in blocks (vLLM's num_gpu_blocks). */
  capacityBlocks: number;
  /** Linear-layer cost per prefill token (µs). */
  prefillUsPerToken: number;
  /** Extra cost of a step that carries prefill (ms). */
  prefillBaseMs: number;
  /** Fixed cost of every step (ms): the decode time per token of a lone request. */
  decodeMsPerToken: number;
  prefillAttnUsPerKCtx: number;
  decodeUsPerSeq: number;
  kvReadUsPerKToken: number;
  /** How a mixed step's linear layers are priced (sim/model.ts CostModel.stepModel). */
  stepModel: "knee" | "additive" | "roofline";
  /** Exponent of the knee step model. */
  stepKneeExp: number;
  maxNumBatchedTokens: number;
  maxNumSeqs: number;
  /** Engine time runs this many times faster than wall time. */
  timeScale: number;
  /** Tokens per SSE chunk after the first (vLLM's --stream-interval). */
  streamInterval: number;
  /**
   * --frontend-us-per-token: what the engine's OpenAI frontend spends rendering
   * and tokenizing a text prompt, per token (engine µs; 0 = off). A prompt sent
   * as token ids skips it, as vLLM's and SGLang's do.
   */
  frontendUsPerToken: number;
  /**
   * A second PUB port with the same batches, events as tagged maps with
   * lora_name (the shape vllm-router's kv_aware index decodes); null = off.
   */
  kvEventsMapPort: number | null;
  /** vLLM replay_endpoint: a ROUTER serving the last batches (sim/kvpublisher.ts); null = none. */
  kvReplayPort: number | null;
  /** SGLang's snapshot_endpoint: a ROUTER answering snapshot-v1 (sim/kvpublisher.ts); null = none. */
  kvSnapshotPort?: number | null;
  /** Event encoding on the main port with --kv-replay-port: vLLM's tagged maps or array_like. */
  kvEventEncoding: "map" | "array";
  /** CPU tier (offload then evict) in blocks, 0 = none; second KV group's sliding window, null = none (sim/kvextras.ts). */
  kvCpuBlocks: number;
  kvSlidingWindow: number | null;
  /** This engine's data-parallel rank (sim/dp.ts), tagged on its event batches. */
  dpRank: number | null;
  /** --data-parallel-size: N engines behind one HTTP port (sim/dp.ts). */
  dpSize: number;
  /**
   * Whose behaviour to copy where vLLM and SGLang differ: "sglang" publishes
   * SGLang's event structs (array_like, attn_dp_rank, no tiers/salts/groups)
   * and, with DP, takes the rank from the body (routed_dp_rank, else the
   * deprecated data_parallel_rank) instead of the X-data-parallel-rank header.
   */
  engine: "vllm" | "sglang";
  role: "mixed" | "prefill" | "decode";
  /** A KV transfer's modelled cost: bytes per token over a link of this many Gbit/s (0 bytes: a flat 1 ms). */
  kvBytesPerToken: number;
  kvLinkGbps: number;
  /** The request header naming a peer to pull cached KV blocks from (KV source hint). */
  kvSourceHeader: string;
  /** Decode role: the request header naming the prefill peer (llm-d's sidecar reads x-prefiller-host-port). */
  prefillHeader: string;
  /** Send a malformed frame every N batches (fault tests); 0 = never. */
  malformedEvery: number;
  tokenizerPath: string | null;
  /** Register in etcd under a lease (see runtime/etcd.ts for the keys). */
  etcdEndpoint: string | null;
  etcdPrefix: string;
  /** host the fleet should use to reach us (registrations); default: --host. */
  advertise: string | null;
  /** See sim/render.ts: reference-rendered prompt ids, and a deliberately divergent renderer. */
  renderFixture: string | null;
  renderDivergent: boolean;
  /** GET /v1/models: --served-model-name a,b and --lora-modules x,y (adapters of the first name). */
  servedModels: string[];
  loraModules: string[];
  /** --max-loras: adapters per batch and GPU adapter slots (0 = no limit); --lora-load-ms: a cold adapter's load. */
  maxLoras: number;
  loraLoadMs: number;
}

/** Every flag at its table default (sim/flags.ts, core/flags.ts), ignoring env and config files. */
export function simDefaults(): SimOptions {
  return simOptionsFrom(parseCommand("sim", [], {}));
}

export function modelConfig(o: SimOptions): ModelConfig {
  return {
    stepBaseMs: o.decodeMsPerToken,
    prefillUsPerToken: o.prefillUsPerToken,
    prefillAttnUsPerKCtx: o.prefillAttnUsPerKCtx,
    decodeUsPerSeq: o.decodeUsPerSeq,
    kvReadUsPerKToken: o.kvReadUsPerKToken,
    prefillStepMs: o.prefillBaseMs,
    stepModel: o.stepModel,
    stepKneeExp: o.stepKneeExp,
    blockSize: o.blockSize,
    numBlocks: o.capacityBlocks,
    maxNumBatchedTokens: o.maxNumBatchedTokens,
    maxNumSeqs: o.maxNumSeqs,
    maxLoras: o.maxLoras,
    loraLoadMs: o.loraLoadMs,
  };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Engine-side block hash: sha256 of parent || tokens, first 8 bytes as u64 (like vLLM's sha256 mode). */
function engineHash(parent: bigint | null, tokens: number[], extra: string): bigint {
  const h = crypto.createHash("sha256");
  if (parent !== null) {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(parent);
    h.update(b);
  }
  const t = Buffer.alloc(tokens.length * 4);
  tokens.forEach((x, i) => t.writeUInt32LE(x >>> 0, i * 4));
  h.update(t);
  if (extra) h.update(extra);
  return h.digest().readBigUInt64BE(0);
}

export function blockHashesOf(tokens: number[], blockSize: number, extra: string): bigint[] {
  const n = Math.floor(tokens.length / blockSize);
  const hashes: bigint[] = [];
  let parent: bigint | null = null;
  for (let i = 0; i < n; i++) {
    parent = engineHash(parent, tokens.slice(i * blockSize, (i + 1) * blockSize), i === 0 ? extra : "");
    hashes.push(parent);
  }
  return hashes;
}

/** Runs the engine model against the wall clock, time-scaled. */
class Runner {
  private timer: NodeJS.Timeout | null = null;
  /** Wall time (performance.now()) at which the step in flight ends. */
  stepEnd = 0;
  /** Wall ms the step chain lost to event-loop lag past the catch-up bound (diagnostics: sim/timing-dump.ts). */
  drift = 0;
  private listeners = new Map<string, (t: TokenOut) => void>();
  constructor(
    private model: EngineModel,
    private scale: number,
    private onEvents: (e: ModelEvent[]) => void,
  ) {}

  submit(req: Parameters<EngineModel["add"]>[0], onToken: (t: TokenOut) => void): void {
    this.model.add(req);
    this.listeners.set(req.id, onToken);
    this.kick();
  }

  abort(id: string): void {
    this.listeners.delete(id);
    this.model.abort(id);
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private kick(): void {
    if (this.timer) return;
    this.next(performance.now());
  }

  /**
   * Starts the next step at `start`. Steps chain on engine time, not on when
   * the timer fired, so event-loop lag does not slow the engine down (we catch
   * up, bounded, instead of drifting).
   */
  private next(start: number): void {
    const plan = this.model.schedule();
    this.emit();
    if (!plan) {
      this.timer = null;
      return;
    }
    const now = performance.now();
    const begin = Math.max(start, now - 20);
    if (begin > start && start > 0) this.drift += begin - start;
    this.stepEnd = begin + plan.ms / this.scale;
    this.timer = setTimeout(() => this.finish(plan), Math.max(0, this.stepEnd - now));
  }

  private finish(plan: StepPlan): void {
    const out = this.model.complete(plan);
    this.emit();
    for (const t of out) {
      const l = this.listeners.get(t.id);
      if (t.done) this.listeners.delete(t.id);
      if (l) l(t);
    }
    this.next(this.stepEnd);
  }

  private emit(): void {
    const e = this.model.drainEvents();
    if (e.length) this.onEvents(e);
  }
}

let reqCounter = 0;

export class EngineSim {
  private model: EngineModel;
  private runner: Runner;
  private pub: zmq.Publisher | null = null;
  private mapPub: zmq.Publisher | null = null;
  /** With --kv-replay-port: the vLLM-like publisher (PUB + replay ROUTER) replaces pub. */
  private kvp: KvPublisher | null = null;
  /** Batches still to keep off the live stream (POST /sim/drop-events?n=N). */
  private dropLive = 0;
  private extras: KvExtras;
  private seq = 0;
  private sendChain: Promise<void> = Promise.resolve();
  private server: http.Server | null = null;
  private tok: Tokenizer | null;
  private render: SimRender;
  stats = { requests: 0, promptTokens: 0, cachedTokens: 0, aborted: 0, inflight: 0, batches: 0, tokenIdRequests: 0 };

  constructor(readonly o: SimOptions) {
    try {
      this.tok = loadTokenizer(o.tokenizerPath);
    } catch (e) {
      // A bad --tokenizer-path is a flag error: one line, exit 2.
      throw new CliError(
        `--tokenizer-path ${o.tokenizerPath}: ${(e as Error).message.split("\n")[0].replace(/^--router-tokenizer-path: /, "")}`,
      );
    }
    this.model = new EngineModel(modelConfig(o));
    this.runner = new Runner(this.model, o.timeScale, (e) => this.publishModel(e));
    this.extras = new KvExtras({ blockSize: o.blockSize, cpuBlocks: o.kvCpuBlocks, slidingWindow: o.kvSlidingWindow });
    this.render = simRender(this.tok, { fixture: o.renderFixture, divergent: o.renderDivergent });
    this.model = new EngineModel(modelConfig(o));
    this.runner = new Runner(this.model, o.timeScale, (e) => this.publishModel(e));
  }

  async start(): Promise<void> {
    if (
      this.o.kvEventsPort !== null &&
      (this.o.kvReplayPort !== null ||
        this.o.dpRank !== null ||
        this.o.kvEventEncoding === "map" ||
        this.o.engine === "sglang")
    ) {
      this.kvp = new KvPublisher({
        host: this.o.host,
        port: this.o.kvEventsPort,
        replayPort: this.o.kvReplayPort,
        topic: this.o.topic,
        encoding: this.o.kvEventEncoding,
        bufferSteps: 10000,
        dpRank: this.o.dpRank,
        dialect: this.o.engine,
        snapshotPort: this.o.engine === "sglang" ? (this.o.kvSnapshotPort ?? null) : null,
      });
      await this.kvp.bind();
    } else if (this.o.kvEventsPort !== null) {
      this.pub = new zmq.Publisher({ sendHighWaterMark: 100000 });
      await this.pub.bind(`tcp://${this.o.host}:${this.o.kvEventsPort}`);
    }
    if (this.o.kvEventsMapPort !== null && this.pub) {
      this.mapPub = new zmq.Publisher({ sendHighWaterMark: 100000 });
      await this.mapPub.bind(`tcp://${this.o.host}:${this.o.kvEventsMapPort}`);
    }
    this.server = http.createServer((req, res) => this.handle(req, res).catch((e) => this.fail(req, res, e)));
    this.server.keepAliveTimeout = 60000;
    const server = this.server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.o.port, this.o.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    this.o.port = (this.server.address() as { port: number }).port;
  }

  async stop(): Promise<void> {
    this.runner.stop();
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections?.();
    await this.sendChain.catch(() => undefined);
    this.pub?.close();
    this.mapPub?.close();
    await this.kvp?.close();
  }

  cachedBlocks(): number {
    return this.model.cachedBlocks();
  }

  private publishModel(events: ModelEvent[]): void {
    const bs = this.o.blockSize;
    if (this.kvp) {
      if (!events.length) return;
      this.stats.batches++;
      const live = this.dropLive > 0 ? (this.dropLive--, false) : true;
      void this.kvp.publish(this.extras.events(events), live);
      return;
    }
    // BlockStored: [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    this.publish(
      events.map((e) =>
        e.type === "stored"
          ? ["BlockStored", e.hashes, e.parent, e.tokens, bs, null, "GPU"]
          : ["BlockRemoved", e.hashes, "GPU"],
      ),
      events.map((e) =>
        e.type === "stored"
          ? {
              type: "BlockStored",
              block_hashes: e.hashes,
              parent_block_hash: e.parent,
              token_ids: e.tokens,
              block_size: bs,
              lora_id: null,
              medium: "GPU",
              lora_name: null,
            }
          : { type: "BlockRemoved", block_hashes: e.hashes, medium: "GPU", lora_name: null },
      ),
    );
  }

  private publish(events: unknown[], mapEvents?: unknown[]): void {
    if (!this.pub || events.length === 0) return;
    const seq = this.seq++;
    this.stats.batches++;
    const seqBuf = Buffer.alloc(8);
    seqBuf.writeBigUInt64BE(BigInt(seq));
    // EventBatch (array_like): [ts, events, data_parallel_rank]
    const payload = encode([Date.now() / 1000, events, null], { useBigInt64: true });
    const bad = this.o.malformedEvery > 0 && this.stats.batches % this.o.malformedEvery === 0;
    const pub = this.pub;
    const mapPub = this.mapPub;
    // zeromq.js allows one send at a time: chain them.
    this.sendChain = this.sendChain
      .then(async () => {
        if (bad) await pub.send([this.o.topic, Buffer.from("bogus"), Buffer.from([0xc1, 0xff, 0x00])]);
        await pub.send([this.o.topic, seqBuf, Buffer.from(payload)]);
        if (mapPub && mapEvents)
          await mapPub.send([
            this.o.topic,
            seqBuf,
            Buffer.from(encode([Date.now() / 1000, mapEvents, null], { useBigInt64: true })),
          ]);
      })
      .catch(() => undefined);
  }

  /** The sequence number of the last KV event batch published (null before the first): tests wait for a mirror to reach it. */
  lastKvSeq(): number | null {
    const next = this.kvp ? this.kvp.nextSeq() : this.seq;
    return next > 0 ? next - 1 : null;
  }

  clear(): void {
    simTimingDump({ clear: wallMs(), sim: this.o.id });
    this.model.clearCache();
    if (this.kvp) return void this.kvp.publish([{ type: "AllBlocksCleared" }]);
    this.publish([["AllBlocksCleared"]], [{ type: "AllBlocksCleared", lora_name: null }]);
  }

  /** vllm:lora_requests_info when adapters are served (vLLM exports it only with LoRA enabled). */
  private loraSeries: LoraInfoSeries | null = null;
  loraMetrics(): string {
    if (!this.o.loraModules.length) return "";
    if (!this.loraSeries) this.loraSeries = new LoraInfoSeries(this.o.maxLoras || this.o.loraModules.length);
    const info = this.model.loraInfo();
    this.loraSeries.record(info.running, info.waiting, Date.now() / 1000);
    return this.loraSeries.text();
  }

  metrics(): string {
    const model = this.o.servedModels[0] ?? "sim-model";
    const l = `{engine="${this.o.dpRank ?? 0}",model_name="${model}"}`;
    const m = this.model;
    const g = (name: string, help: string, type: string, v: number) =>
      `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${name}${l} ${v}\n`;
    if (this.o.engine === "sglang") {
      // SGLang's names (python/sglang/srt/observability/metrics_collector.py): the KV pool's
      // size in tokens, its usage, and the scheduler's queue and running batch.
      const sl = `{model_name="${model}",engine_type="unified",tp_rank="0",pp_rank="0"}`;
      const sg = (name: string, help: string, type: string, v: number) =>
        `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${name}${sl} ${v}\n`;
      return (
        sg("sglang:num_running_reqs", "The number of running requests.", "gauge", m.numRunning()) +
        sg("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "gauge", m.numWaiting()) +
        sg("sglang:token_usage", "The token usage.", "gauge", m.usage()) +
        sg(
          "sglang:max_total_num_tokens",
          "Maximum total number of tokens in the KV cache pool.",
          "gauge",
          this.o.capacityBlocks * this.o.blockSize,
        ) +
        `# HELP sglang:cache_config_info Information of cache config.\n# TYPE sglang:cache_config_info gauge\n` +
        `sglang:cache_config_info{model_name="${model}",page_size="${this.o.blockSize}",num_pages="${this.o.capacityBlocks}"} 1\n` +
        sg("sglang:prompt_tokens_total", "Number of prefill tokens processed.", "counter", m.stats.promptTokens) +
        sg("sglang:generation_tokens_total", "Number of generation tokens processed.", "counter", m.stats.generated)
      );
    }
    // vLLM's info gauge: every CacheConfig field as a label, the value 1 (vllm/config/cache.py metrics_info).
    const cacheInfo =
      `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n` +
      `vllm:cache_config_info{block_size="${this.o.blockSize}",cache_dtype="auto",enable_prefix_caching="True",` +
      `engine="${this.o.dpRank ?? 0}",gpu_memory_utilization="0.9",num_cpu_blocks="${this.o.kvCpuBlocks || "None"}",` +
      `num_gpu_blocks="${this.o.capacityBlocks}",prefix_caching_hash_algo="sha256"} 1.0\n`;
    return (
      cacheInfo +
      g("vllm:num_requests_running", "Number of requests in model execution batches.", "gauge", m.numRunning()) +
      g("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge", m.numWaiting()) +
      g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge", m.usage()) +
      g(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        "counter",
        m.stats.queries,
      ) +
      g(
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        "counter",
        m.stats.hits,
      ) +
      g(
        "vllm:num_preemptions_total",
        "Cumulative number of preemption from the engine.",
        "counter",
        m.stats.preemptions,
      ) +
      g("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter", m.stats.promptTokens) +
      g("vllm:generation_tokens_total", "Number of generation tokens processed.", "counter", m.stats.generated)
    );
  }

  /** Errors in the shape of the API that was called, as vLLM and SGLang answer: Anthropic's on /v1/messages, OpenAI's elsewhere. */
  private fail(req: http.IncomingMessage, res: http.ServerResponse, e: unknown): void {
    const err = e as Error & { status?: number; type?: string; param?: string };
    if (res.headersSent) return void res.destroy();
    const status = err.status ?? (e instanceof SyntaxError ? 400 : 500);
    const type = err.type ?? (status === 400 ? "BadRequestError" : status === 404 ? "NotFoundError" : "internal_error");
    res.writeHead(status, { "content-type": "application/json" });
    res.end(errorJson((req.url || "/").split("?")[0], status, err.message, type, err.param));
  }

  private notFound(req: http.IncomingMessage, res: http.ServerResponse): void {
    this.fail(
      req,
      res,
      Object.assign(new Error(`no route for ${req.method} ${(req.url || "/").split("?")[0]}`), { status: 404 }),
    );
  }

  /**
   * Modelled KV transfer time (engine ms) for a prompt whose KV a peer
   * computed: the blocks this engine does not hold already cross the link
   * (a NIXL-style pull skips locally cached blocks), at
   * --kv-bytes-per-token over --kv-link-gbps. 0 bytes per token: a flat 1 ms.
   */
  private transferMs(tokens: number[], hashes: bigint[]): number {
    const moved = Math.max(0, tokens.length - this.heldPrefix(hashes) * this.o.blockSize);
    return this.linkMs(moved);
  }

  /** Engine ms to move `tokens` tokens' KV over the modelled link (0 bytes per token: a flat 1 ms). */
  private linkMs(tokens: number): number {
    if (this.o.kvBytesPerToken <= 0) return 1;
    return (tokens * this.o.kvBytesPerToken * 8) / (this.o.kvLinkGbps * 1e6);
  }

  /** Leading blocks of the prompt this engine holds in its prefix cache. */
  private heldPrefix(hashes: bigint[]): number {
    let n = 0;
    while (n < hashes.length && this.model.holds(hashes[n])) n++;
    return n;
  }

  /**
   * KV source hint: asks the named peer how many leading blocks of the prompt
   * it holds and pulls those this engine lacks over the modelled link,
   * instead of computing them. Returns the prompt tokens now held (0: no pull).
   */
  private async pullFrom(peer: string, hashes: bigint[]): Promise<number> {
    const local = this.heldPrefix(hashes);
    const r = await fetch(`http://${peer}/sim/holds`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ hashes: hashes.map(String) }),
    }).catch(() => null);
    if (!r || !r.ok) return 0;
    const held = Number(((await r.json()) as { blocks?: number }).blocks) || 0;
    if (held <= local) return 0;
    await sleep(this.linkMs((held - local) * this.o.blockSize) / this.o.timeScale);
    return held * this.o.blockSize;
  }
  private async readBody(req: http.IncomingMessage): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = (req.url || "/").split("?")[0];
    if (req.method === "GET") {
      if (url === "/health") return void res.end("ok");
      if (url === "/metrics") {
        res.setHeader("content-type", "text/plain; version=0.0.4");
        return void res.end(this.metrics() + this.loraMetrics());
      }
      if (url === "/sim/stats") {
        res.setHeader("content-type", "application/json");
        const m = this.model;
        return void res.end(
          JSON.stringify({
            id: this.o.id,
            role: this.o.role,
            cached_blocks: m.cachedBlocks(),
            running: m.numRunning(),
            waiting: m.numWaiting(),
            kv_usage: m.usage(),
            cpu_blocks: this.extras.cpuBlocks(),
            last_kv_seq: this.lastKvSeq(),
            ...m.stats,
            ...this.stats,
          }),
        );
      }
      if (url === "/v1/models") {
        res.setHeader("content-type", "application/json");
        // vLLM's shape: served names, then LoRA adapters with their base model as parent. None given: an empty list (serves any model).
        const base = this.o.servedModels[0];
        const data = this.o.servedModels
          .map((id) => ({
            id,
            object: "model",
            created: 0,
            owned_by: this.o.id,
            root: id,
            parent: null as string | null,
          }))
          .concat(
            this.o.loraModules.map((id) => ({
              id,
              object: "model",
              created: 0,
              owned_by: this.o.id,
              root: id,
              parent: base ?? null,
            })),
          );
        return void res.end(JSON.stringify({ object: "list", data }));
      }
      return void this.notFound(req, res);
    }
    if (req.method === "POST" && url === "/sim/holds") {
      // A peer's KV pull asks which leading blocks of its prompt we hold.
      const j = JSON.parse((await this.readBody(req)).toString("utf8") || "{}") as { hashes?: string[] };
      const hashes = (j.hashes ?? []).map((h) => BigInt(h));
      res.setHeader("content-type", "application/json");
      return void res.end(JSON.stringify({ blocks: this.heldPrefix(hashes) }));
    }
    if (req.method === "POST" && url === "/sim/restart") {
      // An engine restart: empty cache, new event stream (sequence from 0, empty replay buffer), no AllBlocksCleared.
      this.model.clearCache();
      this.model.drainEvents();
      this.extras.reset();
      await this.kvp?.restart();
      return void res.end("restarted");
    }
    const drop = /^\/sim\/drop-events\?n=(\d{1,6})$/.exec(req.url ?? "");
    if (req.method === "POST" && drop && this.kvp) {
      // The next n batches go to the replay buffer only, as if every subscriber missed them (a gap).
      this.dropLive = Number(drop[1]);
      return void res.end("dropping");
    }
    if (req.method === "POST" && url === "/sim/clear") {
      this.clear();
      return void res.end("cleared");
    }
    if (req.method === "POST" && url === "/tokenize") {
      const t = this.render.tokenize((await this.readBody(req)).toString("utf8"), 32768);
      res.writeHead(t.status, { "content-type": "application/json" });
      return void res.end(JSON.stringify(t.json));
    }
    const ep = endpointOf(url);
    if (req.method !== "POST" || !ep) return void this.notFound(req, res);
    const arrive = performance.now();
    const body = await this.readBody(req);
    const pr = parseRequest(ep, body.toString("utf8"), body.length, { maxBodyBytes: 64 << 20 });
    const j = JSON.parse(body.toString("utf8"));
    const maxTokens = Math.max(1, Math.min(32768, Number(j.max_tokens ?? j.max_completion_tokens ?? 16) || 16));
    // Tokens for the cache: the real prompt tokens (rendered + tokenized as the engine would),
    // or the ids a completions request carries (the engine's token-in path: nothing to tokenize).
    const asIds = !!pr.promptTokens;
    const f0 = performance.now();
    const tokens = this.render.promptTokens(pr, body.toString("utf8"));
    if (tokens.length === 0) tokens.push(0); // an engine always runs at least one token (BOS)
    if (asIds) this.stats.tokenIdRequests++;
    res.setHeader("x-sim-prompt-input", asIds ? "token-ids" : "text");
    res.setHeader("x-sim-prompt-digest", promptDigest(tokens));
    // The modelled frontend's render + tokenize of a text prompt, less what this process just spent doing it.
    if (!asIds && this.o.frontendUsPerToken > 0) {
      const ms = (tokens.length * this.o.frontendUsPerToken) / 1000 / this.o.timeScale - (performance.now() - f0);
      if (ms > 0) await sleep(ms);
    }
    // media, cache_salt and a LoRA adapter feed the first block's hash, like vLLM's extra keys
    const lora = this.o.loraModules.includes(String(pr.model)) ? String(pr.model) : null;
    const salt = typeof j.cache_salt === "string" && j.cache_salt ? j.cache_salt : null;
    const extra = pr.media.join("\n") + (salt || lora ? `\u0000${salt ?? ""}\u0000${lora ?? ""}` : "");
    this.stats.requests++;
    this.stats.inflight++;
    const id = `${this.o.id}-${++reqCounter}`;
    let aborted = false;
    let finished = false;
    res.on("close", () => {
      if (!res.writableFinished) {
        aborted = true;
        this.stats.aborted++;
        this.runner.abort(id);
      }
    });
    try {
      const stage = req.headers["x-infera-pd-stage"];
      const prefillPeer = req.headers[this.o.prefillHeader] as string | undefined;
      const t0 = performance.now();
      let preloaded = false;
      let peerCached = -1;
      if (this.o.role === "decode" && prefillPeer && stage !== "prefill") {
        // PD: the named prefill worker computes the KV; we then "receive" it.
        // A prefill engine with DP ranks: the router names the rank beside the
        // address (<prefill header>-dp-rank; SGLang: disagg_prefill_dp_rank in
        // the body) and we pin the prefill there the way that engine reads a
        // rank. The body's own routed_dp_rank is this decode target's, never the prefill's.
        const hdrRank = req.headers[this.o.prefillHeader + "-dp-rank"];
        const bodyRank =
          this.o.engine === "sglang" && Number.isInteger(j.disagg_prefill_dp_rank)
            ? String(j.disagg_prefill_dp_rank)
            : undefined;
        // SGLang's decode reads its body only (it knows nothing of our header); a vLLM-side proxy the header.
        const prank =
          this.o.engine === "sglang"
            ? bodyRank
            : typeof hdrRank === "string" && /^\d+$/.test(hdrRank)
              ? hdrRank
              : undefined;
        const pbody: Record<string, unknown> = { ...j, stream: false, max_tokens: 1 };
        delete pbody.routed_dp_rank;
        delete pbody.data_parallel_rank;
        delete pbody.disagg_prefill_dp_rank;
        const pheaders: Record<string, string> = { "content-type": "application/json", "x-infera-pd-stage": "prefill" };
        if (prank !== undefined) {
          if (this.o.engine === "sglang") pbody.routed_dp_rank = Number(prank);
          else pheaders["x-data-parallel-rank"] = prank;
        }
        const pres = await fetch(`http://${prefillPeer}${url}`, {
          method: "POST",
          headers: pheaders,
          body: JSON.stringify(pbody),
        });
        if (!pres.ok)
          throw Object.assign(new Error(`prefill worker ${prefillPeer} answered ${pres.status}`), { status: 502 });
        const servedRank = pres.headers.get("x-sim-dp-rank");
        if (servedRank !== null) res.setHeader("x-sim-prefill-dp-rank", servedRank);
        const pj = (await pres.json()) as {
          usage?: { prompt_tokens_details?: { cached_tokens?: number }; cache_read_input_tokens?: number };
        };
        peerCached = pj.usage?.prompt_tokens_details?.cached_tokens ?? pj.usage?.cache_read_input_tokens ?? 0;
        res.setHeader("x-sim-prefill-worker", prefillPeer);
        await sleep(this.transferMs(tokens, blockHashesOf(tokens, this.o.blockSize, extra)) / this.o.timeScale);
        preloaded = true;
      }
      if (aborted) return;
      const n = stage === "prefill" ? 1 : maxTokens;
      const hashes = blockHashesOf(tokens, this.o.blockSize, extra);
      if (this.kvp) this.extras.noteRequest(hashes, lora, salt, pr.media);
      const source = req.headers[this.o.kvSourceHeader];
      const pulledTokens =
        typeof source === "string" && source && !preloaded && stage !== "prefill"
          ? await this.pullFrom(source, hashes)
          : 0;
      if (pulledTokens) res.setHeader("x-sim-kv-pulled-tokens", String(pulledTokens));
      if (aborted) return;
      const model = String(pr.model ?? this.o.servedModels[0] ?? "sim-model");
      const stream = !!pr.stream && stage !== "prefill";
      const w = new Writer(res, ep, model, id, this.o.streamInterval);
      // What the engine held when this request joined it (INFERA_TIMING_DUMP only).
      const seen = simDumpOn()
        ? {
            submit: performance.now(),
            waiting: this.model.numWaiting(),
            running: this.model.numRunning(),
            pending: this.model.pendingPrefill(),
            drift: this.runner.drift,
          }
        : null;
      await new Promise<void>((resolve, reject) => {
        res.on("close", () => resolve());
        try {
          this.runner.submit({ id, tokens, hashes, maxTokens: n, preloaded, lora, pulledTokens }, (t) => {
            if (aborted) return;
            const cached = peerCached >= 0 ? peerCached : t.cachedTokens;
            if (t.index === 0 && seen) {
              const now = performance.now();
              simTimingDump({
                rid: req.headers["x-request-id"] ?? null,
                sim: this.o.id,
                prompt: tokens.length,
                cached,
                arrive: wallMs(arrive),
                submit: wallMs(seen.submit),
                planned: wallMs(this.runner.stepEnd),
                first: wallMs(now),
                waiting: seen.waiting,
                running: seen.running,
                pending: seen.pending,
                drift: this.runner.drift - seen.drift,
              });
            }
            if (t.index === 0) {
              this.stats.promptTokens += tokens.length;
              this.stats.cachedTokens += cached;
              res.setHeader("x-sim-worker", this.o.id);
              res.setHeader("x-sim-cached-tokens", String(cached));
              res.setHeader("x-sim-prefill-ms", String(Math.round((performance.now() - t0) * this.o.timeScale)));
            }
            const usage = { prompt: tokens.length, completion: t.index + 1, cached };
            if (stream) w.token(t.index, t.done, usage);
            if (t.done) {
              finished = true;
              if (!stream) w.whole(t.index + 1, usage);
              resolve();
            }
          });
        } catch (e) {
          reject(e);
        }
      });
      if (!finished && !aborted) res.destroy();
    } finally {
      this.stats.inflight--;
    }
  }
}

interface Usage {
  prompt: number;
  completion: number;
  cached: number;
}

/** Writes responses in each API's own shape (what the official SDKs parse). */
class Writer {
  private pending: string[] = [];
  private created = Math.floor(Date.now() / 1000);
  constructor(
    private res: http.ServerResponse,
    private ep: string,
    private model: string,
    private id: string,
    private interval: number,
  ) {}

  private openaiUsage(u: Usage) {
    return {
      prompt_tokens: u.prompt,
      completion_tokens: u.completion,
      total_tokens: u.prompt + u.completion,
      prompt_tokens_details: { cached_tokens: u.cached },
    };
  }

  private anthropicUsage(u: Usage, output: number) {
    // Anthropic counts cached input apart from input_tokens.
    return {
      input_tokens: u.prompt - u.cached,
      output_tokens: output,
      cache_read_input_tokens: u.cached,
      cache_creation_input_tokens: 0,
    };
  }

  whole(n: number, u: Usage): void {
    const text = words(n);
    this.res.setHeader("content-type", "application/json");
    if (this.ep === "messages") {
      this.res.end(
        JSON.stringify({
          id: `msg_${this.id}`,
          type: "message",
          role: "assistant",
          model: this.model,
          content: [{ type: "text", text }],
          stop_reason: "max_tokens",
          stop_sequence: null,
          usage: this.anthropicUsage(u, n),
        }),
      );
      return;
    }
    const choice =
      this.ep === "chat"
        ? { index: 0, message: { role: "assistant", content: text }, logprobs: null, finish_reason: "length" }
        : { index: 0, text, logprobs: null, finish_reason: "length" };
    this.res.end(
      JSON.stringify({
        id: `${this.ep === "chat" ? "chatcmpl" : "cmpl"}-${this.id}`,
        object: this.ep === "chat" ? "chat.completion" : "text_completion",
        created: this.created,
        model: this.model,
        choices: [choice],
        usage: this.openaiUsage(u),
      }),
    );
  }

  private sse(event: string | null, data: unknown): string {
    return (event ? `event: ${event}\n` : "") + `data: ${JSON.stringify(data)}\n\n`;
  }

  token(i: number, done: boolean, u: Usage): void {
    const res = this.res;
    if (i === 0) {
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      if (this.ep === "messages") {
        this.pending.push(
          this.sse("message_start", {
            type: "message_start",
            message: {
              id: `msg_${this.id}`,
              type: "message",
              role: "assistant",
              model: this.model,
              content: [],
              stop_reason: null,
              stop_sequence: null,
              usage: this.anthropicUsage(u, 1),
            },
          }),
          this.sse("content_block_start", {
            type: "content_block_start",
            index: 0,
            content_block: { type: "text", text: "" },
          }),
        );
      }
    }
    const piece = (i ? " " : "") + "tok" + i;
    if (this.ep === "chat")
      this.pending.push(
        this.sse(null, {
          id: `chatcmpl-${this.id}`,
          object: "chat.completion.chunk",
          created: this.created,
          model: this.model,
          choices: [
            {
              index: 0,
              delta: i ? { content: piece } : { role: "assistant", content: piece },
              logprobs: null,
              finish_reason: null,
            },
          ],
        }),
      );
    else if (this.ep === "completions")
      this.pending.push(
        this.sse(null, {
          id: `cmpl-${this.id}`,
          object: "text_completion",
          created: this.created,
          model: this.model,
          choices: [{ index: 0, text: piece, logprobs: null, finish_reason: null }],
        }),
      );
    else
      this.pending.push(
        this.sse("content_block_delta", {
          type: "content_block_delta",
          index: 0,
          delta: { type: "text_delta", text: piece },
        }),
      );
    if (done) {
      if (this.ep === "messages") {
        this.pending.push(
          this.sse("content_block_stop", { type: "content_block_stop", index: 0 }),
          this.sse("message_delta", {
            type: "message_delta",
            delta: { stop_reason: "max_tokens", stop_sequence: null },
            usage: { output_tokens: u.completion },
          }),
          this.sse("message_stop", { type: "message_stop" }),
        );
      } else {
        const object = this.ep === "chat" ? "chat.completion.chunk" : "text_completion";
        const choice =
          this.ep === "chat"
            ? { index: 0, delta: {}, logprobs: null, finish_reason: "length" }
            : { index: 0, text: "", logprobs: null, finish_reason: "length" };
        // usage rides on the last chunk (vLLM sends it with stream_options.include_usage; we always do, clients ignore it)
        this.pending.push(
          this.sse(null, {
            id: `${this.ep === "chat" ? "chatcmpl" : "cmpl"}-${this.id}`,
            object,
            created: this.created,
            model: this.model,
            choices: [choice],
            usage: this.openaiUsage(u),
          }),
          "data: [DONE]\n\n",
        );
      }
      res.end(this.pending.join(""));
      this.pending = [];
      return;
    }
    if (i === 0 || this.pending.length >= this.interval || (i + 1) % this.interval === 0) {
      res.write(this.pending.join(""));
      this.pending = [];
    }
  }
}

/** A short digest of the prompt's token ids (x-sim-prompt-digest): equal digests, equal prompts. */
function promptDigest(tokens: number[]): string {
  return crypto.createHash("sha256").update(Uint32Array.from(tokens)).digest("hex").slice(0, 16);
}

function words(n: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push("tok" + i);
  return out.join(" ");
}

/**
 * SimOptions from the shared CLI layer's parse (flags from sim/flags.ts and core/flags.ts,
 * command line > INFERA_* env > --config file > table default). Flags the
 * table shares with other commands keep the simulator's own meaning here.
 */
export function simOptionsFrom(p: Parsed): SimOptions {
  const v = p.values;
  const num = (k: string) => v[k] as number;
  const str = (k: string) => v[k] as string;
  const list = (k: string) =>
    str(k)
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean);
  const ep = str("kv-events-port");
  return {
    id: str("id"),
    host: str("host"),
    port: num("port"),
    kvEventsPort: ep === "none" ? null : Number(ep),
    topic: str("topic"),
    blockSize: num("block-size"),
    capacityBlocks: num("capacity-blocks"),
    prefillUsPerToken: num("prefill-us-per-token"),
    prefillBaseMs: num("prefill-base-ms"),
    decodeMsPerToken: num("decode-ms-per-token"),
    prefillAttnUsPerKCtx: num("prefill-attn-us-per-kctx"),
    decodeUsPerSeq: num("decode-us-per-seq"),
    kvReadUsPerKToken: num("kv-read-us-per-ktoken"),
    stepModel: str("step-model") as SimOptions["stepModel"],
    stepKneeExp: num("step-knee-exp"),
    maxNumBatchedTokens: num("max-num-batched-tokens"),
    maxNumSeqs: num("max-num-seqs"),
    timeScale: num("time-scale"),
    streamInterval: num("stream-interval"),
    frontendUsPerToken: num("frontend-us-per-token"),
    kvEventsMapPort: v["kv-events-map-port"] as number | null,
    kvReplayPort: v["kv-replay-port"] as number | null,
    kvSnapshotPort: v["kv-snapshot-port"] as number | null,
    kvEventEncoding: str("kv-event-encoding") as SimOptions["kvEventEncoding"],
    kvCpuBlocks: num("kv-cpu-blocks"),
    kvSlidingWindow: v["kv-sliding-window"] as number | null,
    dpRank: null,
    dpSize: num("data-parallel-size"),
    engine: str("engine") as SimOptions["engine"],
    role: str("role") as SimOptions["role"],
    kvBytesPerToken: num("kv-bytes-per-token"),
    kvLinkGbps: num("kv-link-gbps"),
    kvSourceHeader: str("kv-source-header").toLowerCase(),
    prefillHeader: str("prefill-header").toLowerCase(),
    malformedEvery: num("malformed-every"),
    tokenizerPath: v["tokenizer-path"] as string | null,
    // The router's etcd default would make every simulator register; a simulator registers only when told where.
    etcdEndpoint: p.given["etcd-endpoint"] ? str("etcd-endpoint") : null,
    etcdPrefix: str("etcd-prefix"),
    advertise: v.advertise as string | null,
    renderFixture: v["render-fixture"] as string | null,
    renderDivergent: v["render-divergent"] as boolean,
    servedModels: list("served-model-name"),
    loraModules: list("lora-modules")
      .map((x) => x.split("=")[0])
      .filter(Boolean),
    maxLoras: num("max-loras"),
    loraLoadMs: num("lora-load-ms"),
  };
}

/** Parses simulator flags (and INFERA_* env, --config) with the shared CLI layer; throws CliError naming the flag. */
export function parseSimArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): SimOptions {
  return simOptionsFrom(parseCommand("sim", argv, env));
}

/** A failed bind, as one line naming the flag of the port (zeromq errors carry the endpoint). */
function bindError(o: SimOptions, e: unknown): Error {
  const m = /:(\d+)$/.exec(String((e as { address?: string }).address ?? ""));
  if (!m) return listenError("--port", o.host, o.port, e);
  const port = Number(m[1]);
  const flag =
    port === o.kvEventsPort
      ? "--kv-events-port"
      : port === o.kvEventsMapPort
        ? "--kv-events-map-port"
        : port === o.kvSnapshotPort
          ? "--kv-snapshot-port"
          : "--kv-replay-port";
  return listenError(flag, o.host, port, e);
}

/** `infera-gate sim`, `npm run sim`: help, version and one-line errors as for every command. */
export function startSimCommand(argv: string[]): Promise<void> {
  return runCommand("sim", argv, async (p) => {
    const o = simOptionsFrom(p);
    if (o.dpSize > 1) return (await import("./dp")).dpMain(o);
    const sim = new EngineSim(o);
    const stop = () => sim.stop().then(() => process.exit(0));
    process.on("SIGTERM", stop);
    process.on("SIGINT", stop);
    await sim.start().catch((e) => Promise.reject(bindError(o, e)));
    const host = o.advertise ?? o.host;
    const events = o.kvEventsPort === null ? undefined : `tcp://${host}:${o.kvEventsPort}`;
    process.stderr.write(`sim ${o.id} role=${o.role} http=${o.host}:${o.port} kv-events=${events ?? "off"}\n`);
    if (o.etcdEndpoint) {
      const { registerWorker } = await import("../runtime/etcd");
      await registerWorker(
        o.etcdEndpoint,
        o.etcdPrefix,
        o.id,
        {
          address: `${host}:${o.port}`,
          role: o.role,
          block_size: o.blockSize,
          kv_events: events,
          kv_replay: o.kvReplayPort === null ? undefined : `tcp://${host}:${o.kvReplayPort}`,
        },
        2,
      );
      process.stderr.write(`sim ${o.id} registered in etcd ${o.etcdEndpoint}${o.etcdPrefix}${o.id}\n`);
    }
  });
}

if (require.main === module) void startSimCommand(process.argv.slice(2));
