// infera-gate ext_proc server entry point.
import { optionsFrom } from "../runtime/config";
import { App } from "../runtime/app";
import { startExtProc } from "../extproc/server";
import { startAdmin } from "../runtime/admin";
import { Discovery, startDiscovery } from "../runtime/discovery";
import { listenError, runCommand, version } from "../runtime/args";
import { makeLogger } from "../runtime/log";
import { drainGrpc } from "../runtime/drain";
import { CLOSE_BUDGET_MS, closeStep, onShutdown } from "../runtime/shutdown";

export async function startRouter(argv: string[]): Promise<void> {
  await runCommand("router", argv, async (p) => {
    const opts = optionsFrom(p.values, "router");
    const log = makeLogger(opts.logLevel, opts.logFormat, { component: "router" });
    const app = await App.create(opts, log);
    // Tokenizer threads load their vocabularies while the ports bind.
    void app.warmTokenizers();
    // Bind first: a busy port must fail fast with the flag named, before discovery starts.
    const a = await startAdmin(app, opts.host, opts.adminPort).catch((e) =>
      Promise.reject(listenError("--admin-port", opts.host, opts.adminPort, e)),
    );
    const g = await startExtProc(app, opts.host, opts.extProcPort).catch((e) =>
      Promise.reject(listenError("--ext-proc-port", opts.host, opts.extProcPort, e)),
    );
    // Health checks before discovery: every worker that joins is probed at once,
    // and readiness waits for a passed probe (App.readiness).
    app.startHealthChecks();
    app.startEngineMetrics();
    // Signals are handled from here on, discovery still starting included.
    let discovery: Discovery | null = null;
    // Bounded: the drain gets --drain-timeout-s, the close steps after it
    // CLOSE_BUDGET_MS between them, and the backstop ends the process past that.
    onShutdown(log, opts.drainTimeoutS * 1000 + CLOSE_BUDGET_MS + 1000, async (sig) => {
      // Not ready first, so health-checking load balancers stop sending, then
      // refuse new ext_proc streams while in-flight ones finish (bounded).
      app.draining = true;
      log("info", "draining", { signal: sig, drain_timeout_s: opts.drainTimeoutS });
      const r = await drainGrpc(g.server, opts.drainTimeoutS * 1000);
      log(r.forced ? "warn" : "info", r.forced ? "drain timeout: closing remaining streams" : "drained", {
        waited_ms: r.waitedMs,
      });
      a.server.close();
      const d = discovery;
      if (d) await closeStep(log, "discovery close", () => d.close(), CLOSE_BUDGET_MS / 2);
      await closeStep(log, "router close", () => app.close(), CLOSE_BUDGET_MS / 2);
    });
    discovery = await startDiscovery(app);
    app.startRenderProbes();
    log("info", "listening", {
      version: version(),
      ext_proc: `${opts.host}:${g.port}`,
      admin: `${opts.host}:${a.port}`,
      policy: opts.router.policy,
      block_size: opts.router.blockSize,
      tokenizer: app.tokenizer?.source ?? "none",
    });
  });
}

if (require.main === module) void startRouter(process.argv.slice(2));
