// Graceful drain of the gRPC ext_proc server: tryShutdown stops the listener
// and sends GOAWAY on every connection, so Envoy opens no new streams here,
// while streams already open (requests being answered) run to their end. After
// the timeout whatever is left is cut.
export function drainGrpc(
  server: { tryShutdown(cb: () => void): void; forceShutdown(): void },
  timeoutMs: number,
): Promise<{ forced: boolean; waitedMs: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    let done = false;
    const finish = (forced: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (forced) server.forceShutdown();
      resolve({ forced, waitedMs: Date.now() - t0 });
    };
    const timer = setTimeout(() => finish(true), timeoutMs);
    server.tryShutdown(() => finish(false));
  });
}
