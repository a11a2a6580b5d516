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
import { EventEmitter } from "events";

/** gRPC status codes this server sends. */
export const Status = { OK: 0, CANCELLED: 1, UNKNOWN: 2, DEADLINE_EXCEEDED: 4, NOT_FOUND: 5, RESOURCE_EXHAUSTED: 8, INTERNAL: 13, UNIMPLEMENTED: 12, UNAVAILABLE: 14 } as const;

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
}

export interface Method<Req, Res> {
  decode(b: Uint8Array): Req;
  encode(m: Res): Uint8Array;
  handler(call: Call<Req, Res>): void;
}

export interface ServerOptions {
  /** Largest message accepted; a larger one ends the call with RESOURCE_EXHAUSTED before it is buffered. */
  maxMessageBytes: number;
  maxConcurrentStreams: number;
  tls?: { cert: Buffer; key: Buffer; clientCa: Buffer | null } | null;
}

// grpc-message is percent-encoded (PROTOCOL-HTTP2.md): printable ASCII but '%' as is.
function encodeMessage(s: string): string {
  let out = "";
  for (const b of Buffer.from(s, "utf8")) out += b >= 0x20 && b <= 0x7e && b !== 0x25 ? String.fromCharCode(b) : "%" + b.toString(16).toUpperCase().padStart(2, "0");
  return out;
}

class StreamCall<Req, Res> extends EventEmitter {
  writable = true;
  private status = Status.OK as number;
  private details = "";
  private pending: Buffer | null = null;

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly method: Method<Req, Res>,
    private readonly maxMessageBytes: number,
  ) {
    super();
    stream.on("wantTrailers", () => {
      const t: http2.OutgoingHttpHeaders = { "grpc-status": String(this.status) };
      if (this.details) t["grpc-message"] = encodeMessage(this.details);
      stream.sendTrailers(t);
    });
    stream.on("data", (d: Buffer) => this.onBytes(d));
    stream.on("end", () => {
      if (this.pending && this.pending.length) this.fail(Status.INTERNAL, "stream ended inside a message");
      this.emit("end");
    });
    stream.on("aborted", () => this.emit("cancelled"));
    // A reset stream errors as well as closing; "close" below is what the handler hears.
    stream.on("error", () => undefined);
    stream.on("close", () => {
      this.writable = false;
      this.emit("close");
    });
  }

  private onBytes(d: Buffer): void {
    let buf = this.pending && this.pending.length ? Buffer.concat([this.pending, d]) : d;
    while (buf.length >= 5) {
      if (buf[0] !== 0) return this.fail(Status.UNIMPLEMENTED, "compressed messages are not supported");
      const n = buf.readUInt32BE(1);
      if (n > this.maxMessageBytes) return this.fail(Status.RESOURCE_EXHAUSTED, `message of ${n} bytes is over the ${this.maxMessageBytes}-byte limit`);
      if (buf.length < 5 + n) break;
      const body = buf.subarray(5, 5 + n);
      buf = buf.subarray(5 + n);
      let m: Req;
      try {
        m = this.method.decode(body);
      } catch (e) {
        return this.fail(Status.INTERNAL, `undecodable message: ${(e as Error).message}`);
      }
      if (!this.writable) return;
      this.emit("data", m);
    }
    this.pending = buf.length ? buf : null;
  }

  // Response headers go out with the first answer, in the same write: sent on
  // their own at stream start they cost Envoy a wakeup before the message.
  private respond(): void {
    if (this.stream.headersSent) return;
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
    this.pending = null;
    // The stream may already be gone (reset while a pick was computed).
    if (this.stream.destroyed) return;
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
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- each entry keeps its own Req/Res; they meet only inside StreamCall
  private readonly methods: { [path: string]: Method<any, any> } = {};
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private readonly h2: http2.Http2Server | http2.Http2SecureServer;
  private closing = false;

  constructor(private readonly opts: ServerOptions) {
    const common: http2.ServerOptions = {
      // Node's default (10 MB per connection) refuses streams once exceeded, and
      // one connection carries every in-flight request's body from Envoy.
      maxSessionMemory: Number.MAX_SAFE_INTEGER,
      settings: { maxConcurrentStreams: opts.maxConcurrentStreams },
    };
    const tls = opts.tls;
    this.h2 = tls ? http2.createSecureServer({ ...common, cert: tls.cert, key: tls.key, ca: tls.clientCa ?? undefined, requestCert: !!tls.clientCa, rejectUnauthorized: !!tls.clientCa }) : http2.createServer(common);
    if (tls) this.h2.on("secureConnection", (s) => s.on("error", () => undefined));
    this.h2.setTimeout(0);
    this.h2.on("session", (s: http2.ServerHttp2Session) => {
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
      stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": String(Status.UNIMPLEMENTED), "grpc-message": encodeMessage(`unknown method ${headers[":path"]}`) }, { endStream: true });
      return;
    }
    m.handler(new StreamCall(stream, m, this.opts.maxMessageBytes));
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
