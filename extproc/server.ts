// Envoy ext_proc (envoy.service.ext_proc.v3.ExternalProcessor/Process).
// Request headers -> CONTINUE; buffered request body -> pick, then a header
// mutation naming the upstream for the ORIGINAL_DST cluster (use_http_header).
// Response body chunks are observed (STREAMED) to release load at first token
// and at end_of_stream; a reset/closed stream releases whatever is left.
import * as fs from "fs";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  BodyMutationSchema,
  BodyResponseSchema,
  CommonResponse_ResponseStatus,
  CommonResponseSchema,
  StreamedBodyResponseSchema,
  HeadersResponseSchema,
  HeaderMutationSchema,
  ImmediateResponseSchema,
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  ProcessingResponseSchema,
  TrailersResponseSchema,
} from "./gen/envoy/service/ext_proc/v3/external_processor_pb";
import {
  HeaderValueOption_HeaderAppendAction,
  HeaderValueOptionSchema,
  HeaderValueSchema,
  HeaderMap,
} from "./gen/envoy/config/core/v3/base_pb";
import { HttpStatusSchema, StatusCode } from "./gen/envoy/type/v3/http_status_pb";
import { ProcessingMode_BodySendMode } from "./gen/envoy/extensions/filters/http/ext_proc/v3/processing_mode_pb";
import { Endpoint } from "../core/request";
import { checkPath } from "../core/paths";
import { OBJECTIVE_HEADER, objectiveOf } from "../core/objectives";
import { KV_SOURCE_HEADER } from "../core/scheduling/kv-source";
import { DP_RANK_HEADER as DP_HEADER, dpBodyFields, prefillRankHeader, withBodyFields } from "../core/dprank";
import { asHttpError, httpError } from "../core/util";
import { Guard, Pick, Reservation, Worker } from "../core/router";
import { App } from "../runtime/app";
import { RequestOutcome } from "../runtime/metrics";
import { addHealth } from "./health";
import { errorJson } from "../core/errors";
import { withRequestId } from "../runtime/log";
import { constant, decodeRequest, encodeResponse } from "./wire";
import { Call, GrpcServer, Status } from "./grpc";
import { Counter, Gauge } from "prom-client";

function headerMap(m: HeaderMap | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of m?.headers ?? [])
    out[h.key.toLowerCase()] = h.rawValue.length ? Buffer.from(h.rawValue).toString("utf8") : h.value;
  return out;
}

function setHeaders(pairs: Record<string, string>, remove: string[] = []) {
  return create(HeaderMutationSchema, {
    removeHeaders: remove,
    setHeaders: Object.entries(pairs).map(([key, v]) =>
      create(HeaderValueOptionSchema, {
        header: create(HeaderValueSchema, { key, rawValue: Buffer.from(v) }),
        appendAction: HeaderValueOption_HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
      }),
    ),
  });
}

function immediate(
  status: number,
  message: string,
  type: string,
  path = "",
  param?: string,
  extra?: Record<string, string>,
): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: {
      case: "immediateResponse",
      value: create(ImmediateResponseSchema, {
        status: create(HttpStatusSchema, { code: status as StatusCode }),
        // SDKs retry a 503 after retry-after (Envoy's own 503s carry it too: envoy/envoy.yaml).
        headers: setHeaders({
          "content-type": "application/json",
          ...(status === 503 ? { "retry-after": "1" } : {}),
          ...extra,
        }),
        body: Buffer.from(errorJson(path, status, message, type, param)),
        details: "infera_" + type,
      }),
    },
  });
}

/**
 * The outcome label of a refused request (infera_router_requests_total). A 503
 * carrying a tokenizer-pool outcome (queue_full, timeout) means the router was
 * overloaded; any other 503 means no worker could take the request.
 */
export function outcomeOf(e: { status: number; outcome?: string }): RequestOutcome {
  if (e.status === 413) return "too_large";
  if (e.status === 429) return "shed";
  if (e.status === 499) return "client_closed";
  if (e.status === 503) return e.outcome === undefined ? "no_worker" : e.outcome === "error" ? "error" : "overloaded";
  return e.status >= 500 ? "error" : "bad_request";
}

/** Dynamic-metadata namespace and key the gateway's ORIGINAL_DST cluster reads the pick from (GIE convention). */
export const DEST_NAMESPACE = "envoy.lb";
export const DEST_KEY = "x-gateway-destination-endpoint";
/**
 * Set (true) in the pick's metadata when the request asked for a streamed
 * answer: the shipped Envoy configs select a route by it, a short idle timeout
 * for streams (tokens keep flowing) and a long one for answers that arrive
 * whole at the end of the generation.
 */
export const STREAM_KEY = "x-infera-stream";

/**
 * Client-sent headers that only the router may set. A gateway config may route
 * or trust on them, so they never survive the request-headers phase.
 */
/** vLLM's data-parallel rank request header (case-insensitive; SGLang's OpenAI routes honour it too). */
export const DP_RANK_HEADER = DP_HEADER;

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
const CONTINUE_RESP_HEADERS = constant(
  create(ProcessingResponseSchema, {
    response: {
      case: "responseHeaders",
      value: create(HeadersResponseSchema, { response: create(CommonResponseSchema, {}) }),
    },
  }),
);
const CONTINUE_RESP_BODY = constant(
  create(ProcessingResponseSchema, {
    response: {
      case: "responseBody",
      value: create(BodyResponseSchema, { response: create(CommonResponseSchema, {}) }),
    },
  }),
);

/** The ext_proc method: its path, and both directions' codecs (a gRPC client in the tests plays Envoy with them). */
export const ExtProcService = {
  Process: {
    path: "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
    requestStream: true,
    responseStream: true,
    requestSerialize: (m: ProcessingRequest) => Buffer.from(toBinary(ProcessingRequestSchema, m)),
    requestDeserialize: decodeRequest,
    responseSerialize: encodeResponse,
    responseDeserialize: (b: Buffer) => fromBinary(ProcessingResponseSchema, b),
  },
};

/** Metadata namespace and key a gateway may name the allowed endpoints under (Endpoint Picker Protocol). */
export const SUBSET_NAMESPACE = "envoy.lb.subset_hint";
export const SUBSET_KEY = "x-gateway-destination-endpoint-subset";
/** Metadata key (namespace envoy.lb) under which the gateway reports the endpoint that served. */
export const SERVED_KEY = "x-gateway-destination-endpoint-served";
/** The llm-d P/D routing sidecar reads the prefill peer (host:port) from this header. */
export const LLMD_PREFILL_HEADER = "x-prefiller-host-port";
/** Objective header the Inference Extension gateways pass (InferenceObjective name). */
export { OBJECTIVE_HEADER } from "../core/objectives";
// Body pieces sent back in FULL_DUPLEX_STREAMED stay well under gRPC message limits.
const BODY_PIECE = 64 * 1024;

/** The gateway's candidate subset from the request's metadata_context, or null when it sent none. */
export function subsetOf(m: ProcessingRequest): string[] | null {
  const ns = m.metadataContext?.filterMetadata?.[SUBSET_NAMESPACE];
  if (!ns || !(SUBSET_KEY in ns)) return null;
  const v = ns[SUBSET_KEY];
  if (Array.isArray(v)) return v.filter((x): x is string => typeof x === "string").map((x) => x.trim());
  // Not the protocol's list, but some gateways can only write strings.
  if (typeof v === "string")
    return v
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean);
  return [];
}

function servedOf(m: ProcessingRequest): string | null {
  const v = m.metadataContext?.filterMetadata?.[DEST_NAMESPACE]?.[SERVED_KEY];
  return typeof v === "string" && v ? v.split(",")[0].trim() : null;
}

// The headers answer of a request with a body depends only on which routing
// headers it strips, nearly always our own fixed names: one encoding each.
// Bounded, since a client chooses the names of the headers it sends.
const continueByStrip = new Map<string, ProcessingResponse>();
function headersContinue(strip: string[]): ProcessingResponse {
  const key = strip.join("\n");
  let m = continueByStrip.get(key);
  if (!m) {
    m = create(ProcessingResponseSchema, {
      response: {
        case: "requestHeaders",
        value: create(HeadersResponseSchema, {
          response: create(CommonResponseSchema, { headerMutation: setHeaders({}, strip), clearRouteCache: true }),
        }),
      },
    });
    if (continueByStrip.size < 64) continueByStrip.set(key, constant(m));
  }
  return m;
}

/** One Envoy HTTP stream = one gRPC stream. */
function handleStream(app: App, call: Call<ProcessingRequest, ProcessingResponse>): void {
  let headers: Record<string, string> = {};
  let bodyChunks: Buffer[] = [];
  let bodyBytes = 0;
  let tooLarge = false;
  let res: Reservation | null = null;
  let picked: Worker | null = null;
  // Load moved to the endpoint the gateway reports it actually served from.
  let moved: Guard | null = null;
  let sawBody = false;
  let decided = false;
  // Envoy names its body modes on the first message; older Envoys do not.
  let bodyMode: ProcessingMode_BodySendMode | null = null;
  let respBodyMode: ProcessingMode_BodySendMode | null = null;
  let subset: string[] | null = null;
  let strip: string[] = [];
  // What the allowlist (core/paths.ts) made of the path: routed by prompt cache, or by load (null).
  let endpoint: Endpoint | null = null;
  // The stream ended (client gone, reset) while its pick was being computed.
  let ended = false;
  // The pick waiting for prefill admission, if any.
  let waiting: Pick | null = null;
  // Each request is counted once by how its routing question was answered.
  let counted = false;
  const outcome = (o: RequestOutcome) => {
    if (counted) return;
    counted = true;
    app.metrics.requests.inc({ outcome: o });
  };
  // Answers leave in message order even when a pick waits on a tokenizer thread.
  let order: Promise<void> = Promise.resolve();
  const inOrder = (f: () => void | Promise<void>) => {
    order = order.then(f).catch((e) => {
      outcome("error");
      app.log("error", `ext_proc message failed: ${(e as Error).stack}`);
      done();
      call.fail(Status.INTERNAL, (e as Error).message);
    });
  };
  const done = () => {
    if (res) res.finish();
    if (moved) {
      const g = moved;
      moved = null;
      app.router.releaseGuard(g);
    }
  };
  // Envoy's streams see a message at least per response chunk; a direct client
  // that goes quiet must not hold its pick's load forever.
  let idle: NodeJS.Timeout | null = null;
  const stopIdle = () => {
    if (idle) clearTimeout(idle);
    idle = null;
  };
  const touch = () => {
    stopIdle();
    idle = setTimeout(() => {
      app.log("warn", `ext_proc stream idle for ${app.opts.extProcStreamIdleS}s: ended, its load released`);
      done();
      call.fail(Status.DEADLINE_EXCEEDED, `no message for ${app.opts.extProcStreamIdleS}s`);
    }, app.opts.extProcStreamIdleS * 1000);
    idle.unref();
  };
  touch();
  const send = (m: ProcessingResponse) => {
    if (!call.writable) return;
    call.write(m);
    // Envoy sends nothing after an immediate response: close our side with OK
    // rather than wait for Envoy to reset the stream (resets at line rate trip
    // Node's HTTP/2 reset-flood guard, which then refuses streams).
    if (m.response.case === "immediateResponse") call.end();
  };
  /** The last answer of the exchange: release, then end the call cleanly. */
  const last = (m: ProcessingResponse) => {
    send(m);
    stopIdle();
    done();
    if (call.writable) call.end();
  };
  type Phase = "requestHeaders" | "requestBody" | "requestTrailers";
  /** The body as the engine must get it, when the pick rewrote it (SGLang rank fields); FULL_DUPLEX streams it back. */
  let newBody: Buffer | null = null;
  const decide = async (body: Buffer, phase: Phase, strip: string[]): Promise<ProcessingResponse> => {
    decided = true;
    const ep = endpoint;
    const allow = subset
      ? (
          (set: Record<string, true>) => (w: Worker) =>
            set[w.address] === true
        )(Object.fromEntries(subset.map((a) => [a, true as const])))
      : undefined;
    let pick: Pick;
    try {
      if (subset && !subset.length)
        throw httpError(503, "the gateway's endpoint subset is empty", "service_unavailable");
      if (ep) {
        pick = await app.routeAsync(ep, body, headers[app.opts.sessionHeader] || null, allow);
      } else {
        // An allowed path that is not a prompt (GET /v1/models, embeddings, --extra-paths): any worker can answer; route by load alone.
        pick = app.router.pick({ blocks: [], inputTokens: 0, exact: false, mediaHashes: [], n: 1 }, null, allow);
      }
    } catch (e) {
      const err = asHttpError(e);
      app.metrics.badRequests.inc({ status: String(err.status) });
      outcome(outcomeOf(err as { status: number; outcome?: string }));
      if (err.status >= 500)
        app.log(
          "warn",
          `routing failed: ${err.message}${subset ? ` (gateway subset: ${subset.join(",") || "empty"})` : ""}`,
        );
      return immediate(err.status, err.message, err.type, headers[":path"] || "", err.param);
    }
    // The target's pool, cheapest first: the pick, then the fallbacks a retrying gateway walks.
    const pool = (pick.decodeCandidates ?? pick.candidates)
      .slice()
      .sort((a, b) => a.cost - b.cost || a.active - b.active);
    const shedAt = app.opts.eppShedActiveBlocks;
    if (
      shedAt > 0 &&
      app.opts.eppSheddableObjectives.includes(headers[OBJECTIVE_HEADER] ?? "") &&
      pool.every((c) => c.active >= shedAt)
    ) {
      pick.reservation.finish();
      app.metrics.badRequests.inc({ status: "429" });
      outcome("shed");
      app.log(
        "info",
        `shed a '${headers[OBJECTIVE_HEADER]}' request: every candidate holds >= ${shedAt} active blocks`,
      );
      return immediate(
        429,
        "all endpoints are saturated; sheddable request dropped",
        "rate_limited",
        headers[":path"] || "",
      );
    }
    // Objectives (core/objectives.ts): a sheddable request whose worker has no
    // free prefill slot is refused now, with a time to come back; any other
    // waits its band's turn in admission.
    const objective = objectiveOf((n) => headers[n], app.opts.objectives.table, app.opts.objectives.trust);
    if (app.shed(pick, objective)) {
      pick.reservation.finish();
      app.metrics.badRequests.inc({ status: "429" });
      outcome("shed");
      return immediate(
        429,
        "the workers are saturated; sheddable request refused, retry later",
        "rate_limited",
        headers[":path"] || "",
        undefined,
        { "retry-after": "1" },
      );
    }
    // Prefill admission: a cold prompt waits here while another cold one is
    // prefilling on its worker. A stream that ends meanwhile finishes it.
    waiting = pick;
    await app.admit(pick, objective);
    waiting = null;
    if (ended) {
      // Nobody is left to answer: the load this pick holds goes back now.
      pick.reservation.finish();
      outcome("client_closed");
      return immediate(
        499,
        "client went away while the request was being routed",
        "client_closed",
        headers[":path"] || "",
      );
    }
    res = pick.reservation;
    picked = pick.target;
    outcome("routed");
    const fallbacks: string[] = [];
    for (const c of pool) {
      if (fallbacks.length >= app.opts.eppFallbackCount) break;
      const w = c.id === pick.target.id ? null : app.router.worker(c.id);
      if (w && !fallbacks.includes(w.address) && w.address !== pick.target.address) fallbacks.push(w.address);
    }
    const dest = [pick.target.address, ...fallbacks].join(",");
    // The gateway connects to the metadata value; the header carries the same
    // value (the protocol forbids the two differing) for header-driven gateways.
    const lb: Record<string, string | boolean> = { [DEST_KEY]: dest };
    if (pick.stream) lb[STREAM_KEY] = true;
    const dynamicMetadata = { [DEST_NAMESPACE]: lb };
    if (phase === "requestTrailers") {
      // Headers can no longer change once trailers arrive; the metadata still routes.
      if (pick.prefill)
        app.log(
          "warn",
          `request ended with trailers: prefill peer ${pick.prefill.id} cannot be named in a header, the decode worker prefills itself`,
        );
      return create(ProcessingResponseSchema, {
        response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) },
        dynamicMetadata,
      });
    }
    const hdrs: Record<string, string> = {
      [app.opts.upstreamHeader]: pick.target.address,
      "x-infera-worker": pick.target.id,
      [DEST_KEY]: dest,
    };
    if (pick.prefill) {
      hdrs[app.opts.prefillHeader] = pick.prefill.address;
      hdrs[LLMD_PREFILL_HEADER] = pick.prefill.address;
      // A prefill engine with DP ranks: its address alone does not name the rank the pick scored.
      if (pick.prefill.dpRank !== undefined)
        hdrs[prefillRankHeader(app.opts.prefillHeader)] = String(pick.prefill.dpRank);
    }
    if (pick.kvSource) hdrs[KV_SOURCE_HEADER] = pick.kvSource.address;
    // A data-parallel rank target: vLLM (and SGLang's OpenAI routes) pin the request to that rank by this header.
    if (pick.target.dpRank !== undefined) hdrs[DP_RANK_HEADER] = String(pick.target.dpRank);
    // SGLang reads the ranks from the body: appended as its last members, the rest byte for byte.
    const fields = dpBodyFields(ep, pick.target, pick.prefill);
    const rewritten = fields ? withBodyFields(body.toString("utf8"), fields) : null;
    if (rewritten !== null) {
      newBody = Buffer.from(rewritten, "utf8");
      hdrs["content-length"] = String(newBody.length);
    }
    // The prefill headers are removed again here: only the router names prefill peers.
    const remove = [
      ...new Set([
        ...strip,
        app.opts.prefillHeader,
        prefillRankHeader(app.opts.prefillHeader),
        LLMD_PREFILL_HEADER,
        "x-prefiller-url",
        KV_SOURCE_HEADER,
      ]),
    ].filter((h) => !(h in hdrs));
    const bodyMutation =
      newBody && phase === "requestBody"
        ? create(BodyMutationSchema, { mutation: { case: "body", value: newBody } })
        : undefined;
    const common = create(CommonResponseSchema, {
      headerMutation: setHeaders(hdrs, remove),
      clearRouteCache: true,
      bodyMutation,
    });
    return create(ProcessingResponseSchema, {
      response:
        phase === "requestHeaders"
          ? { case: "requestHeaders", value: create(HeadersResponseSchema, { response: common }) }
          : { case: "requestBody", value: create(BodyResponseSchema, { response: common }) },
      dynamicMetadata,
    });
  };

  // FULL_DUPLEX_STREAMED: nothing reaches the upstream until we answer, so the
  // headers answer (carrying the pick) waits for the whole body; then the body
  // goes back unchanged as streamed pieces.
  const duplexRelease = (trailersFollow: boolean) => {
    const orig = Buffer.concat(bodyChunks);
    bodyChunks = [];
    const answered = decide(orig, "requestHeaders", strip);
    inOrder(async () => {
      const r = await answered;
      send(r);
      if (r.response.case === "immediateResponse") return;
      const body = newBody ?? orig;
      const pieces = Math.max(1, Math.ceil(body.length / BODY_PIECE));
      for (let i = 0; i < pieces; i++) {
        const last = i === pieces - 1;
        send(streamedBody("requestBody", body.subarray(i * BODY_PIECE, (i + 1) * BODY_PIECE), last && !trailersFollow));
      }
    });
    // The body has gone back to Envoy (or the request was refused): no longer held.
    inOrder(() => call.releaseHeld());
  };
  const answer = (r: ProcessingResponse | Promise<ProcessingResponse>) => inOrder(async () => send(await r));

  call.on("data", (m: ProcessingRequest) => {
    touch();
    // Envoy's x-request-id tags every log line of this request.
    if (m.request.case === "requestHeaders") headers = headerMap(m.request.value.headers);
    withRequestId(headers["x-request-id"], () => onMessage(m));
  });
  const onMessage = (m: ProcessingRequest) => {
    try {
      const r = m.request;
      if (m.protocolConfig && bodyMode === null) {
        bodyMode = m.protocolConfig.requestBodyMode;
        respBodyMode = m.protocolConfig.responseBodyMode;
      }
      const fullDuplex = bodyMode === ProcessingMode_BodySendMode.FULL_DUPLEX_STREAMED;
      switch (r.case) {
        case "requestHeaders": {
          // headers: read once, on arrival (the request id tags the logs)
          subset = call.peer.trusted ? subsetOf(m) : null;
          // Always a removal (of our own names at least): Envoy re-resolves the
          // route only after a header mutation, and the route must be resolved
          // again once the pick's metadata exists, even when no body phase follows.
          strip = [
            ...new Set([
              app.opts.upstreamHeader,
              app.opts.prefillHeader,
              prefillRankHeader(app.opts.prefillHeader),
              DEST_KEY,
              LLMD_PREFILL_HEADER,
              KV_SOURCE_HEADER,
              ...Object.keys(headers).filter((h) => isRoutingHeader(h, app.opts) || h.startsWith("x-prefiller-")),
            ]),
          ];
          for (const h of strip) delete headers[h];
          // Only allowed paths reach a worker; the rest are answered here, before any body is read.
          const verdict = checkPath(app.opts.pathRules, headers[":method"] || "GET", headers[":path"] || "/");
          if (verdict.error) {
            decided = true;
            app.metrics.badRequests.inc({ status: String(verdict.error.status) });
            outcome(outcomeOf(verdict.error));
            answer(immediate(verdict.error.status, verdict.error.message, verdict.error.type, headers[":path"] || ""));
            break;
          }
          endpoint = verdict.endpoint;
          // No body coming (GET, or an empty POST): decide now.
          if (r.value.endOfStream) answer(decide(Buffer.alloc(0), "requestHeaders", strip));
          else if (fullDuplex)
            break; // answered once the body is complete
          else answer(headersContinue(strip));
          break;
        }
        case "requestBody":
          if (tooLarge) break;
          if (!call.hold(r.value.body.length)) {
            // Over the connection's (or the server's) cap on buffered request
            // bytes: this request goes, the connection and the others stay.
            tooLarge = true;
            bodyChunks = [];
            call.releaseHeld();
            app.metrics.badRequests.inc({ status: "503" });
            app.log(
              "warn",
              `ext_proc: request body refused, the buffered-bytes cap is reached (--ext-proc-max-buffered-bytes-per-connection ${app.opts.extProcMaxBufferedBytesPerConnection}, --ext-proc-max-buffered-bytes ${app.opts.extProcMaxBufferedBytes})`,
            );
            answer(
              immediate(
                503,
                "the router is holding too many request bodies; retry shortly",
                "service_unavailable",
                headers[":path"] || "",
              ),
            );
            break;
          }
          bodyChunks.push(Buffer.from(r.value.body));
          bodyBytes += r.value.body.length;
          if (fullDuplex && bodyBytes > app.opts.maxBodyBytes) {
            // Streamed bodies are not bounded by Envoy's buffer: refuse at the
            // limit rather than hold an unbounded body in memory.
            tooLarge = true;
            bodyChunks = [];
            call.releaseHeld();
            app.metrics.badRequests.inc({ status: "413" });
            outcome("too_large");
            answer(
              immediate(
                413,
                `request body is over the ${app.opts.maxBodyBytes}-byte limit`,
                "request_too_large",
                headers[":path"] || "",
              ),
            );
            break;
          }
          if (fullDuplex) {
            if (r.value.endOfStream) duplexRelease(false);
            break;
          }
          // BUFFERED sends the body once it is whole; without end_of_stream it
          // means trailers follow (and Envoy waits for this answer before sending them).
          if (r.value.endOfStream || bodyMode === ProcessingMode_BodySendMode.BUFFERED) {
            const body = Buffer.concat(bodyChunks);
            bodyChunks = [];
            answer(decide(body, "requestBody", []));
            inOrder(() => call.releaseHeld());
          } else {
            // A partial body (STREAMED / BUFFERED_PARTIAL): the upstream header can no
            // longer be set once chunks flow, so say what to fix instead of misrouting.
            app.log(
              "warn",
              "ext_proc got a partial request body: set request_body_mode: BUFFERED or FULL_DUPLEX_STREAMED",
            );
            outcome("error");
            answer(
              immediate(
                500,
                "gateway misconfigured: ext_proc request_body_mode must be BUFFERED or FULL_DUPLEX_STREAMED (routing needs the whole body)",
                "server_misconfigured",
                headers[":path"] || "",
              ),
            );
          }
          break;
        case "requestTrailers":
          if (tooLarge) break;
          if (fullDuplex && !decided) {
            duplexRelease(true);
            answer(
              create(ProcessingResponseSchema, {
                response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) },
              }),
            );
            break;
          }
          // An HTTP/2 request may end with trailers, with or without body frames:
          // that is its end of body, and the pick happens here.
          if (!decided) {
            const body = Buffer.concat(bodyChunks);
            bodyChunks = [];
            answer(decide(body, "requestTrailers", []));
            inOrder(() => call.releaseHeld());
          } else
            answer(
              create(ProcessingResponseSchema, {
                response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) },
              }),
            );
          break;
        case "responseHeaders": {
          // Load moves only on the gateway's word (the server refuses other peers' streams; belt and braces).
          const served = call.peer.trusted ? servedOf(m) : null;
          if (served && picked && res && !moved && served !== picked.address) {
            // The gateway fell back down the list (or past it): the load sits
            // where the request went, not where we sent it.
            const w = app.router.workers().find((x) => x.address === served);
            const g = res.guards().main;
            const again = w && !g.done ? app.router.holdOn(w.id, g) : null;
            if (again) {
              app.router.releaseGuard(g);
              g.done = true;
              moved = again;
            }
            app.metrics.eppFallbacks.inc({ known: String(!!again) });
            app.log(
              "info",
              `gateway served from ${served} instead of ${picked.address}${again ? `: load moved to ${w!.id}` : " (not a known worker)"}`,
            );
          }
          if (r.value.endOfStream) last(CONTINUE_RESP_HEADERS);
          else send(CONTINUE_RESP_HEADERS);
          break;
        }
        case "responseBody":
          if (!sawBody && res) res.firstToken();
          sawBody = true;
          {
            const reply =
              respBodyMode === ProcessingMode_BodySendMode.FULL_DUPLEX_STREAMED
                ? streamedBody("responseBody", Buffer.from(r.value.body), r.value.endOfStream)
                : CONTINUE_RESP_BODY;
            // end_of_stream on a body chunk means no trailers follow (they would carry it).
            if (r.value.endOfStream) last(reply);
            else send(reply);
          }
          break;
        case "responseTrailers":
          last(
            create(ProcessingResponseSchema, {
              response: { case: "responseTrailers", value: create(TrailersResponseSchema, {}) },
            }),
          );
          break;
        default:
          break;
      }
    } catch (e) {
      outcome("error");
      app.log("error", `ext_proc message failed: ${(e as Error).stack}`);
      done();
      call.fail(Status.INTERNAL, (e as Error).message);
    }
  };
  // Client abort, upstream reset, Envoy closing the stream: all end up here.
  // A client half-closing after its last message still reads the answers in flight.
  call.on("end", () =>
    inOrder(() => {
      stopIdle();
      done();
      call.end();
    }),
  );
  const gone = () => {
    ended = true;
    if (waiting) waiting.reservation.finish();
    stopIdle();
    done();
  };
  call.on("cancelled", gone);
  call.on("close", gone);
}

function streamedBody(phase: "requestBody" | "responseBody", body: Buffer, endOfStream: boolean): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: {
      case: phase,
      value: create(BodyResponseSchema, {
        response: create(CommonResponseSchema, {
          status: CommonResponse_ResponseStatus.CONTINUE_AND_REPLACE,
          bodyMutation: create(BodyMutationSchema, {
            mutation: { case: "streamedResponse", value: create(StreamedBodyResponseSchema, { body, endOfStream }) },
          }),
        }),
      }),
    },
  });
}

export async function startExtProc(
  app: App,
  host: string,
  port: number,
): Promise<{ server: GrpcServer; port: number }> {
  // One per registry: a second server on the same App (tests) replaces the first's gauge.
  for (const n of ["infera_router_ext_proc_refused_streams_total", "infera_router_ext_proc_buffered_bytes"])
    app.metrics.registry.removeSingleMetric(n);
  const refusedStreams = new Counter({
    name: "infera_router_ext_proc_refused_streams_total",
    help: "ext_proc streams refused: not_gateway (client certificate not in --ext-proc-client-identities), buffer_cap (over a buffered-bytes cap)",
    labelNames: ["reason"],
    registers: [app.metrics.registry],
  });
  const tls = app.opts.extProcTls;
  const server = new GrpcServer({
    // Tied to the body limit: bodies up to twice --max-body-bytes still reach us
    // and get a clean 413 (Envoy's own buffer, 16 MiB in the shipped config, is
    // twice the default limit and answers beyond it); nothing larger is read.
    maxMessageBytes: 2 * app.opts.maxBodyBytes + 1024 * 1024,
    maxConcurrentStreams: app.opts.extProcMaxStreams,
    maxBufferedBytesPerConnection: app.opts.extProcMaxBufferedBytesPerConnection,
    maxBufferedBytes: app.opts.extProcMaxBufferedBytes,
    tls: tls
      ? {
          cert: fs.readFileSync(tls.cert),
          key: fs.readFileSync(tls.key),
          clientCa: tls.clientCa ? fs.readFileSync(tls.clientCa) : null,
        }
      : null,
    trustedClients: app.opts.extProcClientIdentities,
    onRefused: (reason) => refusedStreams.inc({ reason }),
  });
  new Gauge({
    name: "infera_router_ext_proc_buffered_bytes",
    help: "Request bytes the ext_proc server holds now (messages being received, bodies before their pick); capped by --ext-proc-max-buffered-bytes",
    registers: [app.metrics.registry],
    collect() {
      this.set(server.buffered.used);
    },
  });
  // Only the gateway may route: a stream holds load, takes admission slots and
  // buffers a body, so a client that is not the gateway is refused outright
  // (ignoring its metadata alone would leave those open). The health service
  // stays open to any client the TLS layer admits.
  server.add<ProcessingRequest, ProcessingResponse>(ExtProcService.Process.path, {
    decode: decodeRequest,
    encode: encodeResponse,
    handler: (call) => handleStream(app, call),
    trustedOnly: true,
  });
  // grpc.health.v1 on the same port (Endpoint Picker Protocol: liveness, readiness, ext_proc).
  const health = addHealth(server, app);
  const shutdown = server.forceShutdown.bind(server);
  server.forceShutdown = () => {
    health.stop();
    shutdown();
  };
  const bound = await server.listen(host, port);
  return { server, port: bound };
}
