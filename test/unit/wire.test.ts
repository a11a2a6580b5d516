// The hand decoder of request and response bodies must agree with the generated
// decoder on every message, and hand everything else to it.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { create, toBinary, fromBinary } from "@bufbuild/protobuf";
import {
  ProcessingRequestSchema,
  HttpBodySchema,
  HttpHeadersSchema,
  ProcessingResponseSchema,
  BodyResponseSchema,
  CommonResponseSchema,
} from "../../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderMapSchema, HeaderValueSchema } from "../../extproc/gen/envoy/config/core/v3/base_pb";
import { constant, decodeRequest, encodeResponse } from "../../extproc/wire";

const same = (bin: Uint8Array) => {
  const want = fromBinary(ProcessingRequestSchema, bin);
  const got = decodeRequest(bin);
  assert.equal(got.request.case, want.request.case);
  assert.equal(got.observabilityMode, want.observabilityMode);
  if (
    (want.request.case === "responseBody" && got.request.case === "responseBody") ||
    (want.request.case === "requestBody" && got.request.case === "requestBody")
  ) {
    assert.deepEqual(Buffer.from(got.request.value.body), Buffer.from(want.request.value.body));
    assert.equal(got.request.value.endOfStream, want.request.value.endOfStream);
  } else assert.deepEqual(got, want);
  // Re-encoding what we decoded gives the same bytes: nothing was dropped.
  assert.deepEqual(
    Buffer.from(toBinary(ProcessingRequestSchema, got)),
    Buffer.from(toBinary(ProcessingRequestSchema, want)),
  );
};

test("request and response bodies of every size, with and without end_of_stream and observability_mode, decode as the generated decoder does", () => {
  let seed = 7;
  const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
  for (const size of [0, 1, 2, 127, 128, 129, 16383, 16384, 70000, 1 << 20]) {
    for (const eos of [false, true]) {
      for (const obs of [false, true]) {
        const body = Buffer.alloc(size);
        for (let i = 0; i < Math.min(size, 4096); i++) body[i] = rnd() & 255;
        for (const kind of ["requestBody", "responseBody"] as const) {
          const bin = toBinary(
            ProcessingRequestSchema,
            create(ProcessingRequestSchema, {
              request: { case: kind, value: create(HttpBodySchema, { body, endOfStream: eos }) },
              observabilityMode: obs,
            }),
          );
          same(bin);
          // As Envoy sends them: with an empty metadata_context (field 8, length 0).
          same(Buffer.concat([bin, Buffer.from([0x42, 0x00])]));
        }
      }
    }
  }
});

test("everything else goes to the generated decoder: headers, chunks with metadata, unknown fields", () => {
  const headers = create(HeaderMapSchema, {
    headers: [create(HeaderValueSchema, { key: ":path", rawValue: Buffer.from("/v1/chat/completions") })],
  });
  same(
    toBinary(
      ProcessingRequestSchema,
      create(ProcessingRequestSchema, {
        request: { case: "requestHeaders", value: create(HttpHeadersSchema, { headers, endOfStream: false }) },
      }),
    ),
  );
  same(
    toBinary(
      ProcessingRequestSchema,
      create(ProcessingRequestSchema, {
        request: { case: "requestBody", value: create(HttpBodySchema, { body: Buffer.from("{}"), endOfStream: true }) },
      }),
    ),
  );
  const withMeta = create(ProcessingRequestSchema, {
    request: {
      case: "responseBody",
      value: create(HttpBodySchema, { body: Buffer.from("data: x\n\n"), endOfStream: false }),
    },
    metadataContext: {
      filterMetadata: { "envoy.lb": { "x-gateway-destination-endpoint-served": "10.0.0.1:8000" } },
    } as never,
  });
  same(toBinary(ProcessingRequestSchema, withMeta));
  // An unknown HttpBody field (a newer Envoy) is kept by the generated decoder, so it goes there.
  const chunk = Buffer.from(
    toBinary(
      ProcessingRequestSchema,
      create(ProcessingRequestSchema, {
        request: {
          case: "responseBody",
          value: create(HttpBodySchema, { body: Buffer.from("ab"), endOfStream: true }),
        },
      }),
    ),
  );
  const inner = chunk.subarray(2);
  const extended = Buffer.concat([Buffer.from([0x2a, inner.length + 2]), inner, Buffer.from([0x18, 0x01])]);
  same(extended);
  // Truncated input fails as the generated decoder fails.
  assert.throws(() => decodeRequest(chunk.subarray(0, chunk.length - 1)));
});

test("constant replies are encoded once, as the generated encoder would", () => {
  const m = create(ProcessingResponseSchema, {
    response: {
      case: "responseBody",
      value: create(BodyResponseSchema, { response: create(CommonResponseSchema, {}) }),
    },
  });
  const c = constant(m);
  assert.equal(encodeResponse(c), encodeResponse(c), "the same buffer each time");
  assert.deepEqual(encodeResponse(c), Buffer.from(toBinary(ProcessingResponseSchema, m)));
  const other = create(ProcessingResponseSchema, {
    response: {
      case: "responseBody",
      value: create(BodyResponseSchema, { response: create(CommonResponseSchema, {}) }),
    },
  });
  assert.deepEqual(encodeResponse(other), Buffer.from(toBinary(ProcessingResponseSchema, other)));
});
