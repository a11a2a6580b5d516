// The ext_proc protocol tests' shared setup: the real App and gRPC server over
// a static fleet with no KV event source, and a gRPC client playing Envoy's
// part (same service path and messages) so message order can be driven exactly.
import * as assert from "node:assert/strict";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import { App } from "../runtime/app";
import { parseArgs } from "../runtime/config";
import { ExtProcService, startExtProc } from "../extproc/server";
import {
  HttpBodySchema,
  HttpHeadersSchema,
  ProcessingRequest,
  ProcessingRequestSchema,
  ProcessingResponse,
} from "../extproc/gen/envoy/service/ext_proc/v3/external_processor_pb";
import { HeaderMapSchema, HeaderValueSchema } from "../extproc/gen/envoy/config/core/v3/base_pb";

export interface ExtProcFixture {
  app: App;
  port: number;
  client: grpc.Client;
  close(): Promise<void>;
}

/** An App from router flags (--workers ...) serving ext_proc on a free loopback port; synced: discovery counts as done. */
export async function startExtProcFixture(args: string[], opts: { synced?: boolean } = {}): Promise<ExtProcFixture> {
  const app = new App(parseArgs(args, {}), () => undefined, {
    subscribe: () => ({ close() {} }),
    close: async () => undefined,
  });
  app.setWorkers(app.opts.workers);
  if (opts.synced) app.setSynced(true);
  const s = await startExtProc(app, "127.0.0.1", 0);
  const client = new grpc.Client(`127.0.0.1:${s.port}`, grpc.credentials.createInsecure());
  return {
    app,
    port: s.port,
    client,
    async close() {
      client.close();
      s.server.forceShutdown();
      await app.close();
    },
  };
}

export const hdrs = (pairs: Record<string, string>) =>
  create(HeaderMapSchema, {
    headers: Object.entries(pairs).map(([key, v]) => create(HeaderValueSchema, { key, rawValue: Buffer.from(v) })),
  });

// Envoy's messages for one HTTP exchange, as a BUFFERED request and STREAMED response send them.
export const reqHeaders = (
  path: string,
  method = "POST",
  eos = false,
  extra: Record<string, string> = {},
): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: {
      case: "requestHeaders",
      value: create(HttpHeadersSchema, {
        headers: hdrs({ ":path": path, ":method": method, ...extra }),
        endOfStream: eos,
      }),
    },
  });
export const reqBody = (body: string): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: { case: "requestBody", value: create(HttpBodySchema, { body: Buffer.from(body), endOfStream: true }) },
  });
export const respHeaders = (): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: { case: "responseHeaders", value: create(HttpHeadersSchema, { headers: hdrs({ ":status": "200" }) }) },
  });
export const respBody = (eos: boolean): ProcessingRequest =>
  create(ProcessingRequestSchema, {
    request: {
      case: "responseBody",
      value: create(HttpBodySchema, { body: Buffer.from("data: x\n\n"), endOfStream: eos }),
    },
  });

/**
 * One Process call. got holds every answer in order; next() hands them out one
 * at a time (waiting for the next); wait(n) expects exactly n answers within 2 s.
 */
export function processStream(client: grpc.Client) {
  const def = ExtProcService.Process;
  const call = client.makeBidiStreamRequest(
    def.path,
    def.requestSerialize,
    def.responseDeserialize,
  ) as grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
  const got: ProcessingResponse[] = [];
  let read = 0;
  let wake: (() => void)[] = [];
  call.on("data", (m: ProcessingResponse) => {
    got.push(m);
    const w = wake;
    wake = [];
    for (const f of w) f();
  });
  call.on("error", () => undefined);
  return {
    call,
    got,
    send: (m: ProcessingRequest) => call.write(m),
    next: async (): Promise<ProcessingResponse> => {
      while (read >= got.length) await new Promise<void>((r) => wake.push(r));
      return got[read++];
    },
    wait: async (n: number) => {
      for (let i = 0; i < 200 && got.length < n; i++) await new Promise((r) => setTimeout(r, 10));
      assert.equal(got.length, n, `responses: ${got.map((g) => g.response.case).join(",")}`);
    },
  };
}
