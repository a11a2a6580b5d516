// The ext_proc answers as protobuf: the processor (processor.ts) decides in
// plain values and encodes here. Fixed answers are encoded once (wire.ts).
import { create } from "@bufbuild/protobuf";
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
import { errorJson } from "../core/errors";
import { DEST_NAMESPACE } from "../runtime/director";
import { constant } from "./wire";

export function headerMap(m: HeaderMap | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of m?.headers ?? [])
    out[h.key.toLowerCase()] = h.rawValue.length ? Buffer.from(h.rawValue).toString("utf8") : h.value;
  return out;
}

export function setHeaders(pairs: Record<string, string>, remove: string[] = []) {
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

export function immediate(
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

export const CONTINUE_RESP_HEADERS = constant(
  create(ProcessingResponseSchema, {
    response: {
      case: "responseHeaders",
      value: create(HeadersResponseSchema, { response: create(CommonResponseSchema, {}) }),
    },
  }),
);
export const CONTINUE_RESP_BODY = constant(
  create(ProcessingResponseSchema, {
    response: {
      case: "responseBody",
      value: create(BodyResponseSchema, { response: create(CommonResponseSchema, {}) }),
    },
  }),
);

export function trailersContinue(): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) },
  });
}

export function responseTrailersContinue(): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: { case: "responseTrailers", value: create(TrailersResponseSchema, {}) },
  });
}

// The headers answer of a request with a body depends only on which routing
// headers it strips, nearly always our own fixed names: one encoding each.
// Bounded, since a client chooses the names of the headers it sends.
const continueByStrip = new Map<string, ProcessingResponse>();
export function headersContinue(strip: string[]): ProcessingResponse {
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

/** The routing answer: header mutation (and the rewritten body) in the phase that carries it, plus the metadata. */
export function routeAnswer(
  phase: "requestHeaders" | "requestBody",
  set: Record<string, string>,
  remove: string[],
  body: Buffer | null,
  lb: Record<string, string | boolean>,
): ProcessingResponse {
  const common = create(CommonResponseSchema, {
    headerMutation: setHeaders(set, remove),
    clearRouteCache: true,
    bodyMutation: body ? create(BodyMutationSchema, { mutation: { case: "body", value: body } }) : undefined,
  });
  return create(ProcessingResponseSchema, {
    response:
      phase === "requestHeaders"
        ? { case: "requestHeaders", value: create(HeadersResponseSchema, { response: common }) }
        : { case: "requestBody", value: create(BodyResponseSchema, { response: common }) },
    dynamicMetadata: { [DEST_NAMESPACE]: lb },
  });
}

/** Trailers can no longer change headers: the metadata alone routes. */
export function trailersRoute(lb: Record<string, string | boolean>): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) },
    dynamicMetadata: { [DEST_NAMESPACE]: lb },
  });
}

export function streamedBody(
  phase: "requestBody" | "responseBody",
  body: Buffer,
  endOfStream: boolean,
): ProcessingResponse {
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

/** STREAMED mode: this response chunk is replaced by body (empty: nothing goes to the client for it). */
export function replacedBody(body: Buffer): ProcessingResponse {
  return create(ProcessingResponseSchema, {
    response: {
      case: "responseBody",
      value: create(BodyResponseSchema, {
        response: create(CommonResponseSchema, {
          bodyMutation: create(BodyMutationSchema, { mutation: { case: "body", value: body } }),
        }),
      }),
    },
  });
}

/** Metadata namespace and key a gateway may name the allowed endpoints under (Endpoint Picker Protocol). */
export const SUBSET_NAMESPACE = "envoy.lb.subset_hint";
export const SUBSET_KEY = "x-gateway-destination-endpoint-subset";
/** Metadata key (namespace envoy.lb) under which the gateway reports the endpoint that served. */
export const SERVED_KEY = "x-gateway-destination-endpoint-served";

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

export function servedOf(m: ProcessingRequest): string | null {
  const v = m.metadataContext?.filterMetadata?.[DEST_NAMESPACE]?.[SERVED_KEY];
  return typeof v === "string" && v ? v.split(",")[0].trim() : null;
}
