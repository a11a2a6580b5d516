// Admin/metrics HTTP: /metrics, /v1/admin/cache-view/<worker>, /v1/admin/workers,
// /livez (the process answers), /readyz (it can route; see App.readiness; its
// body's `degraded` lists what is impaired while routing goes on, e.g. discovery
// on the cached fleet during an etcd outage), and /healthz, kept as an alias of /readyz.
import * as fs from "fs";
import * as http from "http";
import * as https from "https";
import { App } from "./app";
import { unknownWorker, workerRow } from "../core/views";
import { sameSecret } from "../core/util";

function fail(res: http.ServerResponse, status: number, message: string, type: string): void {
  json(res, status, { error: { message, type, code: status } });
}

function json(res: http.ServerResponse, status: number, body: unknown): void {
  const b = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(b) });
  res.end(b);
}

/** Probes stay open (kubelet, load balancers); everything else wants the bearer token when one is set. */
const OPEN_PATHS: { [p: string]: boolean } = { "/livez": true, "/readyz": true, "/healthz": true };

export function startAdmin(app: App, host: string, port: number): Promise<{ server: http.Server; port: number }> {
  const handler = async (req: http.IncomingMessage, res: http.ServerResponse) => {
    try {
      const url = new URL(req.url || "/", "http://x");
      const p = url.pathname;
      if (req.method !== "GET") return fail(res, 405, "method not allowed", "invalid_request_error");
      const token = app.opts.adminToken;
      if (token && !OPEN_PATHS[p]) {
        const auth = String(req.headers.authorization || "");
        const given = auth.startsWith("Bearer ") ? auth.slice(7) : "";
        if (!sameSecret(given, token)) {
          res.setHeader("www-authenticate", 'Bearer realm="infera-gate admin"');
          return fail(res, 401, "admin endpoints need Authorization: Bearer <--admin-token>", "authentication_error");
        }
      }
      if (p === "/metrics") {
        const body = await app.metrics.registry.metrics();
        res.writeHead(200, { "content-type": app.metrics.registry.contentType });
        return res.end(body);
      }
      if (p === "/livez") return json(res, 200, { status: "alive" });
      if (p === "/readyz" || p === "/healthz") {
        const r = app.readiness();
        // 200 = can route; degraded names what is impaired while it still routes (discovery on its cached fleet).
        return json(res, r.ready ? 200 : 503, {
          status: r.ready ? "ready" : "not_ready",
          degraded: r.degraded,
          checks: r.checks,
        });
      }
      const m = /^\/v1\/admin\/cache-view\/(.+)$/.exec(p);
      if (m) {
        const id = decodeURIComponent(m[1]);
        const v = app.router.cacheView(id);
        return v ? json(res, 200, v) : fail(res, 404, unknownWorker(app.router, id), "not_found");
      }
      if (p === "/v1/admin/workers")
        return json(
          res,
          200,
          app.router.workers().map((w) => ({
            ...workerRow(app.router, w),
            models: app.models.get(w.id),
            render_parity: app.probes
              ? app.probes.state(w.id)
              : { status: "unchecked", checked_at: null, reason: "--render-probe-api off" },
            ...app.eventStatus(w.id),
          })),
        );
      if (p === "/v1/admin/reservations") return json(res, 200, { open_guards: app.router.openGuards() });
      return fail(res, 404, "not found", "not_found");
    } catch (e) {
      fail(res, 500, (e as Error).message, "internal_error");
    }
  };
  const tls = app.opts.adminTls;
  const server: http.Server = tls
    ? (https.createServer(
        { cert: fs.readFileSync(tls.cert), key: fs.readFileSync(tls.key) },
        handler,
      ) as unknown as http.Server)
    : http.createServer(handler);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve({ server, port: (server.address() as { port: number }).port }));
  });
}
