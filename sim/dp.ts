// A data-parallel engine: N simulated engines (ranks) behind one HTTP port, the
// way `vllm serve --data-parallel-size N` fronts N engine cores. A request's
// rank comes from the X-data-parallel-rank header (vLLM's), or with --engine
// sglang from the body's routed_dp_rank, else round-robin. Rank r publishes KV
// events on port + r (and replay on replay port + r), its batches tagged with r.
import * as http from "http";
import { EngineSim, SimOptions } from "./engine";

export interface DpSim {
  port: number;
  ranks: EngineSim[];
  stop(): Promise<void>;
}

export async function startDpSim(o: SimOptions): Promise<DpSim> {
  const ranks: EngineSim[] = [];
  for (let r = 0; r < o.dpSize; r++) {
    const e = new EngineSim({
      ...o,
      id: `${o.id}/dp${r}`,
      port: 0,
      dpSize: 1,
      dpRank: r,
      kvEventsPort: o.kvEventsPort === null ? null : o.kvEventsPort + r,
      kvReplayPort: o.kvReplayPort === null ? null : o.kvReplayPort + r,
      kvSnapshotPort: o.kvSnapshotPort == null ? null : o.kvSnapshotPort + r,
    });
    await e.start();
    ranks.push(e);
  }
  let rr = 0;
  const server = http.createServer((req, res) => {
    const url = new URL(req.url || "/", "http://x");
    if (req.method === "GET" && url.pathname === "/sim/stats" && !url.searchParams.has("rank")) {
      // Every rank's stats, and the fleet totals a single-engine caller reads.
      void Promise.all(
        ranks.map((e) =>
          fetch(`http://${o.host}:${e.o.port}/sim/stats`).then(
            (x) => x.json() as Promise<{ cached_blocks: number; requests: number }>,
          ),
        ),
      ).then((all) => {
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify({
            id: o.id,
            cached_blocks: all.reduce((a, s) => a + s.cached_blocks, 0),
            requests: all.reduce((a, s) => a + s.requests, 0),
            ranks: all,
          }),
        );
      });
      return;
    }
    if (req.method === "GET" && url.pathname === "/metrics") {
      // One page for every rank, as vLLM's API server shows its DP engines: each
      // series labelled engine="<rank>" (HELP and TYPE once per name).
      const seen = new Set<string>();
      res.setHeader("content-type", "text/plain; version=0.0.4");
      res.end(
        ranks
          .map((e) => e.metrics())
          .join("")
          .split("\n")
          .filter((line) => !line.startsWith("#") || (!seen.has(line) && seen.add(line)))
          .join("\n"),
      );
      return;
    }
    // vLLM reads the rank from the X-data-parallel-rank header; the sim's SGLang
    // mode from the body (routed_dp_rank, else the deprecated data_parallel_rank),
    // as SGLang's /generate does, so a test sees the body field arrive.
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      let asked = NaN;
      if (url.searchParams.has("rank")) asked = Number(url.searchParams.get("rank"));
      else if (o.engine === "sglang") {
        try {
          const j = body.length ? (JSON.parse(body.toString("utf8")) as Record<string, unknown>) : {};
          const v = j.routed_dp_rank ?? j.data_parallel_rank;
          if (typeof v === "number") asked = v;
        } catch {
          /* not JSON: round-robin */
        }
      } else if (req.headers["x-data-parallel-rank"] !== undefined) asked = Number(req.headers["x-data-parallel-rank"]);
      const rank = Number.isInteger(asked) && asked >= 0 && asked < ranks.length ? asked : rr++ % ranks.length;
      const path = url.pathname + (url.searchParams.has("rank") ? "" : url.search);
      const headers: http.OutgoingHttpHeaders = { ...req.headers, "content-length": String(body.length) };
      delete headers["transfer-encoding"];
      const up = http.request({ host: o.host, port: ranks[rank].o.port, method: req.method, path, headers }, (ur) => {
        res.writeHead(ur.statusCode || 502, { ...ur.headers, "x-sim-dp-rank": String(rank) });
        ur.pipe(res);
      });
      up.on("error", () => {
        if (!res.headersSent) res.writeHead(502);
        res.end();
      });
      up.end(body);
    });
  });
  server.keepAliveTimeout = 60000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  return {
    port: (server.address() as { port: number }).port,
    ranks,
    async stop() {
      await new Promise<void>((r) => server.close(() => r()));
      server.closeAllConnections?.();
      for (const e of ranks) await e.stop();
    },
  };
}

export async function dpMain(o: SimOptions): Promise<void> {
  const d = await startDpSim(o);
  process.stderr.write(
    `sim ${o.id} data-parallel-size=${o.dpSize} http=${o.host}:${d.port} kv-events=${o.kvEventsPort === null ? "off" : `tcp://${o.host}:${o.kvEventsPort}+rank`}\n`,
  );
  if (o.etcdEndpoint) {
    const { registerWorker } = await import("../runtime/etcd");
    const host = o.advertise ?? o.host;
    await registerWorker(
      o.etcdEndpoint,
      o.etcdPrefix,
      o.id,
      {
        address: `${host}:${d.port}`,
        role: o.role,
        block_size: o.blockSize,
        kv_events: o.kvEventsPort === null ? undefined : `tcp://${host}:${o.kvEventsPort}`,
        kv_replay: o.kvReplayPort === null ? undefined : `tcp://${host}:${o.kvReplayPort}`,
        dp_size: o.dpSize,
        dp_events: "port",
      },
      2,
    );
  }
  const stop = () => d.stop().then(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
