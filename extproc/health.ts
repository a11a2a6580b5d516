// gRPC health (grpc.health.v1.Health) on the ext_proc port, with the three
// service names the Endpoint Picker Protocol defines:
//   liveness                                   SERVING while the process answers
//   readiness                                  App.readiness(), "can route": discovery has
//                                              delivered its first view, a worker that passed
//                                              a health check, KV-event subscriptions open.
//                                              Discovery lost later (etcd down) stays SERVING:
//                                              routing goes on on the cached fleet (/readyz's
//                                              body reports it as degraded)
//   envoy.service.ext_proc.v3.ExternalProcessor  same as readiness
//   ""                                         (the whole server) same as readiness
// Status is re-evaluated on a short timer so Watch streams see transitions.
import { Call, GrpcServer, Status } from "./grpc";
import { varint } from "./wire";

export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";

export interface HealthSource {
  readiness(): { ready: boolean; reason: string };
  log(level: "debug" | "info" | "warn" | "error", line: string): void;
}

// grpc.health.v1.HealthCheckResponse.ServingStatus
type ServingStatus = "SERVING" | "NOT_SERVING" | "SERVICE_UNKNOWN";
const CODE: Record<ServingStatus, number> = { SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 };

/** HealthCheckRequest{string service = 1}: the service name; other fields are skipped. */
export function decodeHealthRequest(b: Uint8Array): string {
  let pos = 0;
  let service = "";
  const next = (): number => {
    const v = varint(b, pos);
    if (!v) throw new Error("truncated or oversized varint");
    pos = v[1];
    return v[0];
  };
  while (pos < b.length) {
    const tag = next();
    const wt = tag & 7;
    if (wt === 0) next();
    else if (wt === 2) {
      const n = next();
      if (pos + n > b.length) throw new Error("truncated field");
      if (tag >>> 3 === 1) service = Buffer.from(b.subarray(pos, pos + n)).toString("utf8");
      pos += n;
    } else if (wt === 1) pos += 8;
    else if (wt === 5) pos += 4;
    else throw new Error(`wire type ${wt}`);
  }
  return service;
}

/** HealthCheckResponse{ServingStatus status = 1}. */
const encodeHealthResponse = (s: ServingStatus): Uint8Array => Uint8Array.of(0x08, CODE[s]);

export function addHealth(server: GrpcServer, src: HealthSource, intervalMs = 250): { stop(): void; refresh(): void } {
  const status: Record<string, ServingStatus> = {
    liveness: "SERVING",
    readiness: "NOT_SERVING",
    [EXT_PROC_SERVICE]: "NOT_SERVING",
    "": "NOT_SERVING",
  };
  type Watch = { service: string; last: ServingStatus | null; call: Call<string, ServingStatus> };
  const watchers = new Set<Watch>();
  const tell = (w: Watch) => {
    const s = status[w.service] ?? "SERVICE_UNKNOWN";
    if (s !== w.last) {
      w.last = s;
      w.call.write(s);
    }
  };
  server.add<string, ServingStatus>("/grpc.health.v1.Health/Check", {
    decode: decodeHealthRequest,
    encode: encodeHealthResponse,
    handler(call) {
      call.on("data", (service) => {
        // Fresh at each Check: a gateway's first probe often lands within the
        // refresh period after start, and Envoy then waits its no-traffic
        // interval (60 s by default) before asking again.
        refresh();
        const s = status[service];
        if (!s) return call.fail(Status.NOT_FOUND, `unknown service ${JSON.stringify(service)}`);
        call.write(s);
        call.end();
      });
    },
  });
  server.add<string, ServingStatus>("/grpc.health.v1.Health/Watch", {
    decode: decodeHealthRequest,
    encode: encodeHealthResponse,
    handler(call) {
      call.on("data", (service) => {
        const w: Watch = { service, last: null, call };
        watchers.add(w);
        call.on("close", () => watchers.delete(w));
        tell(w);
      });
    },
  });
  let last: ServingStatus = "NOT_SERVING";
  let lastReason = "";
  let primed = false;
  const refresh = () => {
    const r = src.readiness();
    const s: ServingStatus = r.ready ? "SERVING" : "NOT_SERVING";
    // Not at the first evaluation: NOT_SERVING before discovery syncs is the expected start, not news.
    if (primed && (s !== last || (!r.ready && r.reason !== lastReason)))
      src.log(r.ready ? "info" : "warn", `readiness ${s}: ${r.reason}`);
    primed = true;
    last = s;
    lastReason = r.reason;
    status.readiness = s;
    status[EXT_PROC_SERVICE] = s;
    status[""] = s;
    for (const w of watchers) tell(w);
  };
  refresh();
  const t = setInterval(refresh, intervalMs);
  t.unref();
  return { stop: () => clearInterval(t), refresh };
}
