// KV event intake: vLLM/SGLang wire format (msgpack EventBatch) over ZMQ PUB/SUB
// or NATS. Both transports feed the same decoder and core/kvevents.applyBatch.
import { decode } from "@msgpack/msgpack";
import * as zmq from "zeromq";
import { KvEvent } from "../core/kvevents";

function hashKey(v: unknown): string {
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number" && Number.isInteger(v)) return String(v);
  if (v instanceof Uint8Array) return Buffer.from(v).toString("hex");
  if (typeof v === "string") return v;
  throw new Error("block hash of unexpected type " + typeof v);
}

function intOf(v: unknown, what: string): number {
  if (typeof v === "bigint") return Number(v);
  if (typeof v === "number" && Number.isInteger(v)) return v;
  throw new Error(what + " is not an integer");
}

function list(v: unknown, what: string): unknown[] {
  if (!Array.isArray(v)) throw new Error(what + " is not an array");
  return v;
}

function uniformBlockSize(v: unknown[]): number {
  const sizes = v.map((x) => intOf(x, "num_toks_per_block"));
  if (!sizes.length || sizes.some((x) => x !== sizes[0])) throw new Error("num_toks_per_block is empty or not uniform");
  return sizes[0];
}

/** One event, array_like+tag form ["BlockStored", ...] or a map with a type/tag field. */
export function normalizeEvent(e: unknown): KvEvent {
  let tag: unknown;
  let f: unknown[];
  if (Array.isArray(e)) {
    tag = e[0];
    f = e.slice(1);
  } else if (e && typeof e === "object") {
    const o = e as Record<string, unknown>;
    tag = o.type ?? o.tag;
    f = [o.block_hashes, o.parent_block_hash, o.token_ids, o.block_size, o.lora_id];
  } else throw new Error("event is neither an array nor a map");
  if (tag === "BlockStored") {
    return {
      type: "BlockStored",
      hashes: list(f[0], "block_hashes").map(hashKey),
      parent: f[1] === null || f[1] === undefined ? null : hashKey(f[1]),
      tokens: list(f[2], "token_ids").map((t) => intOf(t, "token id")),
      // Early vLLM sent num_toks_per_block (a list) where block_size now stands.
      blockSize: Array.isArray(f[3]) ? uniformBlockSize(f[3]) : intOf(f[3], "block_size"),
      loraId: f[4] === null || f[4] === undefined ? null : intOf(f[4], "lora_id"),
    };
  }
  if (tag === "BlockRemoved") return { type: "BlockRemoved", hashes: list(f[0], "block_hashes").map(hashKey) };
  if (tag === "AllBlocksCleared") return { type: "AllBlocksCleared" };
  throw new Error("unknown event tag " + JSON.stringify(tag));
}

/** msgpack EventBatch [ts, events, data_parallel_rank?] -> events. Throws on malformed input. */
export function decodeBatch(payload: Uint8Array): { ts: number; events: KvEvent[]; dpRank: number | null } {
  const b = decode(payload, { useBigInt64: true }) as unknown;
  let ts: unknown, evs: unknown, dp: unknown;
  if (Array.isArray(b)) [ts, evs, dp] = b;
  else if (b && typeof b === "object") ({ ts, events: evs, data_parallel_rank: dp } = b as Record<string, unknown>);
  else throw new Error("batch is neither an array nor a map");
  return {
    ts: typeof ts === "bigint" ? Number(ts) : (ts as number),
    events: list(evs, "events").map(normalizeEvent),
    dpRank: dp === undefined || dp === null ? null : intOf(dp, "data_parallel_rank"),
  };
}

/** Sequence number frame: 8-byte big-endian (vLLM's seq.to_bytes(8, "big")). */
export function decodeSeq(frame: Uint8Array): number {
  if (frame.length !== 8) throw new Error("sequence frame is " + frame.length + " bytes, want 8");
  return Number(Buffer.from(frame).readBigUInt64BE(0));
}

export interface EventSink {
  (workerId: string, seq: number, events: KvEvent[]): void;
}
export interface EventErrorSink {
  (workerId: string, reason: string): void;
}

export interface Subscription {
  close(): void;
}

/** Transport connection state of one subscription (readiness: "events flowing"). */
export interface EventStateSink {
  (connected: boolean): void;
}

/** Subscribes to one worker's ZMQ PUB. Frames: [topic, seq, payload] (topic optional). */
export function subscribeZmq(workerId: string, endpoint: string, topic: string, sink: EventSink, onError: EventErrorSink, onState?: EventStateSink): Subscription {
  const sock = new zmq.Subscriber({ reconnectInterval: 200, reconnectMaxInterval: 2000 });
  if (onState) {
    sock.events.on("connect", () => onState(true));
    sock.events.on("disconnect", () => onState(false));
  }
  sock.connect(endpoint);
  sock.subscribe(topic);
  let closed = false;
  (async () => {
    try {
      for await (const frames of sock) {
        try {
          if (frames.length < 2) throw new Error("want [topic, seq, payload], got " + frames.length + " frame(s)");
          const seq = decodeSeq(frames[frames.length - 2]);
          const batch = decodeBatch(frames[frames.length - 1]);
          sink(workerId, seq, batch.events);
        } catch (e) {
          onError(workerId, (e as Error).message);
        }
      }
    } catch (e) {
      if (!closed) onError(workerId, "subscriber stopped: " + (e as Error).message);
    }
  })();
  return {
    close() {
      closed = true;
      try {
        sock.close();
      } catch {
        /* already closed */
      }
    },
  };
}
