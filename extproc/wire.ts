// Response body chunks are most of an ext_proc stream's messages (one per
// streamed chunk of every generation) and carry nothing we read but the
// end-of-stream bit; the request body is on every request's path to its first
// byte. Both are decoded here by hand; everything else, and anything
// unexpected in a body message, goes through the generated decoder.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Metadata, MetadataSchema } from "./gen/envoy/config/core/v3/base_pb";
import {
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  ProcessingResponseSchema,
} from "./gen/envoy/service/ext_proc/v3/external_processor_pb";

// ProcessingRequest field numbers (envoy/service/ext_proc/v3/external_processor.proto).
const REQUEST_BODY = 4;
const RESPONSE_BODY = 5;
const METADATA_CONTEXT = 8;
const OBSERVABILITY_MODE = 10;
// HttpBody.
const BODY = 1;
const END_OF_STREAM = 2;

/** A varint at pos: [value, next pos], or null when it runs past the end or past 32 bits of interest. */
export function varint(b: Uint8Array, pos: number): [number, number] | null {
  let v = 0;
  let mul = 1;
  for (let i = 0; i < 10; i++) {
    if (pos >= b.length) return null;
    const x = b[pos++];
    v += (x & 0x7f) * mul;
    if (x < 0x80) return v <= Number.MAX_SAFE_INTEGER ? [v, pos] : null;
    mul *= 128;
  }
  return null;
}

/** HttpBody fields 1 and 2 from sub, or null for anything else in it. */
function httpBody(b: Uint8Array): { body: Uint8Array; endOfStream: boolean } | null {
  let pos = 0;
  let body: Uint8Array = new Uint8Array(0);
  let eos = false;
  while (pos < b.length) {
    const t = varint(b, pos);
    if (!t) return null;
    pos = t[1];
    const field = Math.floor(t[0] / 8);
    const wt = t[0] & 7;
    if (field === BODY && wt === 2) {
      const l = varint(b, pos);
      if (!l || l[1] + l[0] > b.length) return null;
      body = b.subarray(l[1], l[1] + l[0]);
      pos = l[1] + l[0];
    } else if (field === END_OF_STREAM && wt === 0) {
      const v = varint(b, pos);
      if (!v) return null;
      eos = v[0] !== 0;
      pos = v[1];
    } else return null;
  }
  return { body, endOfStream: eos };
}

// Shared by every chunk that carries the empty one; nothing writes to it.
const EMPTY_METADATA: Metadata = Object.freeze(create(MetadataSchema)) as Metadata;

/** Decodes a ProcessingRequest; a bare request or response body without the reflective decoder. */
export function decodeRequest(buf: Uint8Array): ProcessingRequest {
  let pos = 0;
  let chunk: { body: Uint8Array; endOfStream: boolean } | null = null;
  let field5 = true;
  let observabilityMode = false;
  let metadata: Metadata | undefined;
  while (pos < buf.length) {
    const t = varint(buf, pos);
    if (!t) return fromBinary(ProcessingRequestSchema, buf);
    pos = t[1];
    const field = Math.floor(t[0] / 8);
    const wt = t[0] & 7;
    if ((field === RESPONSE_BODY || field === REQUEST_BODY) && wt === 2 && !chunk) {
      field5 = field === RESPONSE_BODY;
      const l = varint(buf, pos);
      if (!l || l[1] + l[0] > buf.length) return fromBinary(ProcessingRequestSchema, buf);
      chunk = httpBody(buf.subarray(l[1], l[1] + l[0]));
      if (!chunk) return fromBinary(ProcessingRequestSchema, buf);
      pos = l[1] + l[0];
    } else if (field === METADATA_CONTEXT && wt === 2 && buf[pos] === 0) {
      // Envoy attaches an empty metadata_context to every message; a non-empty one is decoded in full.
      pos += 1;
      metadata = EMPTY_METADATA;
    } else if (field === OBSERVABILITY_MODE && wt === 0) {
      const v = varint(buf, pos);
      if (!v) return fromBinary(ProcessingRequestSchema, buf);
      observabilityMode = v[0] !== 0;
      pos = v[1];
    } else return fromBinary(ProcessingRequestSchema, buf);
  }
  if (!chunk) return fromBinary(ProcessingRequestSchema, buf);
  // The generated message's shape, minus the fields a body chunk leaves unset.
  return {
    $typeName: "envoy.service.ext_proc.v3.ProcessingRequest",
    request: {
      case: field5 ? "responseBody" : "requestBody",
      value: { $typeName: "envoy.service.ext_proc.v3.HttpBody", body: chunk.body, endOfStream: chunk.endOfStream },
    },
    attributes: {},
    observabilityMode,
    metadataContext: metadata,
  } as ProcessingRequest;
}

// Constant replies (CONTINUE for a chunk or for headers) are encoded once.
const encoded = new WeakMap<ProcessingResponse, Buffer>();

/** Marks a reply that never changes, so it is encoded once. */
export function constant(m: ProcessingResponse): ProcessingResponse {
  encoded.set(m, Buffer.from(toBinary(ProcessingResponseSchema, m)));
  return m;
}

export function encodeResponse(m: ProcessingResponse): Buffer {
  return encoded.get(m) ?? Buffer.from(toBinary(ProcessingResponseSchema, m));
}
