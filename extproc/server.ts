// Envoy ext_proc (envoy.service.ext_proc.v3.ExternalProcessor/Process): the
// gRPC server, its limits and its metrics. Each stream is a StreamProcessor
// (processor.ts: one method per ext_proc phase); what to do with a request is
// the director's decision (runtime/director.ts); encode.ts turns it into protobuf.
import * as fs from "fs";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
  ProcessingResponseSchema,
} from "./gen/envoy/service/ext_proc/v3/external_processor_pb";
import { DP_RANK_HEADER as DP_HEADER } from "../core/dprank";
import { App } from "../runtime/app";
import { addHealth } from "./health";
import { decodeRequest, encodeResponse } from "./wire";
import { GrpcServer } from "./grpc";
import { Counter, Gauge } from "prom-client";
import { spec } from "../runtime/metrics";
import { StreamProcessor } from "./processor";

export { outcomeOf, DEST_NAMESPACE, DEST_KEY, STREAM_KEY, LLMD_PREFILL_HEADER } from "../runtime/director";
export { isRoutingHeader, addPhaseHooks } from "./processor";
export type { StreamState, PhaseHooks } from "./processor";
export { subsetOf, SUBSET_NAMESPACE, SUBSET_KEY, SERVED_KEY } from "./encode";
/** Objective header the Inference Extension gateways pass (InferenceObjective name). */
export { OBJECTIVE_HEADER } from "../core/objectives";

/** vLLM's data-parallel rank request header (case-insensitive; SGLang's OpenAI routes honour it too). */
export const DP_RANK_HEADER = DP_HEADER;

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

export async function startExtProc(
  app: App,
  host: string,
  port: number,
): Promise<{ server: GrpcServer; port: number }> {
  // One per registry: a second server on the same App (tests) replaces the first's gauge.
  for (const n of ["infera_router_ext_proc_refused_streams_total", "infera_router_ext_proc_buffered_bytes"])
    app.metrics.registry.removeSingleMetric(n);
  const refusedStreams = new Counter({
    ...spec("infera_router_ext_proc_refused_streams_total"),
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
    ...spec("infera_router_ext_proc_buffered_bytes"),
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
    handler: (call) => new StreamProcessor(app, call),
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
