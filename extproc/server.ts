// Envoy ext_proc (envoy.service.ext_proc.v3.ExternalProcessor/Process).
// Request headers -> CONTINUE; buffered request body -> pick, then a header
// mutation naming the upstream for the ORIGINAL_DST cluster (use_http_header).
// Response body chunks are observed (STREAMED) to release load at first token
// and at end_of_stream; a reset/closed stream releases whatever is left.
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  BodyResponseSchema,
  CommonResponseSchema,
  HeadersResponseSchema,
  HeaderMutationSchema,
  ImmediateResponseSchema,
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  ProcessingResponseSchema,
  TrailersResponseSchema,
} from "./gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderValueOption_HeaderAppendAction, HeaderValueOptionSchema, HeaderValueSchema, HeaderMap } from "./gen/envoy/config/core/v3/base_pb";
import { HttpStatusSchema, StatusCode } from "./gen/envoy/type/v3/http_status_pb";
import { ProcessingMode_BodySendMode } from "./gen/envoy/extensions/filters/http/ext_proc/v3/processing_mode_pb";
import { endpointOf } from "../core/request";
import { asHttpError, errorPayload } from "../core/util";
import { Pick, Reservation } from "../core/router";
import { App } from "./app";
import { addHealth } from "./health";

function headerMap(m: HeaderMap | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of m?.headers ?? []) out[h.key.toLowerCase()] = h.rawValue.length ? Buffer.from(h.rawValue).toString("utf8") : h.value;
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

function immediate(status: number, message: string, type: string): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: {
      case: "immediateResponse",
      value: create(ImmediateResponseSchema, {
        status: create(HttpStatusSchema, { code: status as StatusCode }),
        headers: setHeaders({ "content-type": "application/json" }),
        body: Buffer.from(JSON.stringify(errorPayload(status, message, type))),
        details: "infera_" + type,
      }),
    },
  });
}

/** Dynamic-metadata namespace and key the gateway's ORIGINAL_DST cluster reads the pick from (GIE convention). */
export const DEST_NAMESPACE = "envoy.lb";
export const DEST_KEY = "x-gateway-destination-endpoint";

/**
 * Client-sent headers that only the router may set. A gateway config may route
 * or trust on them, so they never survive the request-headers phase.
 */
export function isRoutingHeader(name: string, opts: { upstreamHeader: string; prefillHeader: string }): boolean {
  const n = name.toLowerCase();
  return n.startsWith("x-infera-") || n.startsWith(DEST_KEY) || n === opts.upstreamHeader || n === opts.prefillHeader;
}
const CONTINUE_RESP_HEADERS = create(ProcessingResponseSchema, {
  response: { case: "responseHeaders", value: create(HeadersResponseSchema, { response: create(CommonResponseSchema, {}) }) },
});
const CONTINUE_RESP_BODY = create(ProcessingResponseSchema, {
  response: { case: "responseBody", value: create(BodyResponseSchema, { response: create(CommonResponseSchema, {}) }) },
});

export const ExtProcService: grpc.ServiceDefinition = {
  Process: {
    path: "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
    requestStream: true,
    responseStream: true,
    requestSerialize: (m: ProcessingRequest) => Buffer.from(toBinary(ProcessingRequestSchema, m)),
    requestDeserialize: (b: Buffer) => fromBinary(ProcessingRequestSchema, b),
    responseSerialize: (m: ProcessingResponse) => Buffer.from(toBinary(ProcessingResponseSchema, m)),
    responseDeserialize: (b: Buffer) => fromBinary(ProcessingResponseSchema, b),
  },
};

/** One Envoy HTTP stream = one gRPC stream. */
function handleStream(app: App, call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>): void {
  let headers: Record<string, string> = {};
  let bodyChunks: Buffer[] = [];
  let res: Reservation | null = null;
  let sawBody = false;
  let decided = false;
  // Envoy names its body mode on the first message; older Envoys do not.
  let bodyMode: ProcessingMode_BodySendMode | null = null;
  const done = () => {
    if (res) res.finish();
  };
  const send = (m: ProcessingResponse) => {
    if (!call.writable) return;
    call.write(m);
  };
  type Phase = "requestHeaders" | "requestBody" | "requestTrailers";
  const decide = (body: Buffer, phase: Phase, strip: string[]): ProcessingResponse => {
    decided = true;
    const ep = endpointOf(headers[":path"] || "/");
    let pick: Pick;
    try {
      if (ep && (headers[":method"] || "POST") === "POST") {
        pick = app.route(ep, body, headers[app.opts.sessionHeader] || null);
      } else {
        // Not an LLM call (e.g. GET /v1/models): any worker can answer; route by load alone.
        pick = app.router.pick({ blocks: [], inputTokens: 0, exact: false, mediaHashes: [], n: 1 });
      }
    } catch (e) {
      const err = asHttpError(e);
      app.metrics.badRequests.inc({ status: String(err.status) });
      if (err.status >= 500) app.log("warn", `routing failed: ${err.message}`);
      return immediate(err.status, err.message, err.type);
    }
    res = pick.reservation;
    // The gateway connects to the metadata value; the headers tell the worker
    // (and logs) what was picked.
    const dynamicMetadata = { [DEST_NAMESPACE]: { [DEST_KEY]: pick.target.address } };
    if (phase === "requestTrailers") {
      // Headers can no longer change once trailers arrive; the metadata still routes.
      if (pick.prefill) app.log("warn", `request ended with trailers: prefill peer ${pick.prefill.id} cannot be named in a header, the decode worker prefills itself`);
      return create(ProcessingResponseSchema, { response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) }, dynamicMetadata });
    }
    const hdrs: Record<string, string> = { [app.opts.upstreamHeader]: pick.target.address, "x-infera-worker": pick.target.id };
    if (pick.prefill) hdrs[app.opts.prefillHeader] = pick.prefill.address;
    // The prefill header is removed again here: only the router names prefill peers.
    const remove = [...new Set([...strip, app.opts.prefillHeader])].filter((h) => !(h in hdrs));
    const common = create(CommonResponseSchema, { headerMutation: setHeaders(hdrs, remove), clearRouteCache: true });
    return create(ProcessingResponseSchema, {
      response:
        phase === "requestHeaders"
          ? { case: "requestHeaders", value: create(HeadersResponseSchema, { response: common }) }
          : { case: "requestBody", value: create(BodyResponseSchema, { response: common }) },
      dynamicMetadata,
    });
  };

  call.on("data", (m: ProcessingRequest) => {
    try {
      const r = m.request;
      if (m.protocolConfig && bodyMode === null) bodyMode = m.protocolConfig.requestBodyMode;
      switch (r.case) {
        case "requestHeaders": {
          headers = headerMap(r.value.headers);
          // Always a removal (of our own names at least): Envoy re-resolves the
          // route only after a header mutation, and the route must be resolved
          // again once the pick's metadata exists, even when no body phase follows.
          const strip = [...new Set([app.opts.upstreamHeader, app.opts.prefillHeader, DEST_KEY, ...Object.keys(headers).filter((h) => isRoutingHeader(h, app.opts))])];
          for (const h of strip) delete headers[h];
          // No body coming (GET, or an empty POST): decide now.
          if (r.value.endOfStream) send(decide(Buffer.alloc(0), "requestHeaders", strip));
          else
            send(
              create(ProcessingResponseSchema, {
                response: {
                  case: "requestHeaders",
                  value: create(HeadersResponseSchema, { response: create(CommonResponseSchema, { headerMutation: setHeaders({}, strip), clearRouteCache: true }) }),
                },
              }),
            );
          break;
        }
        case "requestBody":
          bodyChunks.push(Buffer.from(r.value.body));
          // BUFFERED sends the body once it is whole; without end_of_stream it
          // means trailers follow (and Envoy waits for this answer before sending them).
          if (r.value.endOfStream || bodyMode === ProcessingMode_BodySendMode.BUFFERED) {
            const body = Buffer.concat(bodyChunks);
            bodyChunks = [];
            send(decide(body, "requestBody", []));
          } else {
            // A partial body (STREAMED / BUFFERED_PARTIAL): the upstream header can no
            // longer be set once chunks flow, so say what to fix instead of misrouting.
            app.log("warn", "ext_proc got a partial request body: set request_body_mode: BUFFERED");
            send(immediate(500, "gateway misconfigured: ext_proc request_body_mode must be BUFFERED (routing needs the whole body)", "server_misconfigured"));
          }
          break;
        case "requestTrailers":
          // An HTTP/2 request may end with trailers, with or without body frames:
          // that is its end of body, and the pick happens here.
          if (!decided) {
            const body = Buffer.concat(bodyChunks);
            bodyChunks = [];
            send(decide(body, "requestTrailers", []));
          } else send(create(ProcessingResponseSchema, { response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) } }));
          break;
        case "responseHeaders":
          send(CONTINUE_RESP_HEADERS);
          if (r.value.endOfStream) done();
          break;
        case "responseBody":
          if (!sawBody && res) res.firstToken();
          sawBody = true;
          send(CONTINUE_RESP_BODY);
          if (r.value.endOfStream) done();
          break;
        case "responseTrailers":
          send(create(ProcessingResponseSchema, { response: { case: "responseTrailers", value: create(TrailersResponseSchema, {}) } }));
          done();
          break;
        default:
          break;
      }
    } catch (e) {
      app.log("error", `ext_proc message failed: ${(e as Error).stack}`);
      done();
      call.destroy(e as Error);
    }
  });
  // Client abort, upstream reset, Envoy closing the stream: all end up here.
  call.on("end", () => {
    done();
    call.end();
  });
  call.on("cancelled", done);
  call.on("error", done);
  call.on("close", done);
}

export async function startExtProc(app: App, host: string, port: number): Promise<{ server: grpc.Server; port: number }> {
  const server = new grpc.Server({ "grpc.max_receive_message_length": 64 * 1024 * 1024 });
  server.addService(ExtProcService, { Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => handleStream(app, call) });
  // grpc.health.v1 on the same port (Endpoint Picker Protocol: liveness, readiness, ext_proc).
  const health = addHealth(server, app);
  const shutdown = server.forceShutdown.bind(server);
  server.forceShutdown = () => {
    health.stop();
    shutdown();
  };
  const bound = await new Promise<number>((resolve, reject) =>
    server.bindAsync(`${host}:${port}`, grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { server, port: bound };
}
