// Engine simulator: an OpenAI-compatible worker with a block-level LRU prefix
// cache that publishes KV events exactly as vLLM does (ZMQ PUB, multipart
// [topic, seq u64 BE, msgpack EventBatch]). Prefill time grows with uncached
// tokens and prefills run one at a time per worker, so cache hits and load
// both show up in TTFT.
import * as http from "http";
import * as crypto from "crypto";
import * as zmq from "zeromq";
import { encode } from "@msgpack/msgpack";
import { loadTokenizer } from "../runtime/tokenizer";
import { endpointOf, parseRequest, Tokenizer } from "../core/request";
import { simRender, SimRender } from "./render";

export interface SimOptions {
  id: string;
  host: string;
  port: number;
  kvEventsPort: number | null;
  topic: string;
  blockSize: number;
  capacityBlocks: number;
  prefillUsPerToken: number;
  prefillBaseMs: number;
  decodeMsPerToken: number;
  role: "mixed" | "prefill" | "decode";
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
}

export function simDefaults(): SimOptions {
  return {
    id: "sim",
    host: "127.0.0.1",
    port: 8001,
    kvEventsPort: 5557,
    topic: "",
    blockSize: 16,
    capacityBlocks: 8192,
    prefillUsPerToken: 100,
    prefillBaseMs: 2,
    decodeMsPerToken: 2,
    role: "mixed",
    prefillHeader: "x-infera-prefill",
    malformedEvery: 0,
    tokenizerPath: null,
    etcdEndpoint: null,
    etcdPrefix: "/infera/workers/",
    advertise: null,
    renderFixture: null,
    renderDivergent: false,
    servedModels: [],
    loraModules: [],
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

export class EngineSim {
  private cache = new Map<bigint, true>(); // insertion order = LRU order
  private pub: zmq.Publisher | null = null;
  private seq = 0;
  private sendChain: Promise<void> = Promise.resolve();
  private prefillChain: Promise<void> = Promise.resolve();
  private server: http.Server | null = null;
  private tok: Tokenizer | null;
  private render: SimRender;
  stats = { requests: 0, promptTokens: 0, cachedTokens: 0, aborted: 0, inflight: 0, batches: 0 };

  constructor(readonly o: SimOptions) {
    this.tok = loadTokenizer(o.tokenizerPath);
    this.render = simRender(this.tok, { fixture: o.renderFixture, divergent: o.renderDivergent });
  }

  async start(): Promise<void> {
    if (this.o.kvEventsPort !== null) {
      this.pub = new zmq.Publisher({ sendHighWaterMark: 100000 });
      await this.pub.bind(`tcp://${this.o.host}:${this.o.kvEventsPort}`);
    }
    this.server = http.createServer((req, res) => this.handle(req, res).catch((e) => this.fail(res, e)));
    this.server.keepAliveTimeout = 60000;
    await new Promise<void>((r) => this.server!.listen(this.o.port, this.o.host, r));
    this.o.port = (this.server.address() as { port: number }).port;
  }

  async stop(): Promise<void> {
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections?.();
    await this.sendChain.catch(() => undefined);
    this.pub?.close();
  }

  cachedBlocks(): number {
    return this.cache.size;
  }

  private publish(events: unknown[]): void {
    if (!this.pub || events.length === 0) return;
    const seq = this.seq++;
    this.stats.batches++;
    const seqBuf = Buffer.alloc(8);
    seqBuf.writeBigUInt64BE(BigInt(seq));
    // EventBatch (array_like): [ts, events, data_parallel_rank]
    const payload = encode([Date.now() / 1000, events, null], { useBigInt64: true });
    const bad = this.o.malformedEvery > 0 && this.stats.batches % this.o.malformedEvery === 0;
    const pub = this.pub;
    // zeromq.js allows one send at a time: chain them.
    this.sendChain = this.sendChain
      .then(async () => {
        if (bad) await pub.send([this.o.topic, Buffer.from("bogus"), Buffer.from([0xc1, 0xff, 0x00])]);
        await pub.send([this.o.topic, seqBuf, Buffer.from(payload)]);
      })
      .catch(() => undefined);
  }

  /** Inserts blocks after a prefill; returns how many prompt tokens were cached before. */
  private admit(tokens: number[], extra: string): { cachedTokens: number; hashes: bigint[] } {
    const bs = this.o.blockSize;
    const n = Math.floor(tokens.length / bs);
    const hashes: bigint[] = [];
    let parent: bigint | null = null;
    for (let i = 0; i < n; i++) {
      parent = engineHash(parent, tokens.slice(i * bs, (i + 1) * bs), i === 0 ? extra : "");
      hashes.push(parent);
    }
    let hit = 0;
    while (hit < n && this.cache.has(hashes[hit])) hit++;
    return { cachedTokens: hit * bs, hashes };
  }

  private store(tokens: number[], hashes: bigint[]): void {
    const bs = this.o.blockSize;
    const stored: unknown[] = [];
    let runStart = -1;
    const flush = (end: number) => {
      if (runStart < 0) return;
      // BlockStored: [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
      stored.push(["BlockStored", hashes.slice(runStart, end), runStart > 0 ? hashes[runStart - 1] : null, tokens.slice(runStart * bs, end * bs), bs, null, "GPU"]);
      runStart = -1;
    };
    for (let i = 0; i < hashes.length; i++) {
      if (this.cache.has(hashes[i])) {
        flush(i);
        this.cache.delete(hashes[i]); // refresh LRU position
        this.cache.set(hashes[i], true);
      } else {
        if (runStart < 0) runStart = i;
        this.cache.set(hashes[i], true);
      }
    }
    flush(hashes.length);
    const removed: bigint[] = [];
    while (this.cache.size > this.o.capacityBlocks) {
      const oldest = this.cache.keys().next().value as bigint;
      this.cache.delete(oldest);
      removed.push(oldest);
    }
    const events: unknown[] = [...stored];
    if (removed.length) events.push(["BlockRemoved", removed, "GPU"]);
    this.publish(events);
  }

  clear(): void {
    this.cache.clear();
    this.publish([["AllBlocksCleared"]]);
  }

  /** Serialized prefill: uncached tokens cost time, one prefill at a time. */
  private prefill(uncached: number): Promise<void> {
    const ms = this.o.prefillBaseMs + (uncached * this.o.prefillUsPerToken) / 1000;
    const run = this.prefillChain.then(() => sleep(ms));
    this.prefillChain = run.catch(() => undefined);
    return run;
  }

  private fail(res: http.ServerResponse, e: unknown): void {
    const err = e as Error & { status?: number; type?: string };
    if (res.headersSent) return void res.destroy();
    const status = err.status ?? 500;
    const b = JSON.stringify({ error: { message: err.message, type: err.type ?? "internal_error", code: status } });
    res.writeHead(status, { "content-type": "application/json" });
    res.end(b);
  }

  private async readBody(req: http.IncomingMessage): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = req.url || "/";
    if (req.method === "GET") {
      if (url === "/health") return void res.end("ok");
      if (url === "/sim/stats") {
        res.setHeader("content-type", "application/json");
        return void res.end(JSON.stringify({ id: this.o.id, role: this.o.role, cached_blocks: this.cache.size, ...this.stats }));
      }
      if (url === "/v1/models") {
        res.setHeader("content-type", "application/json");
        // vLLM's shape: served names, then LoRA adapters with their base model as parent. None given: an empty list (serves any model).
        const base = this.o.servedModels[0];
        const data = this.o.servedModels.map((id) => ({ id, object: "model", owned_by: this.o.id, root: id, parent: null as string | null })).concat(this.o.loraModules.map((id) => ({ id, object: "model", owned_by: this.o.id, root: id, parent: base ?? null })));
        return void res.end(JSON.stringify({ object: "list", data }));
      }
      res.statusCode = 404;
      return void res.end();
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
    if (req.method !== "POST" || !ep) {
      res.statusCode = 404;
      return void res.end();
    }
    const body = await this.readBody(req);
    const pr = parseRequest(ep, body.toString("utf8"), body.length, { maxBodyBytes: 64 << 20 });
    const j = JSON.parse(body.toString("utf8"));
    const maxTokens = Math.max(1, Math.min(4096, Number(j.max_tokens ?? j.max_completion_tokens ?? 16) || 16));
    // Tokens for the cache: the real prompt tokens (rendered + tokenized as the engine would).
    const tokens = this.render.promptTokens(pr, body.toString("utf8"));
    const extra = pr.media.join("\n"); // media feed the first block's hash, like vLLM's mm extra keys
    this.stats.requests++;
    this.stats.inflight++;
    let aborted = false;
    res.on("close", () => {
      if (!res.writableFinished) {
        aborted = true;
        this.stats.aborted++;
      }
    });
    try {
      const stage = req.headers["x-infera-pd-stage"];
      const prefillPeer = req.headers[this.o.prefillHeader] as string | undefined;
      const adm = this.admit(tokens, extra);
      let cached = adm.cachedTokens;
      const t0 = Date.now();
      if (this.o.role === "decode" && prefillPeer && stage !== "prefill") {
        // PD: the named prefill worker computes the KV; we then "receive" it.
        const pres = await fetch(`http://${prefillPeer}${url}`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-infera-pd-stage": "prefill" },
          body: JSON.stringify({ ...j, stream: false, max_tokens: 1 }),
        });
        if (!pres.ok) throw Object.assign(new Error(`prefill worker ${prefillPeer} answered ${pres.status}`), { status: 502 });
        const pj = (await pres.json()) as { usage?: { prompt_tokens_details?: { cached_tokens?: number }; cache_read_input_tokens?: number } };
        cached = pj.usage?.prompt_tokens_details?.cached_tokens ?? pj.usage?.cache_read_input_tokens ?? 0;
        res.setHeader("x-sim-prefill-worker", prefillPeer);
        await sleep(1); // KV transfer
      } else {
        await this.prefill(tokens.length - cached);
      }
      if (aborted) return;
      this.store(tokens, adm.hashes);
      this.stats.promptTokens += tokens.length;
      this.stats.cachedTokens += cached;
      const usage = { prompt_tokens: tokens.length, completion_tokens: maxTokens, total_tokens: tokens.length + maxTokens, prompt_tokens_details: { cached_tokens: cached } };
      res.setHeader("x-sim-worker", this.o.id);
      res.setHeader("x-sim-cached-tokens", String(cached));
      res.setHeader("x-sim-prefill-ms", String(Date.now() - t0));
      if (stage === "prefill" || !pr.stream) {
        const n = stage === "prefill" ? 1 : maxTokens;
        for (let i = 1; i < n && !aborted; i++) await sleep(this.o.decodeMsPerToken);
        const text = words(n);
        res.setHeader("content-type", "application/json");
        if (ep === "messages")
          return void res.end(JSON.stringify({ id: "msg_sim", type: "message", role: "assistant", model: pr.model, content: [{ type: "text", text }], stop_reason: "max_tokens", usage: { input_tokens: tokens.length, output_tokens: n, cache_read_input_tokens: cached } }));
        const choice = ep === "chat" ? { index: 0, message: { role: "assistant", content: text }, finish_reason: "length" } : { index: 0, text, finish_reason: "length" };
        return void res.end(JSON.stringify({ id: "cmpl-sim", object: ep === "chat" ? "chat.completion" : "text_completion", model: pr.model, choices: [choice], usage }));
      }
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      for (let i = 0; i < maxTokens; i++) {
        if (aborted) return;
        if (i > 0) await sleep(this.o.decodeMsPerToken);
        const piece = (i ? " " : "") + "tok" + i;
        let chunk: unknown;
        if (ep === "chat") chunk = { id: "chatcmpl-sim", object: "chat.completion.chunk", model: pr.model, choices: [{ index: 0, delta: i ? { content: piece } : { role: "assistant", content: piece }, finish_reason: null }] };
        else if (ep === "completions") chunk = { id: "cmpl-sim", object: "text_completion", model: pr.model, choices: [{ index: 0, text: piece, finish_reason: null }] };
        else chunk = { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: piece } };
        res.write(ep === "messages" ? `event: content_block_delta\ndata: ${JSON.stringify(chunk)}\n\n` : `data: ${JSON.stringify(chunk)}\n\n`);
      }
      if (ep === "messages") res.end(`event: message_stop\ndata: {"type":"message_stop"}\n\n`);
      else res.end(`data: ${JSON.stringify({ id: "sim", object: "chat.completion.chunk", choices: [{ index: 0, delta: {}, finish_reason: "length" }], usage })}\n\ndata: [DONE]\n\n`);
    } finally {
      this.stats.inflight--;
    }
  }
}

function words(n: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push("tok" + i);
  return out.join(" ");
}

export function parseSimArgs(argv: string[]): SimOptions {
  const o = simDefaults();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => {
      const x = argv[++i];
      if (x === undefined) throw new Error(`${a} needs a value`);
      return x;
    };
    switch (a) {
      case "--id": o.id = v(); break;
      case "--host": o.host = v(); break;
      case "--port": o.port = Number(v()); break;
      case "--kv-events-port": { const x = v(); o.kvEventsPort = x === "none" ? null : Number(x); break; }
      case "--topic": o.topic = v(); break;
      case "--block-size": o.blockSize = Number(v()); break;
      case "--capacity-blocks": o.capacityBlocks = Number(v()); break;
      case "--prefill-us-per-token": o.prefillUsPerToken = Number(v()); break;
      case "--prefill-base-ms": o.prefillBaseMs = Number(v()); break;
      case "--prefill-header": o.prefillHeader = v().toLowerCase(); break;
      case "--decode-ms-per-token": o.decodeMsPerToken = Number(v()); break;
      case "--role": o.role = v() as SimOptions["role"]; break;
      case "--malformed-every": o.malformedEvery = Number(v()); break;
      case "--tokenizer-path": o.tokenizerPath = v(); break;
      case "--etcd-endpoint": o.etcdEndpoint = v(); break;
      case "--etcd-prefix": o.etcdPrefix = v(); break;
      case "--advertise": o.advertise = v(); break;
      case "--render-fixture": o.renderFixture = v(); break;
      case "--render-divergent": o.renderDivergent = true; break;
      case "--served-model-name": o.servedModels = v().split(",").filter(Boolean); break;
      case "--lora-modules": o.loraModules = v().split(",").map((x) => x.split("=")[0]).filter(Boolean); break;
      case "--help":
        process.stdout.write("infera-sim --id ID --port N --kv-events-port N|none [--role mixed|prefill|decode] [--prefill-header x-infera-prefill] [--block-size 16] [--capacity-blocks 8192] [--prefill-us-per-token 100] [--decode-ms-per-token 2] [--malformed-every N]\n");
        process.exit(0);
      default: throw new Error(`unknown flag ${a}`);
    }
  }
  return o;
}

if (require.main === module) {
  const o = parseSimArgs(process.argv.slice(2));
  const sim = new EngineSim(o);
  sim.start().then(async () => {
    const host = o.advertise ?? o.host;
    const events = o.kvEventsPort === null ? undefined : `tcp://${host}:${o.kvEventsPort}`;
    process.stderr.write(`sim ${o.id} role=${o.role} http=${o.host}:${o.port} kv-events=${events ?? "off"}\n`);
    if (o.etcdEndpoint) {
      const { registerWorker } = await import("../runtime/etcd");
      await registerWorker(o.etcdEndpoint, o.etcdPrefix, o.id, { address: `${host}:${o.port}`, role: o.role, block_size: o.blockSize, kv_events: events }, 2);
      process.stderr.write(`sim ${o.id} registered in etcd ${o.etcdEndpoint}${o.etcdPrefix}${o.id}\n`);
    }
  });
  const stop = () => sim.stop().then(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
