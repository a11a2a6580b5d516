// A KV event publisher that behaves like vLLM's ZmqEventPublisher: PUB socket
// with multipart [topic, seq u64 BE, msgpack EventBatch], a bounded replay
// buffer served on a ROUTER socket ([b"", start u64 BE] in; [b"", seq, payload]
// per buffered batch with seq >= start, then [b"", -1 as i64 BE, b""]), events
// encoded as tagged maps (vLLM 2026) or array_like arrays (SGLang, older vLLM).
// Used by the simulator (sim/engine.ts) and by tests that need a real publisher
// they can make drop frames or restart.
import { encode } from "@msgpack/msgpack";
import * as zmq from "zeromq";
import { randomBytes } from "crypto";
import { REMOVED_FIELDS, STORED_FIELDS } from "../runtime/events";

export type Encoding = "map" | "array";

/** One event with vLLM's field names; fields left out are not sent (omit_defaults). */
export interface SimKvEvent {
  type: "BlockStored" | "BlockRemoved" | "AllBlocksCleared" | string;
  [field: string]: unknown;
}

const FIELDS: { [type: string]: string[] } = {
  BlockStored: STORED_FIELDS,
  BlockRemoved: REMOVED_FIELDS,
  AllBlocksCleared: [],
};
// The first fields are required (no default) in vLLM's structs: always sent, null or not.
const REQUIRED: { [type: string]: number } = { BlockStored: 7, BlockRemoved: 2, AllBlocksCleared: 0 };
// SGLang's structs (python/sglang/srt/disaggregation/kv_events.py): array_like,
// tagged, without omit_defaults, so medium is always written (null or a
// StorageMedium value: GPU, CPU_PINNED, DISK, EXTERNAL); no lora_name,
// extra_keys or groups. A salted block is a BlockStoredWithMetadata: the same
// tag with one more element, `metadata`, a plain msgspec Struct (a map
// {cache_salt}); unsalted events keep the shorter array.
const SGLANG_FIELDS: { [type: string]: string[] } = {
  BlockStored: ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "metadata"],
  BlockRemoved: ["block_hashes", "medium"],
  AllBlocksCleared: [],
};
const SGLANG_REQUIRED: { [type: string]: number } = { BlockStored: 6, BlockRemoved: 2, AllBlocksCleared: 0 };
const SGLANG_MEDIUM: { [medium: string]: string } = { CPU: "CPU_PINNED" };

/** Whose struct definitions the encoder follows. */
export type Dialect = "vllm" | "sglang";

/** Encodes one event the way msgspec does for the given struct options. */
export function encodeEvent(e: SimKvEvent, enc: Encoding, dialect: Dialect = "vllm"): unknown {
  if (dialect === "sglang" && typeof e.medium === "string" && SGLANG_MEDIUM[e.medium])
    e = { ...e, medium: SGLANG_MEDIUM[e.medium] };
  const fields = dialect === "sglang" ? SGLANG_FIELDS : FIELDS;
  const required = dialect === "sglang" ? SGLANG_REQUIRED : REQUIRED;
  const names = fields[e.type] || Object.keys(e).filter((k) => k !== "type");
  if (enc === "map") {
    const o: Record<string, unknown> = { type: e.type };
    names.forEach((n, i) => {
      if (e[n] !== undefined && (e[n] !== null || i < (required[e.type] ?? 0))) o[n] = e[n];
      else if (i < (required[e.type] ?? 0)) o[n] = null;
    });
    return o;
  }
  // array_like + omit_defaults: trailing default fields are dropped.
  const arr: unknown[] = [e.type];
  let lastSet = (required[e.type] ?? 0) - 1;
  names.forEach((n, i) => {
    if (e[n] !== undefined && e[n] !== null) lastSet = Math.max(lastSet, i);
  });
  for (let i = 0; i <= lastSet; i++) arr.push(e[names[i]] === undefined ? null : e[names[i]]);
  return arr;
}

export interface PublisherOptions {
  host: string;
  port: number;
  /** ROUTER replay port; null = no replay socket. */
  replayPort: number | null;
  topic: string;
  encoding: Encoding;
  /** Batches kept for replay (vLLM buffer_steps). */
  bufferSteps: number;
  /** EventBatch.data_parallel_rank (vLLM) / attn_dp_rank (SGLang). */
  dpRank: number | null;
  /**
   * "sglang": SGLang's publisher: array_like batches [ts, events, attn_dp_rank]
   * and SGLang's event structs, whatever `encoding` says. Default "vllm".
   */
  dialect?: Dialect;
  /**
   * SGLang's snapshot_endpoint: a ROUTER answering "snapshot-v1" with the
   * placement as of a barrier batch; with it every live topic carries
   * "\0sgl-kv-epoch=<epoch>" (a new epoch per publisher lifecycle). null = none.
   */
  snapshotPort?: number | null;
}

const EPOCH_MARK = "\u0000sgl-kv-epoch=";
const BARRIER_MARK = "\u0000sgl-kv-snapshot=";
/** Records per snapshot chunk frame (SGLang's SNAPSHOT_CHUNK_RECORDS). */
const SNAPSHOT_CHUNK = 4096;

export class KvPublisher {
  private pub: zmq.Publisher | null = null;
  private router: zmq.Router | null = null;
  private seq = 0;
  private buffer: { seq: number; payload: Buffer }[] = [];
  private chain: Promise<void> = Promise.resolve();
  private closed = false;
  private snapRouter: zmq.Router | null = null;
  /** The publisher's lifecycle token (SGLang: a fresh uuid4 hex per publisher). */
  epoch = "";
  /**
   * The placement the snapshot serves, kept beside the sequence like SGLang's
   * publisher thread does: block hash -> its parent, updated by every batch
   * (stores add, removals drop, clears empty it; tiers are not told apart).
   */
  private placement = new Map<string, { hash: unknown; parent: unknown }>();

  constructor(readonly o: PublisherOptions) {}

  async bind(): Promise<void> {
    this.epoch = randomBytes(16).toString("hex");
    this.pub = new zmq.Publisher({ sendHighWaterMark: 100000, linger: 0 });
    await this.pub.bind(`tcp://${this.o.host}:${this.o.port}`);
    if (this.o.replayPort !== null) {
      this.router = new zmq.Router({ linger: 0 });
      await this.router.bind(`tcp://${this.o.host}:${this.o.replayPort}`);
      void this.serveReplay(this.router);
    }
    if (this.o.snapshotPort != null) {
      this.snapRouter = new zmq.Router({ linger: 0, sendTimeout: 500 });
      await this.snapRouter.bind(`tcp://${this.o.host}:${this.o.snapshotPort}`);
      void this.serveSnapshots(this.snapRouter);
    }
  }

  /** The live topic frame: with a snapshot endpoint, SGLang appends its epoch. */
  private liveTopic(): string {
    return this.o.snapshotPort != null ? this.o.topic + EPOCH_MARK + this.epoch : this.o.topic;
  }

  private track(events: SimKvEvent[]): void {
    for (const e of events) {
      if (e.type === "BlockStored") {
        let parent: unknown = e.parent_block_hash ?? null;
        for (const h of (e.block_hashes as unknown[]) || []) {
          this.placement.set(String(h), { hash: h, parent });
          parent = h;
        }
      } else if (e.type === "BlockRemoved")
        for (const h of (e.block_hashes as unknown[]) || []) this.placement.delete(String(h));
      else if (e.type === "AllBlocksCleared") this.placement.clear();
    }
  }

  /**
   * SGLang's snapshot-v1: [id, b"", b"snapshot-v1"] in; a barrier batch (no
   * events) goes out on the live stream under "<topic>\0sgl-kv-epoch=<epoch>
   * \0sgl-kv-snapshot=<barrier id>" and into the replay buffer, then the
   * answer: header [version 1, epoch, replica_rank, resume_seq, barrier_seq,
   * barrier_id, record_count], chunks of [parent_block_hash, [block_hash]]
   * records, and b"end"; anything else gets [b"error", text].
   */
  private async serveSnapshots(sock: zmq.Router): Promise<void> {
    try {
      for await (const frames of sock) {
        const id = frames[0];
        if (frames.length !== 3 || frames[1].length !== 0 || frames[2].toString() !== "snapshot-v1") {
          await sock
            .send([id, Buffer.alloc(0), Buffer.from("error"), Buffer.from("invalid snapshot-v1 request")])
            .catch(() => undefined);
          continue;
        }
        const barrierId = randomBytes(16).toString("hex");
        const barrierSeq = this.seq++;
        const rank = this.o.dpRank ?? 0;
        const payload = Buffer.from(encode([Date.now() / 1000, [], rank], { useBigInt64: true }));
        this.buffer.push({ seq: barrierSeq, payload });
        if (this.buffer.length > this.o.bufferSteps) this.buffer.shift();
        const blocks = [...this.placement.values()].map((b) => [b.parent, [b.hash]]);
        const s = Buffer.alloc(8);
        s.writeBigUInt64BE(BigInt(barrierSeq));
        const pub = this.pub;
        const topic = this.liveTopic() + BARRIER_MARK + barrierId;
        this.chain = this.chain.then(async () => {
          if (pub && !this.closed) await pub.send([topic, s, payload]);
        });
        await this.chain.catch(() => undefined);
        const header = encode([1, this.epoch, rank, barrierSeq + 1, barrierSeq, barrierId, blocks.length], {
          useBigInt64: true,
        });
        await sock.send([id, Buffer.alloc(0), Buffer.from("header"), Buffer.from(header)]);
        for (let i = 0; i < blocks.length; i += SNAPSHOT_CHUNK)
          await sock.send([
            id,
            Buffer.alloc(0),
            Buffer.from("chunk"),
            Buffer.from(encode(blocks.slice(i, i + SNAPSHOT_CHUNK), { useBigInt64: true })),
          ]);
        await sock.send([id, Buffer.alloc(0), Buffer.from("end"), Buffer.alloc(0)]);
      }
    } catch {
      /* socket closed */
    }
  }

  private async serveReplay(sock: zmq.Router): Promise<void> {
    const end = Buffer.alloc(8);
    end.writeBigInt64BE(-1n);
    try {
      for await (const frames of sock) {
        // [identity, b"", start u64 BE]
        if (frames.length !== 3 || frames[2].length !== 8) continue;
        const start = Number(frames[2].readBigUInt64BE(0));
        for (const b of this.buffer.slice()) {
          if (b.seq < start) continue;
          const s = Buffer.alloc(8);
          s.writeBigUInt64BE(BigInt(b.seq));
          await sock.send([frames[0], Buffer.alloc(0), s, b.payload]);
        }
        await sock.send([frames[0], Buffer.alloc(0), end, Buffer.alloc(0)]);
      }
    } catch {
      /* socket closed */
    }
  }

  /** Next sequence number to be published. */
  nextSeq(): number {
    return this.seq;
  }

  /**
   * Publishes one batch. live=false keeps it only in the replay buffer, as if
   * the subscriber missed it (a slow router, a dropped frame).
   */
  publish(events: SimKvEvent[], live = true, dpRank: number | null = this.o.dpRank): Promise<void> {
    const seq = this.seq++;
    // SGLang's EventBatch has no omit_defaults and its publish() fills attn_dp_rank
    // with the publisher's rank: always three elements.
    const batch =
      this.o.dialect === "sglang"
        ? [Date.now() / 1000, events.map((e) => encodeEvent(e, "array", "sglang")), dpRank ?? 0]
        : this.o.encoding === "map"
          ? { ts: Date.now() / 1000, events: events.map((e) => encodeEvent(e, "map")), data_parallel_rank: dpRank }
          : [Date.now() / 1000, events.map((e) => encodeEvent(e, "array")), dpRank];
    const payload = Buffer.from(encode(batch, { useBigInt64: true }));
    // Like SGLang: the placement follows every batch, sent or not.
    if (this.o.snapshotPort != null) this.track(events);
    this.buffer.push({ seq, payload });
    if (this.buffer.length > this.o.bufferSteps) this.buffer.shift();
    if (!live) return Promise.resolve();
    const s = Buffer.alloc(8);
    s.writeBigUInt64BE(BigInt(seq));
    const pub = this.pub;
    const topic = this.liveTopic();
    this.chain = this.chain.then(async () => {
      if (pub && !this.closed) await pub.send([topic, s, payload]);
    });
    return this.chain.catch(() => undefined);
  }

  /**
   * An engine restart: sockets closed and bound again, sequence back to 0, replay
   * buffer empty (a new process has none of the old batches).
   */
  async restart(): Promise<void> {
    await this.chain.catch(() => undefined);
    this.pub?.close();
    this.router?.close();
    this.snapRouter?.close();
    this.seq = 0;
    this.buffer = [];
    this.placement.clear();
    await new Promise((r) => setTimeout(r, 100));
    for (let i = 0; ; i++) {
      try {
        await this.bind();
        return;
      } catch (e) {
        if (i >= 50) throw e; // the old socket may hold the port for a moment
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  async close(): Promise<void> {
    await this.chain.catch(() => undefined);
    this.closed = true;
    this.pub?.close();
    this.router?.close();
    this.snapRouter?.close();
  }
}
