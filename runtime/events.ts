// KV event intake: vLLM/SGLang wire format (msgpack EventBatch) over ZMQ PUB/SUB
// or NATS. Both transports feed the same decoder and core/kvevents.applyBatch.
import { decode } from "@msgpack/msgpack";
import * as zmq from "zeromq";
import { createHash } from "crypto";
import { ExtraKeys, KvEvent } from "../core/kvevents";

const U64 = 1n << 64n;

/**
 * Engine block hash -> stable string key. Ints print as unsigned 64-bit (a
 * publisher that packs the same hash signed, e.g. Python's hash(), maps to the
 * same key); bytes (ExternalBlockHash) as hex.
 */
function hashKey(v: unknown): string {
  if (typeof v === "bigint") return (v < 0n ? v + U64 : v).toString();
  if (typeof v === "number" && Number.isInteger(v)) return v < 0 ? (BigInt(v) + U64).toString() : String(v);
  if (v instanceof Uint8Array) return Buffer.from(v).toString("hex");
  if (typeof v === "string") return v;
  throw new Error("block hash of unexpected type " + typeof v);
}

function intOf(v: unknown, what: string): number {
  if (typeof v === "bigint") return Number(v);
  if (typeof v === "number" && Number.isInteger(v)) return v;
  throw new Error(what + " is not an integer");
}

function optInt(v: unknown, what: string): number | null {
  return v === null || v === undefined ? null : intOf(v, what);
}

function optStr(v: unknown): string | null {
  if (v === null || v === undefined) return null;
  if (v instanceof Uint8Array) return Buffer.from(v).toString("utf8");
  return String(v);
}

function isPlainMap(v: unknown): boolean {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array);
}

/** A name field: a string (or UTF-8 bytes); anything else is refused, never stringified. */
function nameStr(v: unknown, what: string): string | null {
  if (v === null || v === undefined) return null;
  if (typeof v === "string") return v;
  if (v instanceof Uint8Array) return Buffer.from(v).toString("utf8");
  throw new Error(what + " is a " + (Array.isArray(v) ? "list" : typeof v) + ", not a string");
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

/** extra_keys entries made JSON-safe (they travel to njs): bytes -> { b: hex }, big ints -> strings. */
function jsonSafe(v: unknown): unknown {
  if (v instanceof Uint8Array) return { b: Buffer.from(v).toString("hex") };
  if (typeof v === "bigint") return v.toString();
  if (Array.isArray(v)) return v.map(jsonSafe);
  if (v && typeof v === "object") {
    const o: Record<string, unknown> = {};
    for (const k of Object.keys(v)) o[k] = jsonSafe((v as Record<string, unknown>)[k]);
    return o;
  }
  return v === undefined ? null : v;
}

function extraKeys(v: unknown): ExtraKeys | null {
  if (v === null || v === undefined) return null;
  return list(v, "extra_keys").map((e) =>
    e === null || e === undefined ? null : Array.isArray(e) ? (jsonSafe(e) as unknown[]) : [jsonSafe(e)],
  );
}

// Field order of vLLM's array_like (positional) encoding, after the tag (the simulator writes the same).
export const STORED_FIELDS = [
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
  "medium",
  "lora_name",
  "extra_keys",
  "group_idx",
  "kv_cache_spec_kind",
  "kv_cache_spec_sliding_window",
];
export const REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"];
const CLEARED_FIELDS = ["medium"];

/**
 * One event: array_like+tag form ["BlockStored", ...] (SGLang, older vLLM) or a
 * map with a "type" tag (vLLM since 2026). Unknown fields are ignored; an
 * unknown tag yields null (the caller skips and counts it).
 */
export function normalizeEvent(e: unknown): KvEvent | null {
  let tag: unknown;
  let get: (name: string) => unknown;
  if (Array.isArray(e)) {
    tag = e[0];
    const names = tag === "BlockStored" ? STORED_FIELDS : tag === "BlockRemoved" ? REMOVED_FIELDS : CLEARED_FIELDS;
    get = (name) => e[1 + names.indexOf(name)];
  } else if (e && typeof e === "object") {
    const o = e as Record<string, unknown>;
    tag = o.type ?? o.tag;
    get = (name) => o[name];
  } else throw new Error("event is neither an array nor a map");
  if (tag === "BlockStored") {
    const bs = get("block_size");
    // SGLang's BlockStoredWithMetadata appends `metadata` (a msgspec Struct,
    // hence a map {cache_salt}) right after medium: in the array form that is
    // the slot vLLM uses for lora_name. A map there is SGLang's metadata, never
    // an adapter name; a map-form event names it `metadata`.
    const slot = get("lora_name");
    const meta = isPlainMap(slot) ? slot : isPlainMap(get("metadata")) ? get("metadata") : null;
    const salt = meta ? optStr((meta as Record<string, unknown>).cache_salt) : null;
    const hashes = list(get("block_hashes"), "block_hashes").map(hashKey);
    return {
      type: "BlockStored",
      hashes,
      parent:
        get("parent_block_hash") === null || get("parent_block_hash") === undefined
          ? null
          : hashKey(get("parent_block_hash")),
      tokens: list(get("token_ids"), "token_ids").map((t) => intOf(t, "token id")),
      // Early vLLM sent num_toks_per_block (a list) where block_size now stands.
      blockSize: Array.isArray(bs) ? uniformBlockSize(bs) : intOf(bs, "block_size"),
      loraId: optInt(get("lora_id"), "lora_id"),
      medium: optStr(get("medium")),
      loraName: meta ? null : nameStr(slot, "lora_name"),
      // SGLang folds the salt into every block of a salted chain (its radix key
      // carries it): as extra keys, the salt roots a chain that starts here
      // exactly as vLLM's block-0 salt does (core/kvevents.ts chainRoot), the
      // same root a request with that cache_salt computes.
      extraKeys: salt ? hashes.map(() => [salt]) : extraKeys(get("extra_keys")),
      groupIdx: optInt(get("group_idx"), "group_idx"),
      specKind: optStr(get("kv_cache_spec_kind")),
      slidingWindow: optInt(get("kv_cache_spec_sliding_window"), "kv_cache_spec_sliding_window"),
    };
  }
  if (tag === "BlockRemoved")
    return {
      type: "BlockRemoved",
      hashes: list(get("block_hashes"), "block_hashes").map(hashKey),
      medium: optStr(get("medium")),
      groupIdx: optInt(get("group_idx"), "group_idx"),
    };
  if (tag === "AllBlocksCleared") return { type: "AllBlocksCleared", medium: optStr(get("medium")) };
  return null;
}

export interface DecodedBatch {
  ts: number;
  events: KvEvent[];
  dpRank: number | null;
  /** Events with a tag we do not know (skipped, the rest of the batch applies). */
  unknown: number;
}

/** msgpack EventBatch [ts, events, rank?] or {ts, events, data_parallel_rank | attn_dp_rank} -> events. Throws on malformed input. */
export function decodeBatch(payload: Uint8Array): DecodedBatch {
  const b = decode(payload, { useBigInt64: true }) as unknown;
  let ts: unknown, evs: unknown, dp: unknown;
  if (Array.isArray(b)) [ts, evs, dp] = b;
  else if (b && typeof b === "object") {
    const o = b as Record<string, unknown>;
    ts = o.ts;
    evs = o.events;
    // vLLM names the rank data_parallel_rank; SGLang's EventBatch field is attn_dp_rank
    // (its encoder is array_like, where the rank is the third element either way).
    dp = o.data_parallel_rank ?? o.attn_dp_rank;
  } else throw new Error("batch is neither an array nor a map");
  const events: KvEvent[] = [];
  let unknown = 0;
  for (const e of list(evs, "events")) {
    const n = normalizeEvent(e);
    if (n) events.push(n);
    else unknown++;
  }
  return {
    ts: typeof ts === "bigint" ? Number(ts) : (ts as number),
    events,
    dpRank: dp === undefined || dp === null ? null : intOf(dp, "data_parallel_rank"),
    unknown,
  };
}

/** Sequence number frame: 8-byte big-endian (vLLM's seq.to_bytes(8, "big")). */
export function decodeSeq(frame: Uint8Array): number {
  if (frame.length !== 8) throw new Error("sequence frame is " + frame.length + " bytes, want 8");
  return Number(Buffer.from(frame).readBigUInt64BE(0));
}

/**
 * The same frame as an exact decimal string, for logs: a u64 above 2^53 has
 * no exact double, so printing decodeSeq's number would show a neighbour.
 */
export function seqText(frame: Uint8Array): string {
  if (frame.length !== 8) return "(" + frame.length + "-byte frame)";
  return Buffer.from(frame).readBigUInt64BE(0).toString();
}

/** SGLang's topic-frame suffixes (ZmqEventPublisher with a snapshot endpoint). */
const EPOCH_MARK = Buffer.from("\u0000sgl-kv-epoch=");
const BARRIER_MARK = Buffer.from("\u0000sgl-kv-snapshot=");

/** A topic frame for a log line: control bytes escaped, at most 64 characters. */
function printable(frame: Uint8Array): string {
  const t = Buffer.from(frame).toString("utf8").slice(0, 64);
  return t.replace(/[\u0000-\u001f\u007f]/g, (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

/** What a topic frame says beyond the topic: SGLang's publisher epoch and snapshot barrier id. */
export interface TopicInfo {
  epoch: string | null;
  barrier: string | null;
}

/**
 * Matches a topic frame against the configured topic exactly. A ZMQ
 * subscription is a byte-prefix filter, so a router subscribed to "kv-events"
 * is also sent "kv-events-canary": only the topic itself, or the topic followed
 * by SGLang's "\0sgl-kv-epoch=<epoch>" (then optionally
 * "\0sgl-kv-snapshot=<barrier id>") suffix, is ours. null for any other topic.
 */
export function parseTopic(frame: Uint8Array, topic: string): TopicInfo | null {
  const t = Buffer.from(topic, "utf8");
  const f = Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength);
  if (f.length < t.length || !f.subarray(0, t.length).equals(t)) return null;
  const rest = f.subarray(t.length);
  if (rest.length === 0) return { epoch: null, barrier: null };
  if (rest.length <= EPOCH_MARK.length || !rest.subarray(0, EPOCH_MARK.length).equals(EPOCH_MARK)) return null;
  const tail = rest.subarray(EPOCH_MARK.length);
  const b = tail.indexOf(BARRIER_MARK);
  const epoch = (b < 0 ? tail : tail.subarray(0, b)).toString("utf8");
  if (!epoch) return null;
  return { epoch, barrier: b < 0 ? null : tail.subarray(b + BARRIER_MARK.length).toString("utf8") };
}

/** How a batch reached us: restart = the engine restarted (drop its mirror first). */
export interface BatchInfo {
  restart: boolean;
  replayed: boolean;
  unknown: number;
  dpRank: number | null;
  /** The batch's sequence number exactly as the engine sent it (decimal), for logs. */
  seqText?: string;
  /** This batch is a resync from the engine's placement snapshot (it ends with a Snapshot event). */
  resync?: boolean;
}
export interface EventSink {
  (workerId: string, seq: number, events: KvEvent[], info: BatchInfo): void;
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

export interface ReplayOptions {
  /** The worker's replay ROUTER endpoint (vLLM/SGLang --kv-events-config replay_endpoint). */
  replay?: string;
  /** How long one replay request may take before we give up on it (ms). */
  replayTimeoutMs?: number;
  /** One socket for several DP ranks: keep only batches tagged with this rank (others still advance the sequence). */
  dpRank?: number;
  log?: (level: "info" | "warn", msg: string, fields?: Record<string, string | number | boolean>) => void;
  /** A frame on another topic that shares our topic as a prefix was dropped. */
  onOtherTopic?: () => void;
  /** SGLang's snapshot ROUTER endpoint: a gap replay cannot fill resyncs from it. */
  snapshot?: string;
}

/** SGLang's snapshot-v1 answer: the header's cut and every block the replica holds. */
export interface PlacementSnapshot {
  epoch: string;
  /** The barrier batch's seq: the snapshot is the state after every batch up to it. */
  barrierSeq: number;
  barrierText: string;
  resumeSeq: number;
  hashes: string[];
}

/**
 * Asks an SGLang snapshot ROUTER (ZmqEventPublisher snapshot_endpoint) for its
 * placement cut: sends [b"", b"snapshot-v1"] from a DEALER and reads
 * [b"", b"header", msgpack [version, epoch, replica_rank, resume_seq,
 * barrier_seq, barrier_id, record_count]], then [b"", b"chunk", msgpack
 * [[parent_block_hash, [block_hash, ...]], ...]] frames, up to [b"", b"end",
 * b""]; [b"", b"error", text] instead when the engine cannot answer. Throws
 * with the reason on an error answer, a malformed one, or no answer in time.
 */
export async function requestSnapshot(endpoint: string, timeoutMs: number): Promise<PlacementSnapshot> {
  const sock = new zmq.Dealer({ linger: 0, receiveTimeout: timeoutMs, sendTimeout: timeoutMs });
  try {
    sock.connect(endpoint);
    await sock.send([Buffer.alloc(0), Buffer.from("snapshot-v1")]);
    const deadline = Date.now() + timeoutMs;
    let header: unknown[] | null = null;
    const hashes: string[] = [];
    for (let i = 0; i < 10000000 && Date.now() < deadline; i++) {
      const frames = await sock.receive();
      const f = frames[0] && frames[0].length === 0 ? frames.slice(1) : frames;
      const kind = f[0] ? Buffer.from(f[0]).toString("utf8") : "";
      if (kind === "error")
        throw new Error("engine answered: " + (f[1] ? Buffer.from(f[1]).toString("utf8") : "error"));
      if (kind === "header") {
        const h = decode(f[1], { useBigInt64: true });
        if (!Array.isArray(h) || h.length < 7)
          throw new Error(
            "snapshot header is not [version, epoch, replica_rank, resume_seq, barrier_seq, barrier_id, record_count]",
          );
        if (intOf(h[0], "snapshot version") !== 1) throw new Error("snapshot version " + String(h[0]) + ", want 1");
        header = h;
      } else if (kind === "chunk") {
        if (!header) throw new Error("snapshot chunk before its header");
        for (const rec of list(decode(f[1], { useBigInt64: true }), "snapshot chunk")) {
          const r = list(rec, "snapshot block");
          for (const h of list(r[1], "snapshot block_hashes")) hashes.push(hashKey(h));
        }
      } else if (kind === "end") {
        if (!header) throw new Error("snapshot ended without a header");
        const count = intOf(header[6], "record_count");
        if (hashes.length < count) throw new Error(`snapshot has ${hashes.length} of ${count} records`);
        const bs = header[4];
        return {
          epoch: optStr(header[1]) ?? "",
          barrierSeq: intOf(bs, "barrier_seq"),
          barrierText: typeof bs === "bigint" ? bs.toString() : String(bs),
          resumeSeq: intOf(header[3], "resume_seq"),
          hashes,
        };
      } else throw new Error(`unexpected snapshot frame '${kind.slice(0, 32)}'`);
    }
    throw new Error("no end of snapshot in time");
  } catch (e) {
    const m = (e as Error).message;
    throw new Error(
      /timed? ?out|Socket temporarily unavailable|EAGAIN/i.test(m) ? `no answer within ${timeoutMs} ms` : m,
    );
  } finally {
    sock.close();
  }
}

const END_SEQ = -1n;

/**
 * Asks a replay ROUTER for every buffered batch with seq >= start: sends
 * [b"", start as 8-byte BE] from a DEALER, reads [b"", seq, payload] until the
 * END_SEQ (-1, signed 8-byte BE) terminator. Null when it does not answer in time.
 */
export async function requestReplay(
  endpoint: string,
  start: number,
  timeoutMs: number,
): Promise<{ seq: number; payload: Uint8Array; text: string }[] | null> {
  const sock = new zmq.Dealer({ linger: 0, receiveTimeout: timeoutMs, sendTimeout: timeoutMs });
  const out: { seq: number; payload: Uint8Array; text: string }[] = [];
  try {
    sock.connect(endpoint);
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(BigInt(start));
    await sock.send([Buffer.alloc(0), b]);
    const deadline = Date.now() + timeoutMs;
    for (let i = 0; i < 10000000 && Date.now() < deadline; i++) {
      const frames = await sock.receive();
      const f = frames[0] && frames[0].length === 0 ? frames.slice(1) : frames;
      if (f.length < 1 || f[0].length !== 8) continue;
      const seq = Buffer.from(f[0]).readBigInt64BE(0);
      if (seq === END_SEQ) return out;
      out.push({ seq: Number(seq), payload: f[1], text: seqText(f[0]) });
    }
    return null;
  } catch {
    return null;
  } finally {
    sock.close();
  }
}

function digest(p: Uint8Array): string {
  // Identity of one batch, to tell "the same engine, reconnected" from "a restarted one".
  return createHash("sha1").update(p).digest("hex");
}

/** What a transport knows about one live frame beyond seq and payload. */
export interface FrameInfo {
  /** The sequence number as sent (exact decimal), for logs. */
  seqText?: string;
  /** SGLang's publisher epoch from the topic frame: a new one is a new publisher (restart). */
  epoch?: string | null;
  /** SGLang's snapshot barrier id from the topic frame (an empty batch marking a snapshot's cut). */
  barrier?: string | null;
}

/** Feeds one worker's frames, in arrival order, through gap repair and restart detection. */
export interface Sequencer {
  /** One live frame: its sequence number and msgpack EventBatch payload. */
  frame(seq: number, payload: Uint8Array, info?: FrameInfo): void;
  /** The transport reconnected: the same engine, or a restarted one? */
  reconnected(): void;
  close(): void;
}

/**
 * Repair, don't wipe: the sequencing shared by the ZMQ and NATS transports.
 *
 * With a replay endpoint the stream is repaired, not wiped: on joining we ask
 * for everything buffered (a router that starts after its workers ends with
 * the same mirror as one that saw it all); on a sequence gap we ask from the
 * first missing seq and hold live frames until the answer is applied; when
 * the connection comes back we replay the last applied batch and compare its
 * bytes: a different batch under that seq means the engine restarted (its
 * mirror is dropped, then rebuilt from its replay buffer). Only when replay
 * cannot fill a gap does the next batch arrive with a gap (core clears).
 * Without a replay endpoint a reconnect cannot be verified, so it counts as a
 * restart: stale blocks are worse than a cold mirror.
 */
export function createSequencer(
  workerId: string,
  sink: EventSink,
  onError: EventErrorSink,
  ro: ReplayOptions = {},
): Sequencer {
  let closed = false;
  let last: number | undefined;
  let lastText = "";
  let lastDigest = "";
  let epoch: string | null = null;
  let resyncCut: number | undefined;
  let repairing = false;
  let pendingRestart = false;
  const held: { seq: number; payload: Uint8Array; text?: string }[] = [];
  const timeout = ro.replayTimeoutMs ?? 2000;
  // Exact decimal of a seq for logs: the frame's own text when we have it.
  const txt = (seq: number, text?: string): string => text ?? String(seq);
  const nextText = (): string =>
    lastText && /^\d+$/.test(lastText) ? (BigInt(lastText) + 1n).toString() : String((last ?? -1) + 1);

  const deliver = (seq: number, payload: Uint8Array, replayed: boolean, text?: string): void => {
    let batch: DecodedBatch;
    try {
      batch = decodeBatch(payload);
    } catch (e) {
      onError(workerId, `seq=${txt(seq, text)}: ${(e as Error).message}`);
      last = seq; // a refused frame is not a gap
      lastText = txt(seq, text);
      return;
    }
    const restart = pendingRestart;
    pendingRestart = false;
    last = seq;
    lastText = txt(seq, text);
    lastDigest = digest(payload);
    const other = ro.dpRank !== undefined && batch.dpRank !== null && batch.dpRank !== ro.dpRank;
    sink(workerId, seq, other ? [] : batch.events, {
      restart,
      replayed,
      unknown: batch.unknown,
      dpRank: batch.dpRank,
      seqText: txt(seq, text),
    });
  };

  // Replays from start, applies what came back in order, then the held live frames.
  const repair = async (start: number, why: string, startText?: string): Promise<void> => {
    repairing = true;
    const got = closed ? null : await requestReplay(ro.replay as string, start, timeout);
    if (closed) return;
    if (got === null)
      ro.log?.("warn", "kv-events: replay got no answer", {
        worker: workerId,
        from_seq: startText ?? start,
        why,
        endpoint: ro.replay as string,
      });
    else if (got.length && got[0].seq > start && start > 0)
      ro.log?.(
        "warn",
        ro.snapshot
          ? "kv-events: replay gap cannot be filled: resyncing from the snapshot endpoint"
          : "kv-events: replay gap cannot be filled",
        { worker: workerId, buffer_from_seq: got[0].text ?? got[0].seq, from_seq: startText ?? start },
      );
    const unfilled = got === null || (got.length > 0 && got[0].seq > start);
    if (unfilled && ro.snapshot && start > 0 && !pendingRestart) {
      // What replay did return is live history after the gap: it goes in before the cut.
      for (const f of got || []) held.push({ seq: f.seq, payload: f.payload, text: f.text });
      return resync(why);
    }
    const all = (got || [])
      .map((f) => ({ seq: f.seq, payload: f.payload, replayed: true, text: f.text as string | undefined }))
      .concat(held.splice(0).map((f) => ({ seq: f.seq, payload: f.payload, replayed: false, text: f.text })));
    all.sort((a, b) => a.seq - b.seq);
    for (const f of all) {
      if (last !== undefined && f.seq <= last) continue;
      deliver(f.seq, f.payload, f.replayed, f.text);
    }
    repairing = false;
  };

  /**
   * A gap nothing can fill: SGLang's placement snapshot instead of a wipe. The
   * engine sends a barrier batch on the live stream and answers with its
   * placement as of that barrier. The live frames we hold up to the barrier go
   * first (they carry tokens, so their blocks can be hashed our way), then the
   * snapshot drops every mirrored block the engine no longer holds, all as one
   * batch at the barrier's seq; later frames follow as usual.
   */
  const resync = async (why: string): Promise<void> => {
    repairing = true;
    let snap: PlacementSnapshot | null = null;
    let err = "";
    try {
      snap = closed ? null : await requestSnapshot(ro.snapshot as string, timeout);
    } catch (e) {
      err = (e as Error).message;
    }
    if (closed) return;
    held.sort((a, b) => a.seq - b.seq);
    if (!snap) {
      // No snapshot: the next batch arrives with its gap and core clears the mirror.
      ro.log?.("warn", "kv-events: snapshot failed; mirror will be cleared", {
        worker: workerId,
        endpoint: ro.snapshot as string,
        why,
        error: String(err),
      });
      for (const f of held.splice(0)) if (last === undefined || f.seq > last) deliver(f.seq, f.payload, false, f.text);
      repairing = false;
      return;
    }
    const cut = snap.barrierSeq;
    const before = held.filter((f) => f.seq < cut && (last === undefined || f.seq > last));
    const after = held.filter((f) => f.seq > cut);
    held.length = 0;
    const events: KvEvent[] = [];
    let unknown = 0;
    for (const f of before) {
      try {
        const b = decodeBatch(f.payload);
        unknown += b.unknown;
        if (!(ro.dpRank !== undefined && b.dpRank !== null && b.dpRank !== ro.dpRank))
          for (const e of b.events) events.push(e);
      } catch (e) {
        onError(workerId, `seq=${txt(f.seq, f.text)}: ${(e as Error).message}`);
      }
    }
    events.push({ type: "Snapshot", hashes: snap.hashes });
    const restart = pendingRestart;
    pendingRestart = false;
    last = cut;
    resyncCut = cut;
    lastText = snap.barrierText;
    lastDigest = "";
    if (snap.epoch) epoch = snap.epoch;
    sink(workerId, cut, events, {
      restart,
      replayed: false,
      unknown,
      dpRank: null,
      seqText: snap.barrierText,
      resync: true,
    });
    for (const f of after) if (f.seq > (last as number)) deliver(f.seq, f.payload, false, f.text);
    repairing = false;
  };

  // After a reconnect: is it the same engine? Replay the last applied batch and compare.
  const verify = async (): Promise<void> => {
    if (last === undefined) return;
    repairing = true;
    const got = await requestReplay(ro.replay as string, last, timeout);
    if (closed) return;
    const same = got !== null && got.length > 0 && got[0].seq === last && digest(got[0].payload) === lastDigest;
    if (!same) {
      ro.log?.(
        "warn",
        "kv-events: reconnected to a different event stream (engine restart): rebuilding the mirror from replay",
        { worker: workerId },
      );
      pendingRestart = true;
      last = undefined;
      await repair(0, "restart");
      return;
    }
    const rest: { seq: number; payload: Uint8Array; text?: string }[] = got
      .slice(1)
      .concat(held.splice(0) as typeof got);
    rest.sort((a, b) => a.seq - b.seq);
    for (const f of rest) if (last === undefined || f.seq > last) deliver(f.seq, f.payload, true, f.text);
    repairing = false;
  };

  if (ro.replay) void repair(0, "join");

  return {
    frame(seq, payload, info) {
      if (closed) return;
      const text = info?.seqText;
      // SGLang names its publisher's lifecycle in the topic: another epoch is
      // another publisher (a restarted engine or DP replica), whatever its seq says.
      const ep = info?.epoch ?? null;
      const newEpoch = ep !== null && epoch !== null && ep !== epoch;
      if (ep !== null) epoch = ep;
      // The barrier of a snapshot we already applied (its cut is our last seq):
      // the snapshot answer can overtake it, and it holds no events.
      if (last !== undefined && seq === last && !newEpoch && (info?.barrier || seq === resyncCut)) return;
      if (repairing) {
        if (held.length < 1000000) held.push({ seq, payload, text });
        return;
      }
      if (newEpoch || (last !== undefined && seq <= last)) {
        // The sequence went back: a restarted engine. Its earlier batches may be in its buffer.
        if (newEpoch)
          ro.log?.("warn", "kv-events: publisher epoch changed (engine restart): mirror dropped", {
            worker: workerId,
            epoch: String(ep),
          });
        pendingRestart = true;
        last = undefined;
        lastText = "";
        if (ro.replay) {
          held.push({ seq, payload, text });
          void repair(0, newEpoch ? "new epoch" : "sequence reset");
          return;
        }
      } else if (last !== undefined && seq !== last + 1 && ro.replay) {
        held.push({ seq, payload, text });
        void repair(last + 1, "gap", nextText());
        return;
      } else if (last !== undefined && seq !== last + 1 && ro.snapshot) {
        held.push({ seq, payload, text });
        void resync(`gap at seq=${nextText()}`);
        return;
      }
      deliver(seq, payload, false, text);
    },
    reconnected() {
      if (closed || repairing) return;
      if (ro.replay) void verify();
      else if (last !== undefined) {
        pendingRestart = true;
        ro.log?.(
          "warn",
          "kv-events: reconnected without a replay endpoint: cannot tell a restart from a blip, mirror dropped",
          { worker: workerId },
        );
      }
    },
    close() {
      closed = true;
    },
  };
}

/** Subscribes to one worker's ZMQ PUB. Frames: [topic, seq, payload] (topic optional); sequencing in createSequencer. */
export function subscribeZmq(
  workerId: string,
  endpoint: string,
  topic: string,
  sink: EventSink,
  onError: EventErrorSink,
  onState?: EventStateSink,
  ro: ReplayOptions = {},
): Subscription {
  const sock = new zmq.Subscriber({ reconnectInterval: 200, reconnectMaxInterval: 2000 });
  if (onState) {
    sock.events.on("connect", () => onState(true));
    sock.events.on("disconnect", () => onState(false));
  }
  sock.connect(endpoint);
  sock.subscribe(topic);
  let closed = false;
  let wasDisconnected = false;
  let warnedTopic = false;
  const seqr = createSequencer(workerId, sink, onError, ro);
  sock.events.on("disconnect", () => {
    wasDisconnected = true;
  });
  sock.events.on("handshake", () => {
    if (!wasDisconnected || closed) return;
    wasDisconnected = false;
    seqr.reconnected();
  });
  (async () => {
    try {
      for await (const frames of sock) {
        try {
          if (frames.length !== 3 && !(frames.length === 2 && topic === ""))
            throw new Error("want [topic, seq, payload], got " + frames.length + " frame(s)");
          // The subscription filter is a prefix: drop other topics (kv-events-canary for kv-events).
          const ti = frames.length === 3 ? parseTopic(frames[0], topic) : { epoch: null, barrier: null };
          if (!ti) {
            // Once per subscription: a publisher whose topic differs from ours sends us nothing usable.
            if (!warnedTopic) {
              warnedTopic = true;
              ro.log?.(
                "warn",
                `kv-events worker=${workerId} ignores frames on topic '${printable(frames[0])}': --kv-event-topic is '${topic}', matched exactly (SGLang's epoch suffix allowed)`,
                { worker: workerId, topic: printable(frames[0]), kv_event_topic: topic },
              );
            }
            ro.onOtherTopic?.();
            continue;
          }
          const sf = frames[frames.length - 2];
          if (sf.length !== 8) throw new Error(`sequence frame is ${sf.length} bytes, want 8`);
          seqr.frame(decodeSeq(sf), frames[frames.length - 1], {
            seqText: seqText(sf),
            epoch: ti.epoch,
            barrier: ti.barrier,
          });
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
      seqr.close();
      try {
        sock.close();
      } catch {
        /* already closed */
      }
    },
  };
}
