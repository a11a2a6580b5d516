// The floor of Envoy's ext_proc path on this machine: an ext_proc server that
// does no work at all. Plain node:http2 with gRPC framing by hand (no grpc-js),
// in its own process like the router, answering every message at once; the
// request body's answer names a fixed upstream the way the router names its
// pick (envoy.lb metadata plus the header: Envoy re-resolves the route only
// after a header mutation). bench/overhead.ts puts it beside the router, so the
// router's own share of the added latency is the difference between the two.
// Usage: node --import tsx bench/null-processor.ts PORT UPSTREAM_HOST:PORT
import * as http2 from "http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  BodyResponseSchema,
  CommonResponseSchema,
  HeaderMutationSchema,
  HeadersResponseSchema,
  ProcessingRequestSchema,
  ProcessingResponse,
  ProcessingResponseSchema,
  TrailersResponseSchema,
} from "../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderValueOptionSchema, HeaderValueSchema } from "../extproc/gen/envoy/config/core/v3/base_pb";

const [port, upstream] = [Number(process.argv[2]), process.argv[3]];
const DEST = "x-gateway-destination-endpoint";

const frame = (m: ProcessingResponse): Buffer => {
  const b = toBinary(ProcessingResponseSchema, m);
  const f = Buffer.alloc(5 + b.length);
  f.writeUInt32BE(b.length, 1);
  f.set(b, 5);
  return f;
};
// Every answer is constant, so each is encoded once.
const headersOk = frame(
  create(ProcessingResponseSchema, { response: { case: "requestHeaders", value: create(HeadersResponseSchema, {}) } }),
);
const pick = frame(
  create(ProcessingResponseSchema, {
    response: {
      case: "requestBody",
      value: create(BodyResponseSchema, {
        response: create(CommonResponseSchema, {
          clearRouteCache: true,
          headerMutation: create(HeaderMutationSchema, {
            setHeaders: [
              create(HeaderValueOptionSchema, {
                header: create(HeaderValueSchema, { key: DEST, rawValue: Buffer.from(upstream) }),
              }),
            ],
          }),
        }),
      }),
    },
    dynamicMetadata: { "envoy.lb": { [DEST]: upstream } },
  }),
);
const chunkOk = frame(
  create(ProcessingResponseSchema, { response: { case: "responseBody", value: create(BodyResponseSchema, {}) } }),
);
const trailersOk = frame(
  create(ProcessingResponseSchema, {
    response: { case: "requestTrailers", value: create(TrailersResponseSchema, {}) },
  }),
);

const server = http2.createServer();
server.on("stream", (stream) => {
  stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
  stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
  stream.on("error", () => undefined);
  let buf: Buffer = Buffer.alloc(0);
  stream.on("data", (d: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, d]) : d;
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const n = buf.readUInt32BE(1);
      const m = fromBinary(ProcessingRequestSchema, buf.subarray(5, 5 + n));
      buf = buf.subarray(5 + n);
      const c = m.request.case;
      const out =
        c === "requestHeaders"
          ? headersOk
          : c === "requestBody"
            ? pick
            : c === "responseBody"
              ? chunkOk
              : c === "requestTrailers"
                ? trailersOk
                : null;
      if (out) stream.write(out);
    }
  });
  stream.on("end", () => stream.end());
});
server.listen(port, "127.0.0.1", () => console.log(`null ext_proc processor on 127.0.0.1:${port} -> ${upstream}`));
