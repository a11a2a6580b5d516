// infera-gate ext_proc server entry point.
import { parseArgs } from "./config";
import { App, makeLogger } from "./app";
import { startExtProc } from "./server";
import { startAdmin } from "./admin";
import { startDiscovery } from "./discovery";

async function main(): Promise<void> {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`infera-gate: ${(e as Error).message}\n`);
    process.exit(2);
  }
  const log = makeLogger(opts.logLevel);
  let app: App;
  try {
    app = await App.create(opts, log);
  } catch (e) {
    process.stderr.write(`infera-gate: ${(e as Error).message}\n`);
    process.exit(2);
  }
  const discovery = await startDiscovery(app);
  app.startHealthChecks();
  app.startRenderProbes();
  const g = await startExtProc(app, opts.host, opts.extProcPort);
  const a = await startAdmin(app, opts.host, opts.adminPort);
  log("info", `ext_proc listening on ${opts.host}:${g.port}; admin on ${opts.host}:${a.port}; policy=${opts.router.policy} block_size=${opts.router.blockSize} tokenizer=${app.tokenizer?.source ?? "none"}`);
  const stop = async () => {
    log("info", "shutting down");
    g.server.forceShutdown();
    a.server.close();
    await discovery.close();
    await app.close();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
