// One Envoy HTTP stream = one gRPC stream = one StreamProcessor, with one
// method per ext_proc phase and the stream's state in one typed object.
//
// Request headers -> CONTINUE (client routing headers stripped; a path outside
// core/paths.ts's allowlist answered here). Buffered request body (or the
// trailers that end it) -> the director (runtime/director.ts) decides, and the
// decision is encoded: a header mutation naming the upstream for the
// ORIGINAL_DST cluster plus the EPP metadata, or an immediate response.
// FULL_DUPLEX_STREAMED holds the headers answer until the body is whole, then
// streams the body back. Response body chunks are observed (STREAMED) to
// release load at first token and at end_of_stream; a reset or closed stream
// releases whatever is left.
import { ProcessingRequest, ProcessingResponse } from "./gen/envoy/service/ext_proc/v3/external_processor_pb";
import { ProcessingMode_BodySendMode } from "./gen/envoy/extensions/filters/http/ext_proc/v3/processing_mode_pb";
import { Endpoint } from "../core/request";
import { checkPath } from "../core/paths";
import { CONTROL_HEADERS } from "../core/objectives";
import { KV_SOURCE_HEADER } from "../core/scheduling/kv-source";
import { DP_RANK_HEADER } from "../core/dprank";
import { prefillRankHeader } from "../core/dprank";
import { Guard } from "../core/router";
import { App } from "../runtime/app";
import { RequestOutcome } from "../runtime/metrics";
import { withRequestId } from "../runtime/log";
import { Decision, DEST_KEY, LLMD_PREFILL_HEADER, outcomeOf, Routed, STREAM_KEY, StreamEnd } from "../runtime/director";
import { decisionOutcome } from "../runtime/flow";
import { ChatFromCompletions } from "../runtime/token-ids";
import {
  CONTINUE_RESP_BODY,
  CONTINUE_RESP_HEADERS,
  headerMap,
  headersContinue,
  immediate,
  replacedBody,
  responseTrailersContinue,
  routeAnswer,
  servedOf,
  streamedBody,
  subsetOf,
  trailersContinue,
  trailersRoute,
} from "./encode";
import { Call, Status } from "./grpc";

// Body pieces sent back in FULL_DUPLEX_STREAMED stay well under gRPC message limits.
const BODY_PIECE = 64 * 1024;

/**
 * Client-sent headers that only the router may set. A gateway config may route
 * or trust on them, so they never survive the request-headers phase.
 */
export function isRoutingHeader(name: string, opts: { upstreamHeader: string; prefillHeader: string }): boolean {
  const n = name.toLowerCase();
  return (
    n.startsWith("x-infera-") ||
    n.startsWith(DEST_KEY) ||
    n === opts.upstreamHeader ||
    n === opts.prefillHeader ||
    n === DP_RANK_HEADER
  );
}

/** The router's own header names, removed from every request (no duplicates; computed once per options). */
const own = new WeakMap<object, string[]>();
function ownHeaders(opts: { upstreamHeader: string; prefillHeader: string }): string[] {
  let l = own.get(opts);
  if (!l) {
    l = [
      ...new Set([
        opts.upstreamHeader,
        opts.prefillHeader,
        prefillRankHeader(opts.prefillHeader),
        DEST_KEY,
        LLMD_PREFILL_HEADER,
        KV_SOURCE_HEADER,
      ]),
    ];
    own.set(opts, l);
  }
  return l;
}

type RequestPhase = "requestHeaders" | "requestBody" | "requestTrailers";

/** Everything one stream remembers between its messages. */
export interface StreamState {
  /** Request headers, lower-case, the client's routing headers removed. */
  headers: Record<string, string>;
  /** The routing headers every request-side answer removes. */
  strip: string[];
  /** The gateway's candidate subset (trusted peers only), or null. */
  subset: string[] | null;
  /** What the allowlist made of the path: routed by prompt cache, or by load (null). */
  endpoint: Endpoint | null;
  /** Envoy names its body modes on the first message; older Envoys do not. */
  bodyMode: ProcessingMode_BodySendMode | null;
  respBodyMode: ProcessingMode_BodySendMode | null;
  /** The request body so far, until the pick. */
  bodyChunks: Buffer[];
  bodyBytes: number;
  /** The body was refused (over a cap): the rest of its messages are ignored. */
  tooLarge: boolean;
  /** A routing answer is decided or on its way. */
  decided: boolean;
  /** The routed decision, once admitted: its reservation is released at the first byte and at the end. */
  routed: Routed | null;
  /** Load moved to the endpoint the gateway reports it actually served from. */
  moved: Guard | null;
  /** A response body chunk has been seen (the first token). */
  sawBody: boolean;
  /** The request has been counted by outcome (once). */
  counted: boolean;
  /** --send-token-ids: the engine's completions answer, rewritten back to chat as it streams (else null). */
  toChat: ChatFromCompletions | null;
}

/**
 * Per-phase hooks for features that watch a stream without owning it
 * (register with addPhaseHooks; each runs after the processor's own work).
 */
export interface PhaseHooks {
  requestHeaders?(s: StreamState): void;
  /** The routing question was answered. */
  decided?(s: StreamState, d: Decision): void;
  /** The first response body chunk. */
  firstByte?(s: StreamState): void;
  /** The stream is over (end, error, cancel); runs once. */
  finished?(s: StreamState): void;
}

const hooks: PhaseHooks[] = [];
export function addPhaseHooks(h: PhaseHooks): void {
  hooks.push(h);
}

/** The first token's bookkeeping, after the first chunk's answer went out (a failure fails the stream, as in a message). */
function firstTokenLater(p: StreamProcessor): void {
  if (!p.firstDue) return;
  try {
    p.firstToken();
  } catch (e) {
    p.failed(e as Error);
  }
}

export class StreamProcessor {
  readonly s: StreamState = {
    headers: {},
    strip: [],
    subset: null,
    endpoint: null,
    bodyMode: null,
    respBodyMode: null,
    bodyChunks: [],
    bodyBytes: 0,
    tooLarge: false,
    decided: false,
    routed: null,
    moved: null,
    sawBody: false,
    counted: false,
    toChat: null,
  };
  /** Set when the stream ends: a pick waiting for admission gives its load back. */
  private readonly end: StreamEnd = { ended: false, onEnd: null };
  /** Answers leave in message order even when a pick waits on a tokenizer thread. */
  private order: Promise<void> = Promise.resolve();
  /** Answers and steps queued on `order` and not yet run. */
  private pending = 0;
  private idle: NodeJS.Timeout | null = null;
  /** The first chunk was answered and its first-token bookkeeping has not run yet. */
  firstDue = false;
  private over = false;

  constructor(
    private readonly app: App,
    private readonly call: Call<ProcessingRequest, ProcessingResponse>,
  ) {
    this.touch();
    call.on("data", (m: ProcessingRequest) => {
      this.touch();
      // Envoy's x-request-id tags every log line of this request.
      if (m.request.case === "requestHeaders") this.s.headers = headerMap(m.request.value.headers);
      withRequestId(this.s.headers["x-request-id"], () => this.message(m));
    });
    // Client abort, upstream reset, Envoy closing the stream: all end up here.
    // A client half-closing after its last message still reads the answers in flight.
    call.on("end", () =>
      this.inOrder(() => {
        this.stopIdle();
        this.done();
        call.end();
      }),
    );
    const gone = () => this.gone();
    call.on("cancelled", gone);
    call.on("close", gone);
  }

  private message(m: ProcessingRequest): void {
    try {
      if (m.protocolConfig && this.s.bodyMode === null) {
        this.s.bodyMode = m.protocolConfig.requestBodyMode;
        this.s.respBodyMode = m.protocolConfig.responseBodyMode;
      }
      const r = m.request;
      switch (r.case) {
        case "requestHeaders":
          return this.requestHeaders(m, r.value.endOfStream);
        case "requestBody":
          return this.requestBody(r.value.body, r.value.endOfStream);
        case "requestTrailers":
          return this.requestTrailers();
        case "responseHeaders":
          return this.responseHeaders(m, r.value.endOfStream);
        case "responseBody":
          return this.responseBody(r.value.body, r.value.endOfStream);
        case "responseTrailers":
          return this.responseTrailers();
        default:
          return;
      }
    } catch (e) {
      this.fail(e as Error);
    }
  }

  private get fullDuplex(): boolean {
    return this.s.bodyMode === ProcessingMode_BodySendMode.FULL_DUPLEX_STREAMED;
  }

  // ---- request headers: read once, on arrival (the request id tags the logs)
  requestHeaders(m: ProcessingRequest, endOfStream: boolean): void {
    const { app, s } = this;
    s.subset = this.call.peer.trusted ? subsetOf(m) : null;
    // Always a removal (of our own names at least): Envoy re-resolves the
    // route only after a header mutation, and the route must be resolved
    // again once the pick's metadata exists, even when no body phase follows.
    s.strip = ownHeaders(app.opts).slice();
    for (const h in s.headers)
      if ((isRoutingHeader(h, app.opts) || h.startsWith("x-prefiller-")) && !s.strip.includes(h)) s.strip.push(h);
    for (const h of s.strip) delete s.headers[h];
    // Objective and SLO headers are the router's input: read from s.headers, never sent on.
    for (const h of CONTROL_HEADERS) if (h in s.headers) s.strip.push(h);
    for (const h of hooks) h.requestHeaders?.(s);
    // Only allowed paths reach a worker; the rest are answered here, before any body is read.
    const verdict = checkPath(app.opts.pathRules, s.headers[":method"] || "GET", s.headers[":path"] || "/");
    if (verdict.error) {
      s.decided = true;
      app.metrics.badRequests.inc({ status: String(verdict.error.status) });
      this.outcome(outcomeOf(verdict.error));
      this.answer(this.refusal(verdict.error.status, verdict.error.message, verdict.error.type));
      return;
    }
    s.endpoint = verdict.endpoint;
    // No body coming (GET, or an empty POST): decide now.
    if (endOfStream) this.answer(this.route(Buffer.alloc(0), "requestHeaders", s.strip));
    else if (!this.fullDuplex) this.answer(headersContinue(s.strip));
    // FULL_DUPLEX_STREAMED: answered once the body is complete.
  }

  // ---- request body: buffered until whole, then routed
  requestBody(chunk: Uint8Array, endOfStream: boolean): void {
    const { app, s } = this;
    if (s.tooLarge) return;
    if (!this.call.hold(chunk.length)) {
      // Over the connection's (or the server's) cap on buffered request
      // bytes: this request goes, the connection and the others stay.
      this.refuseBody();
      app.metrics.badRequests.inc({ status: "503" });
      app.log(
        "warn",
        `ext_proc: request body refused, the buffered-bytes cap is reached (--ext-proc-max-buffered-bytes-per-connection ${app.opts.extProcMaxBufferedBytesPerConnection}, --ext-proc-max-buffered-bytes ${app.opts.extProcMaxBufferedBytes})`,
      );
      this.answer(
        this.refusal(503, "the router is holding too many request bodies; retry shortly", "service_unavailable"),
      );
      return;
    }
    s.bodyChunks.push(Buffer.from(chunk));
    s.bodyBytes += chunk.length;
    if (this.fullDuplex && s.bodyBytes > app.opts.maxBodyBytes) {
      // Streamed bodies are not bounded by Envoy's buffer: refuse at the
      // limit rather than hold an unbounded body in memory.
      this.refuseBody();
      app.metrics.badRequests.inc({ status: "413" });
      this.outcome("too_large");
      this.answer(
        this.refusal(413, `request body is over the ${app.opts.maxBodyBytes}-byte limit`, "request_too_large"),
      );
      return;
    }
    if (this.fullDuplex) {
      if (endOfStream) this.duplexRelease(false);
      return;
    }
    // BUFFERED sends the body once it is whole; without end_of_stream it
    // means trailers follow (and Envoy waits for this answer before sending them).
    if (endOfStream || s.bodyMode === ProcessingMode_BodySendMode.BUFFERED) {
      this.answer(this.route(this.takeBody(), "requestBody", []));
      this.inOrder(() => this.call.releaseHeld());
    } else {
      // A partial body (STREAMED / BUFFERED_PARTIAL): the upstream header can no
      // longer be set once chunks flow, so say what to fix instead of misrouting.
      app.log("warn", "ext_proc got a partial request body: set request_body_mode: BUFFERED or FULL_DUPLEX_STREAMED");
      this.outcome("error");
      this.answer(
        this.refusal(
          500,
          "gateway misconfigured: ext_proc request_body_mode must be BUFFERED or FULL_DUPLEX_STREAMED (routing needs the whole body)",
          "server_misconfigured",
        ),
      );
    }
  }

  // ---- request trailers: an HTTP/2 request may end with trailers, with or without body frames
  requestTrailers(): void {
    const s = this.s;
    if (s.tooLarge) return;
    if (this.fullDuplex && !s.decided) {
      this.duplexRelease(true);
      this.answer(trailersContinue());
      return;
    }
    // That is its end of body, and the pick happens here.
    if (!s.decided) {
      this.answer(this.route(this.takeBody(), "requestTrailers", []));
      this.inOrder(() => this.call.releaseHeld());
    } else this.answer(trailersContinue());
  }

  // ---- response headers: the gateway may report where it actually sent the request
  responseHeaders(m: ProcessingRequest, endOfStream: boolean): void {
    const { app, s } = this;
    // Load moves only on the gateway's word (the server refuses other peers' streams; belt and braces).
    const served = this.call.peer.trusted ? servedOf(m) : null;
    if (served && s.routed && !s.moved) s.moved = app.director.served(s.routed, served);
    if (endOfStream) this.last(CONTINUE_RESP_HEADERS);
    else this.send(CONTINUE_RESP_HEADERS);
  }

  // ---- response body: the first chunk is the first token
  responseBody(chunk: Uint8Array, endOfStream: boolean): void {
    const s = this.s;
    const first = !s.sawBody;
    s.sawBody = true;
    const duplex = s.respBodyMode === ProcessingMode_BodySendMode.FULL_DUPLEX_STREAMED;
    let reply: ProcessingResponse;
    if (s.routed && s.routed.chatFromCompletions) {
      // Sent as ids to the completions endpoint: the client gets the chat shape it asked for.
      if (!s.toChat) s.toChat = new ChatFromCompletions(s.routed.stream);
      const out = s.toChat.push(chunk, endOfStream);
      reply = duplex ? streamedBody("responseBody", out, endOfStream) : replacedBody(out);
    } else reply = duplex ? streamedBody("responseBody", Buffer.from(chunk), endOfStream) : CONTINUE_RESP_BODY;
    // end_of_stream on a body chunk means no trailers follow (they would carry it).
    if (endOfStream) {
      if (first) this.firstToken();
      this.last(reply);
      return;
    }
    this.send(reply);
    // The first token's bookkeeping (the admission slot, speed learning, the
    // hooks) is not part of the answer: it runs once this turn's writes have
    // gone out (the HTTP/2 session flushes them before the immediates of the
    // turn run), so the client's first byte does not wait for it. Anything
    // that ends the stream runs it first (done()), so the order is kept.
    if (first) {
      this.firstDue = true;
      setImmediate(firstTokenLater, this);
    } else if (s.routed && !this.firstDue) s.routed.reservation.chunk();
  }

  /** The first token: the reservation's first-token release and the firstByte hooks; once. */
  firstToken(): void {
    this.firstDue = false;
    const s = this.s;
    if (s.routed) s.routed.reservation.firstToken();
    for (const h of hooks) h.firstByte?.(s);
  }

  // ---- response trailers: the end of the exchange
  responseTrailers(): void {
    this.last(responseTrailersContinue());
  }

  // ---- stream end: client gone, reset, cancel
  gone(): void {
    this.end.ended = true;
    const f = this.end.onEnd;
    this.end.onEnd = null;
    if (f) f();
    this.stopIdle();
    this.done();
  }

  /** A failed step outside a message (the deferred first token): as a failed message. */
  failed(e: Error): void {
    this.fail(e);
  }

  /** A failed message: counted, logged, released, and the call ends with INTERNAL. */
  private fail(e: Error): void {
    this.outcome("error");
    this.app.log("error", `ext_proc message failed: ${e.stack}`);
    this.done();
    this.call.fail(Status.INTERNAL, e.message);
  }

  /**
   * Asks the director, records the outcome, and encodes the decision for this
   * phase: on this turn when the director decided at once, else a promise.
   */
  private route(body: Buffer, phase: RequestPhase, strip: string[]): ProcessingResponse | Promise<ProcessingResponse> {
    const s = this.s;
    s.decided = true;
    // Called as the message completing the request arrives: the router's own answer time starts here.
    const t0 = performance.now();
    const d = this.app.director.decideNow({
      endpoint: s.endpoint,
      body,
      headers: s.headers,
      subset: s.subset,
      end: this.end,
    });
    if (d instanceof Promise) return d.then((x) => this.decided(x, phase, strip, t0));
    return this.decided(d, phase, strip, t0);
  }

  private decided(d: Decision, phase: RequestPhase, strip: string[], t0: number): ProcessingResponse {
    const s = this.s;
    this.outcome(d.outcome);
    if (d.kind === "route") s.routed = d;
    for (const h of hooks) h.decided?.(s, d);
    const answer = this.encode(d, phase, strip);
    this.app.routing.flow.decision.observe(
      { outcome: decisionOutcome(d.outcome, d.kind === "refuse" ? d.headers : undefined) },
      (performance.now() - t0) / 1000,
    );
    return answer;
  }

  private encode(d: Decision, phase: RequestPhase, strip: string[]): ProcessingResponse {
    if (d.kind === "refuse") return this.refusal(d.status, d.message, d.type, d.param, d.headers);
    const lb: Record<string, string | boolean> = { [DEST_KEY]: d.destination };
    if (d.stream) lb[STREAM_KEY] = true;
    if (phase === "requestTrailers") {
      // No body can be rewritten here (none was sent): the engine answers in the client's own shape.
      d.chatFromCompletions = false;
      // Headers can no longer change once trailers arrive; the metadata still routes.
      if (d.pick.prefill)
        this.app.log(
          "warn",
          `request ended with trailers: prefill peer ${d.pick.prefill.id} cannot be named in a header, the decode worker prefills itself`,
        );
      return trailersRoute(lb);
    }
    // strip then the decision's own, once each, less what the decision sets.
    const remove: string[] = [];
    for (const h of strip) if (!(h in d.headers) && !remove.includes(h)) remove.push(h);
    for (const h of d.remove) if (!(h in d.headers) && !remove.includes(h)) remove.push(h);
    return routeAnswer(phase, d.headers, remove, phase === "requestBody" ? d.body : null, lb);
  }

  private refusal(
    status: number,
    message: string,
    type: string,
    param?: string,
    extra?: Record<string, string>,
  ): ProcessingResponse {
    return immediate(status, message, type, this.s.headers[":path"] || "", param, extra);
  }

  // FULL_DUPLEX_STREAMED: nothing reaches the upstream until we answer, so the
  // headers answer (carrying the pick) waits for the whole body; then the body
  // goes back unchanged (or as the pick rewrote it) as streamed pieces.
  private duplexRelease(trailersFollow: boolean): void {
    const orig = this.takeBody();
    const answered = this.route(orig, "requestHeaders", this.s.strip);
    this.inOrder(async () => {
      const r = await answered;
      this.send(r);
      if (r.response.case === "immediateResponse") return;
      const body = this.s.routed?.body ?? orig;
      const pieces = Math.max(1, Math.ceil(body.length / BODY_PIECE));
      for (let i = 0; i < pieces; i++) {
        const last = i === pieces - 1;
        this.send(
          streamedBody("requestBody", body.subarray(i * BODY_PIECE, (i + 1) * BODY_PIECE), last && !trailersFollow),
        );
      }
    });
    // The body has gone back to Envoy (or the request was refused): no longer held.
    this.inOrder(() => this.call.releaseHeld());
  }

  private takeBody(): Buffer {
    const body = Buffer.concat(this.s.bodyChunks);
    this.s.bodyChunks = [];
    return body;
  }

  private refuseBody(): void {
    this.s.tooLarge = true;
    this.s.bodyChunks = [];
    this.call.releaseHeld();
  }

  /** Each request is counted once by how its routing question was answered. */
  private outcome(o: RequestOutcome): void {
    if (this.s.counted) return;
    this.s.counted = true;
    this.app.metrics.requests.inc({ outcome: o });
  }

  /**
   * Runs f after everything queued before it: at once when nothing is
   * pending (no promise made), else chained behind the pending work. A
   * failure fails the stream either way.
   */
  private inOrder(f: () => void | Promise<void>): void {
    if (this.pending === 0) {
      let r: void | Promise<void>;
      try {
        r = f();
      } catch (e) {
        this.fail(e as Error);
        return;
      }
      if (!(r instanceof Promise)) return;
      this.pending++;
      this.order = r.catch((e) => this.fail(e as Error)).then(() => void this.pending--);
      return;
    }
    this.pending++;
    this.order = this.order
      .then(f)
      .catch((e) => this.fail(e as Error))
      .then(() => void this.pending--);
  }

  private answer(r: ProcessingResponse | Promise<ProcessingResponse>): void {
    if (r instanceof Promise) this.inOrder(async () => this.send(await r));
    else this.inOrder(() => this.send(r));
  }

  private send(m: ProcessingResponse): void {
    if (!this.call.writable) return;
    this.call.write(m);
    // Envoy sends nothing after an immediate response: close our side with OK
    // rather than wait for Envoy to reset the stream (resets at line rate trip
    // Node's HTTP/2 reset-flood guard, which then refuses streams).
    if (m.response.case === "immediateResponse") this.call.end();
  }

  /** The last answer of the exchange: release, then end the call cleanly. */
  private last(m: ProcessingResponse): void {
    this.send(m);
    this.stopIdle();
    this.done();
    if (this.call.writable) this.call.end();
  }

  /** Releases what the stream holds; safe to call again. */
  private done(): void {
    if (this.firstDue) this.firstToken();
    const s = this.s;
    if (s.routed) s.routed.reservation.finish();
    if (s.moved) {
      const g = s.moved;
      s.moved = null;
      this.app.router.releaseGuard(g);
    }
    if (!this.over) {
      this.over = true;
      for (const h of hooks) h.finished?.(s);
    }
  }

  // Envoy's streams see a message at least per response chunk; a direct client
  // that goes quiet must not hold its pick's load forever.
  private stopIdle(): void {
    if (this.idle) clearTimeout(this.idle);
    this.idle = null;
  }

  private touch(): void {
    // The same timer restarted (refresh: no new timer per message).
    if (this.idle) {
      this.idle.refresh();
      return;
    }
    const secs = this.app.opts.extProcStreamIdleS;
    this.idle = setTimeout(() => {
      this.app.log("warn", `ext_proc stream idle for ${secs}s: ended, its load released`);
      this.done();
      this.call.fail(Status.DEADLINE_EXCEEDED, `no message for ${secs}s`);
    }, secs * 1000);
    this.idle.unref();
  }
}
