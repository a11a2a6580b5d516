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
import { endpointOf } from "../core/request";
import { Pick, Reservation } from "../core/router";
import { App } from "./app";

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

function errorBody(status: number, message: string, type: string): Buffer {
  return Buffer.from(JSON.stringify({ error: { message, type, code: status } }));
}

function immediate(status: number, message: string, type: string): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: {
      case: "immediateResponse",
      value: create(ImmediateResponseSchema, {
        status: create(HttpStatusSchema, { code: status as StatusCode }),
        headers: setHeaders({ "content-type": "application/json" }),
        body: errorBody(status, message, type),
        details: "infera_" + type,
      }),
    },
  });
}

const CONTINUE_REQ_HEADERS = create(ProcessingResponseSchema, {
  response: { case: "requestHeaders", value: create(HeadersResponseSchema, { response: create(CommonResponseSchema, {}) }) },
});
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
  const done = () => {
    if (res) res.finish();
  };
  const send = (m: ProcessingResponse) => {
    if (!call.writable) return;
    call.write(m);
  };
  const decide = (body: Buffer, atHeaders: boolean): ProcessingResponse => {
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
      const err = e as Error & { status?: number; type?: string };
      const status = err.status ?? 500;
      app.metrics.badRequests.inc({ status: String(status) });
      if (status >= 500) app.log("warn", `routing failed: ${err.message}`);
      return immediate(status, err.message, err.type ?? "internal_error");
    }
    res = pick.reservation;
    const hdrs: Record<string, string> = { [app.opts.upstreamHeader]: pick.target.address, "x-infera-worker": pick.target.id };
    if (pick.prefill) hdrs[app.opts.prefillHeader] = pick.prefill.address;
    // A client-sent prefill header must never reach a worker: only the router names prefill peers.
    const common = create(CommonResponseSchema, { headerMutation: setHeaders(hdrs, pick.prefill ? [] : [app.opts.prefillHeader]), clearRouteCache: true });
    return create(ProcessingResponseSchema, {
      response: atHeaders
        ? { case: "requestHeaders", value: create(HeadersResponseSchema, { response: common }) }
        : { case: "requestBody", value: create(BodyResponseSchema, { response: common }) },
    });
  };

  call.on("data", (m: ProcessingRequest) => {
    try {
      const r = m.request;
      switch (r.case) {
        case "requestHeaders":
          headers = headerMap(r.value.headers);
          // No body coming (GET, or an empty POST): decide now.
          send(r.value.endOfStream ? decide(Buffer.alloc(0), true) : CONTINUE_REQ_HEADERS);
          break;
        case "requestBody":
          bodyChunks.push(Buffer.from(r.value.body));
          if (r.value.endOfStream) {
            const body = Buffer.concat(bodyChunks);
            bodyChunks = [];
            send(decide(body, false));
          } else {
            // A partial body (STREAMED / BUFFERED_PARTIAL): the upstream header can no
            // longer be set once chunks flow, so say what to fix instead of misrouting.
            app.log("warn", "ext_proc got a partial request body: set request_body_mode: BUFFERED");
            send(immediate(500, "gateway misconfigured: ext_proc request_body_mode must be BUFFERED (routing needs the whole body)", "server_misconfigured"));
          }
          break;
        case "requestTrailers":
          send(create(ProcessingResponseSchema, { response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) } }));
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
  const bound = await new Promise<number>((resolve, reject) =>
    server.bindAsync(`${host}:${port}`, grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { server, port: bound };
}
