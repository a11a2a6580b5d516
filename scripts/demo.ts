// npm run demo: three engine simulators, the ext_proc router and real Envoy on
// 127.0.0.1, then a few requests that show cache-aware routing. Ctrl-C stops all.
import { startSim, startRouter, startEnvoy, workerArg, chat, longText, stopAll, waitFor } from "../test/harness";

async function main(): Promise<void> {
  process.stdout.write("starting 3 simulators, the router and Envoy...\n");
  const sims = await Promise.all(["sim0", "sim1", "sim2"].map((id) => startSim(id, ["--prefill-us-per-token", "150"])));
  const router = await startRouter(["--workers", workerArg(sims)]);
  const envoy = await startEnvoy(router.grpcPort);
  const doc = longText("demo", 300);
  for (const q of ["What is this about?", "Summarize it.", "List three facts."]) {
    const r = await chat(envoy.url, `${doc}\n\n${q}`);
    process.stdout.write(
      `  ${q.padEnd(22)} -> ${r.worker}  TTFT ${r.ttftMs.toFixed(0).padStart(4)} ms  cached ${r.cachedTokens} tokens\n`,
    );
    const s = sims.find((x) => x.id === r.worker)!;
    await waitFor(
      "events",
      async () => (await router.cacheView(s.address)).block_count === (await s.stats()).cached_blocks,
    );
  }
  process.stdout.write(`
Envoy:   ${envoy.url}   (try it)
  curl -N ${envoy.url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim","stream":true,"messages":[{"role":"user","content":"hello"}]}'
Metrics: ${router.admin}/metrics
Cache:   ${router.admin}/v1/admin/cache-view/${sims[0].address}
Ctrl-C to stop.
`);
  const stop = () => stopAll().then(() => process.exit(0));
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
  if (process.env.INFERA_DEMO_EXIT) await stop();
}

main().catch(async (e) => {
  process.stderr.write(`demo failed: ${e.message}\n`);
  await stopAll();
  process.exit(1);
});
