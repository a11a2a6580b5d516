// gRPC over node:http2, for the two services on the ext_proc port: ext_proc
// (one bidirectional stream per HTTP request) and grpc.health.v1.
//
// Why not grpc-js: the router's CPU per request bounds what one process
// serves, and grpc-js's server machinery (interceptor chain, per-message
// listeners and promises) cost more of it than these frames written by hand,
// at the same latency (bench:overhead --baseline against the grpc-js server:
// docs/benchmarks/2026-12-04-router-overhead.md). The wire format is small: length-prefixed messages on
// an HTTP/2 stream, the status in trailers (grpc/doc/PROTOCOL-HTTP2.md).
import * as http2 from "http2";
import * as tls from "tls";
import { EventEmitter } from "events";

/** gRPC status codes this server sends. */
export const Status = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  INTERNAL: 13,
  UNIMPLEMENTED: 12,
  UNAVAILABLE: 14,
} as const;

/** Who is at the other end of a call's connection. */
export interface Peer {
  /** The verified client certificate's names: SAN DNS and URI entries and the subject CN (empty without one). */
  names: string[];
  /** True when no client allowlist is configured, or one of names is on it. */
  trusted: boolean;
}

/**
 * Request bytes held in memory, counted against a cap. One per connection and
 * one for the whole server: a call's bytes count against both.
 */
export class ByteBudget {
  used = 0;
  constructor(readonly max: number) {}
  take(n: number): boolean {
    if (this.used + n > this.max) return false;
    this.used += n;
    return true;
  }
  give(n: number): void {
    this.used = Math.max(0, this.used - n);
  }
}

/**
 * One call as its handler sees it. Events: "data" (a decoded message), "end"
 * (the client half-closed), "cancelled" (the client reset the stream), "close"
 * (the stream is gone, always last).
 */
export interface Call<Req, Res> {
  /** False once the call has ended, failed or closed: writes are dropped then. */
  readonly writable: boolean;
  write(m: Res): void;
  /** Ends the call with OK. */
  end(): void;
  /** Ends the call with a non-OK status. */
  fail(code: number, details: string): void;
  on(ev: "data", f: (m: Req) => void): unknown;
  on(ev: "end" | "cancelled" | "close", f: () => void): unknown;
  readonly peer: Peer;
  /**
   * Counts n more request bytes the handler keeps (a body being collected)
   * against the connection's and the server's caps. False, and nothing
   * counted, when either cap would be passed: the handler must drop them.
   */
  hold(n: number): boolean;
  /** Gives back every byte hold() counted (also done when the call closes). */
  releaseHeld(): void;
}

export interface Method<Req, Res> {
  decode(b: Uint8Array): Req;
  encode(m: Res): Uint8Array;
  handler(call: Call<Req, Res>): void;
  /** Only trusted peers (Peer.trusted) may call it; others get PERMISSION_DENIED before any message is read. */
  trustedOnly?: boolean;
}

export interface ServerOptions {
  /** Largest message accepted; a larger one ends the call with RESOURCE_EXHAUSTED before it is buffered. */
  maxMessageBytes: number;
  maxConcurrentStreams: number;
  /** Cap on request bytes buffered (partial messages, bodies held by handlers) per connection, and over all connections. */
  maxBufferedBytesPerConnection: number;
  maxBufferedBytes: number;
  tls?: { cert: Buffer; key: Buffer; clientCa: Buffer | null } | null;
  /**
   * With mTLS: the client-certificate names (SAN DNS, SAN URI or subject CN)
   * whose connections are trusted. null: every connection is.
   */
  trustedClients?: string[] | null;
  /** Told of every stream refused: not an allowed client, or over a buffered-bytes cap. */
  onRefused?: (reason: "not_gateway" | "buffer_cap") => void;
}

/** The names a verified client certificate carries: SAN DNS and URI entries, then the subject CN. */
export function certNames(cert: tls.PeerCertificate | null | undefined): string[] {
  if (!cert || !cert.subject) return [];
  const out: string[] = [];
  // Node writes "DNS:a, URI:b, IP Address:c"; a value with a comma or quote is JSON-quoted.
  const re = /(DNS|URI):("(?:[^"\\]|\\.)*"|[^,]*)/g;
  for (let m = re.exec(cert.subjectaltname ?? ""); m; m = re.exec(cert.subjectaltname ?? "")) {
    let v = m[2];
    if (v.startsWith('"')) {
      try {
        v = JSON.parse(v) as string;
      } catch {
        continue;
      }
    }
    if (v) out.push(v);
  }
  const cn = cert.subject.CN as string | string[] | undefined;
  for (const c of Array.isArray(cn) ? cn : cn ? [cn] : []) if (!out.includes(c)) out.push(c);
  return out;
}

// grpc-message is percent-encoded (PROTOCOL-HTTP2.md): printable ASCII but '%' as is.
function encodeMessage(s: string): string {
  let out = "";
  for (const b of Buffer.from(s, "utf8"))
    out +=
      b >= 0x20 && b <= 0x7e && b !== 0x25
        ? String.fromCharCode(b)
        : "%" + b.toString(16).toUpperCase().padStart(2, "0");
  return out;
}

interface Budgets {
  conn: ByteBudget;
  all: ByteBudget;
  onRefused?: (reason: "buffer_cap") => void;
}

class StreamCall<Req, Res> extends EventEmitter {
  writable = true;
  private status = Status.OK as number;
  private details = "";
  // The bytes of the message being assembled, in arrival order (joined once it is whole).
  private parts: Buffer[] = [];
  private have = 0;
  // Bytes counted against the budgets: the message being assembled, and what the handler holds.
  private assembling = 0;
  private held = 0;

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly method: Method<Req, Res>,
    private readonly maxMessageBytes: number,
    private readonly budgets: Budgets,
    readonly peer: Peer,
  ) {
    super();
    stream.on("wantTrailers", () => {
      const t: http2.OutgoingHttpHeaders = { "grpc-status": String(this.status) };
      if (this.details) t["grpc-message"] = encodeMessage(this.details);
      stream.sendTrailers(t);
      // Refused for size while the client is still sending: RST_STREAM(NO_ERROR)
      // after the status (RFC 9113 8.1), so it stops; what it sent meanwhile
      // would only be read to be thrown away.
      if (this.status === Status.RESOURCE_EXHAUSTED && !stream.readableEnded)
        setImmediate(() => {
          if (!stream.closed && !stream.destroyed) stream.close(http2.constants.NGHTTP2_NO_ERROR);
        });
    });
    stream.on("data", (d: Buffer) => this.onBytes(d));
    stream.on("end", () => {
      if (this.have) this.fail(Status.INTERNAL, "stream ended inside a message");
      this.emit("end");
    });
    stream.on("aborted", () => this.emit("cancelled"));
    // A reset stream errors as well as closing; "close" below is what the handler hears.
    stream.on("error", () => undefined);
    stream.on("close", () => {
      this.writable = false;
      this.drop();
      this.releaseHeld();
      this.emit("close");
    });
  }

  /** Forgets the message being assembled and gives its bytes back. */
  private drop(): void {
    this.parts = [];
    this.have = 0;
    this.budgets.conn.give(this.assembling);
    this.budgets.all.give(this.assembling);
    this.assembling = 0;
  }

  /** Counts n bytes against both budgets, or neither; the problem when a cap would be passed. */
  private take(n: number): string | null {
    const { conn, all } = this.budgets;
    if (!conn.take(n)) return `the connection's buffered request bytes would pass its ${conn.max}-byte cap`;
    if (!all.take(n)) {
      conn.give(n);
      return `the server's buffered request bytes would pass its ${all.max}-byte cap`;
    }
    return null;
  }

  hold(n: number): boolean {
    if (this.take(n) !== null) {
      this.budgets.onRefused?.("buffer_cap");
      return false;
    }
    this.held += n;
    return true;
  }

  releaseHeld(): void {
    this.budgets.conn.give(this.held);
    this.budgets.all.give(this.held);
    this.held = 0;
  }

  private joined(): Buffer {
    if (this.parts.length > 1) this.parts = [Buffer.concat(this.parts, this.have)];
    return this.parts[0];
  }

  // Chunks are kept as they come and joined once per message (joining on
  // every chunk copies a large message over and over). A message that does
  // not arrive whole in one chunk has its declared size counted against the
  // byte caps up front, so no connection buffers past them.
  private onBytes(d: Buffer): void {
    if (!this.writable) return;
    this.parts.push(d);
    this.have += d.length;
    while (this.have >= 5 && this.writable) {
      const head = this.parts[0].length >= 5 ? this.parts[0] : this.joined();
      if (head[0] !== 0) return this.fail(Status.UNIMPLEMENTED, "compressed messages are not supported");
      const n = head.readUInt32BE(1);
      if (n > this.maxMessageBytes)
        return this.fail(
          Status.RESOURCE_EXHAUSTED,
          `message of ${n} bytes is over the ${this.maxMessageBytes}-byte limit`,
        );
      if (this.have < 5 + n) {
        if (!this.assembling) {
          const problem = this.take(5 + n);
          if (problem) {
            this.budgets.onRefused?.("buffer_cap");
            return this.fail(Status.RESOURCE_EXHAUSTED, `message of ${n} bytes refused: ${problem}`);
          }
          this.assembling = 5 + n;
        }
        return;
      }
      const buf = this.joined();
      const body = buf.subarray(5, 5 + n);
      const rest = buf.subarray(5 + n);
      this.parts = rest.length ? [rest] : [];
      this.have = rest.length;
      // The handler counts what it keeps of the message itself (hold()).
      this.budgets.conn.give(this.assembling);
      this.budgets.all.give(this.assembling);
      this.assembling = 0;
      let m: Req;
      try {
        m = this.method.decode(body);
      } catch (e) {
        return this.fail(Status.INTERNAL, `undecodable message: ${(e as Error).message}`);
      }
      this.emit("data", m);
    }
  }

  // Response headers go out with the first answer, in the same write: sent on
  // their own at stream start they cost Envoy a wakeup before the message.
  private respond(): void {
    // closed comes before the "close" event: a stream the peer reset (or
    // whose connection dropped) throws on respond() in between.
    if (this.stream.headersSent || this.stream.closed || this.stream.destroyed) return;
    this.stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
  }

  write(m: Res): void {
    if (!this.writable) return;
    this.respond();
    const b = this.method.encode(m);
    const f = Buffer.allocUnsafe(5 + b.length);
    f[0] = 0;
    f.writeUInt32BE(b.length, 1);
    f.set(b, 5);
    this.stream.write(f);
  }

  end(): void {
    if (!this.writable) return;
    this.writable = false;
    this.drop();
    // The stream may already be gone (reset while a pick was computed, or its connection dropped mid-message).
    if (this.stream.destroyed || this.stream.closed) return;
    this.respond();
    this.stream.end();
  }

  fail(code: number, details: string): void {
    if (!this.writable) return;
    this.status = code;
    this.details = details;
    this.end();
  }
}

/** The gRPC server behind the ext_proc port: register methods by path, then listen. */
export class GrpcServer {
  // Each entry keeps its own Req/Res types; they meet only inside StreamCall.
  private readonly methods: { [path: string]: Method<any, any> } = {};
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  // Per connection: its byte budget and who the peer is (read once, at connect).
  private readonly conns = new WeakMap<http2.ServerHttp2Session, { budget: ByteBudget; peer: Peer }>();
  /** Request bytes buffered over all connections. */
  readonly buffered: ByteBudget;
  private readonly h2: http2.Http2Server | http2.Http2SecureServer;
  private closing = false;

  constructor(private readonly opts: ServerOptions) {
    this.buffered = new ByteBudget(opts.maxBufferedBytes);
    const common: http2.ServerOptions = {
      // Node's default (10 MB per connection) refuses streams once exceeded, and
      // one connection carries every in-flight request's body from Envoy.
      maxSessionMemory: Number.MAX_SAFE_INTEGER,
      settings: { maxConcurrentStreams: opts.maxConcurrentStreams },
    };
    const tls = opts.tls;
    this.h2 = tls
      ? http2.createSecureServer({
          ...common,
          cert: tls.cert,
          key: tls.key,
          ca: tls.clientCa ?? undefined,
          requestCert: !!tls.clientCa,
          rejectUnauthorized: !!tls.clientCa,
        })
      : http2.createServer(common);
    if (tls) this.h2.on("secureConnection", (s) => s.on("error", () => undefined));
    this.h2.setTimeout(0);
    this.h2.on("session", (s: http2.ServerHttp2Session) => {
      this.conns.set(s, { budget: new ByteBudget(opts.maxBufferedBytesPerConnection), peer: this.peerOf(s) });
      this.sessions.add(s);
      s.on("close", () => this.sessions.delete(s));
      s.on("error", () => undefined);
      if (this.closing) s.close();
    });
    this.h2.on("stream", (stream, headers) => this.onStream(stream, headers));
  }

  add<Req, Res>(path: string, m: Method<Req, Res>): void {
    this.methods[path] = m;
  }

  // The client certificate was verified in the handshake (rejectUnauthorized
  // with the client CA), so its names can be believed; without mTLS there are none.
  private peerOf(s: http2.ServerHttp2Session): Peer {
    const allow = this.opts.trustedClients;
    const sock = s.socket as tls.TLSSocket;
    const verified =
      !!this.opts.tls?.clientCa && typeof sock.getPeerCertificate === "function" && sock.authorized === true;
    const names = verified ? certNames(sock.getPeerCertificate()) : [];
    return { names, trusted: !allow || names.some((n) => allow.includes(n)) };
  }

  private onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on("error", () => undefined);
    const ct = String(headers["content-type"] ?? "");
    if (headers[":method"] !== "POST" || !ct.startsWith("application/grpc")) {
      stream.respond({ ":status": 415, "content-type": "text/plain" }, { endStream: true });
      return;
    }
    const m = this.methods[String(headers[":path"])];
    if (!m) {
      // Trailers-only: the status rides on the only HEADERS frame.
      stream.respond(
        {
          ":status": 200,
          "content-type": "application/grpc",
          "grpc-status": String(Status.UNIMPLEMENTED),
          "grpc-message": encodeMessage(`unknown method ${headers[":path"]}`),
        },
        { endStream: true },
      );
      return;
    }
    const conn = this.conns.get(stream.session as http2.ServerHttp2Session);
    const peer = conn ? conn.peer : { names: [], trusted: !this.opts.trustedClients };
    if (m.trustedOnly && !peer.trusted) {
      this.opts.onRefused?.("not_gateway");
      const who = peer.names.length ? `client certificate names ${peer.names.join(", ")}` : "no client certificate";
      stream.respond(
        {
          ":status": 200,
          "content-type": "application/grpc",
          "grpc-status": String(Status.PERMISSION_DENIED),
          "grpc-message": encodeMessage(`${who}: not an allowed gateway identity`),
        },
        { endStream: true },
      );
      // RST_STREAM(NO_ERROR) after the answer: the client stops sending, and nothing it sent is kept.
      stream.close(http2.constants.NGHTTP2_NO_ERROR);
      return;
    }
    const budget = conn ? conn.budget : new ByteBudget(this.opts.maxBufferedBytesPerConnection);
    m.handler(
      new StreamCall(
        stream,
        m,
        this.opts.maxMessageBytes,
        { conn: budget, all: this.buffered, onRefused: this.opts.onRefused },
        peer,
      ),
    );
  }

  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const onErr = (e: Error) => reject(e);
      this.h2.once("error", onErr);
      this.h2.listen(port, host, () => {
        this.h2.off("error", onErr);
        const a = this.h2.address();
        resolve(typeof a === "object" && a ? a.port : port);
      });
    });
  }

  /**
   * Graceful: no new connections, a GOAWAY on each open one (Envoy opens no new
   * streams there) while streams already open run to their end; cb once all are gone.
   */
  tryShutdown(cb: () => void): void {
    this.closing = true;
    this.h2.close(() => cb());
    for (const s of this.sessions) s.close();
  }

  /** Cuts every connection now. */
  forceShutdown(): void {
    this.closing = true;
    this.h2.close();
    for (const s of this.sessions) s.destroy();
  }
}
