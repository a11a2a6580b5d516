// Admin/metrics HTTP: /metrics, /v1/admin/cache-view/<worker>, /v1/admin/workers, /healthz.
import * as http from "http";
import { App } from "./app";
import { workerRow } from "../core/views";

function json(res: http.ServerResponse, status: number, body: unknown): void {
  const b = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(b) });
  res.end(b);
}

export function startAdmin(app: App, host: string, port: number): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url || "/", "http://x");
      const p = url.pathname;
      if (req.method !== "GET") return json(res, 405, { error: "method not allowed" });
      if (p === "/metrics") {
        const body = await app.metrics.registry.metrics();
        res.writeHead(200, { "content-type": app.metrics.registry.contentType });
        return res.end(body);
      }
      if (p === "/healthz") return json(res, 200, { status: "ok", workers: app.router.workers().length });
      const m = /^\/v1\/admin\/cache-view\/(.+)$/.exec(p);
      if (m) {
        const id = decodeURIComponent(m[1]);
        const v = app.router.cacheView(id);
        return v ? json(res, 200, v) : json(res, 404, { error: `unknown worker '${id}'` });
      }
      if (p === "/v1/admin/workers")
        return json(
          res,
          200,
          app.router.workers().map((w) => ({
            ...workerRow(app.router, w),
            models: app.models.get(w.id),
            render_parity: app.probes ? app.probes.state(w.id) : { status: "unchecked", checked_at: null, reason: "--render-probe-api off" },
          })),
        );
      if (p === "/v1/admin/reservations") return json(res, 200, { open_guards: app.router.openGuards() });
      return json(res, 404, { error: "not found" });
    } catch (e) {
      json(res, 500, { error: (e as Error).message });
    }
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve({ server, port: (server.address() as { port: number }).port }));
  });
}
