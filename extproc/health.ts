// gRPC health (grpc.health.v1.Health) on the ext_proc port, with the three
// service names the Endpoint Picker Protocol defines:
//   liveness                                   SERVING while the process answers
//   readiness                                  App.readiness(): discovery synced, a usable
//                                              worker, KV-event subscriptions open
//   envoy.service.ext_proc.v3.ExternalProcessor  same as readiness
//   ""                                         (the whole server) same as readiness
// Status is re-evaluated on a short timer so Watch streams see transitions.
import * as grpc from "@grpc/grpc-js";
import { HealthImplementation, ServingStatus } from "grpc-health-check";

export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";

export interface HealthSource {
  readiness(): { ready: boolean; reason: string };
  log(level: "debug" | "info" | "warn" | "error", line: string): void;
}

export function addHealth(server: grpc.Server, src: HealthSource, intervalMs = 250): { stop(): void; refresh(): void } {
  const impl = new HealthImplementation({ liveness: "SERVING", readiness: "NOT_SERVING", [EXT_PROC_SERVICE]: "NOT_SERVING", "": "NOT_SERVING" });
  impl.addToServer(server);
  let last: ServingStatus = "NOT_SERVING";
  let lastReason = "";
  let primed = false;
  const refresh = () => {
    const r = src.readiness();
    const s: ServingStatus = r.ready ? "SERVING" : "NOT_SERVING";
    // Not at the first evaluation: NOT_SERVING before discovery syncs is the expected start, not news.
    if (primed && (s !== last || (!r.ready && r.reason !== lastReason))) src.log(r.ready ? "info" : "warn", `readiness ${s}: ${r.reason}`);
    primed = true;
    last = s;
    lastReason = r.reason;
    impl.setStatus("readiness", s);
    impl.setStatus(EXT_PROC_SERVICE, s);
    impl.setStatus("", s);
  };
  refresh();
  const t = setInterval(refresh, intervalMs);
  t.unref();
  return { stop: () => clearInterval(t), refresh };
}
