// NGINX with a dead worker: the bridge health-checks the workers as the
// router does and tells nginx, so with one of two workers killed nginx stops
// picking it within 3 s (at once when its KV event stream drops), no client
// request fails, not even in those 3 s (nginx retries a refused connection on
// the pick's second choice) nor for prompts cached on the dead worker, and the
// bridge's /readyz counts only workers that can take a pick.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  nginx08,
  startSim,
  startNginx,
  startBridge,
  workerArg,
  chat,
  longText,
  stopAll,
  waitFor,
  freePort,
  httpOk,
} from "../harness";
import { needs } from "../tools";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
after(stopAll);

test(
  "one of two workers killed: nginx stops picking it within 3 s and no request fails after; /readyz tells",
  { skip, timeout: 120000 },
  async () => {
    const sims = await Promise.all(["f0", "f1"].map((id) => startSim(id, ["--decode-ms-per-token", "1"])));
    const ng = await startNginx(n8!);
    const admin = await freePort();
    const bridge = await startBridge(
      ["--workers", workerArg(sims), "--admin-port", String(admin), "--health-interval-ms", "1000"],
      `${ng.url}/_infera/push`,
    );
    const readyz = async () =>
      (await (await fetch(`http://127.0.0.1:${admin}/readyz`)).json()) as {
        status: string;
        checks: { workers: { detail: string } };
      };
    await waitFor("bridge ready", () => httpOk(`http://127.0.0.1:${admin}/readyz`), 15000);
    assert.match((await readyz()).checks.workers.detail, /^2 of 2 worker\(s\) routable/);
    // Prompts that each end up cached on some worker, f0 included.
    const prompts = Array.from({ length: 8 }, (_, i) => longText(`fo${i}`, 300));
    const served: Record<string, number> = {};
    for (const p of prompts) {
      const r = await chat(ng.url, p);
      assert.equal(r.status, 200);
      served[r.worker!] = (served[r.worker!] ?? 0) + 1;
    }
    assert.ok(served[sims[0].id] > 0, `f0 served some: ${JSON.stringify(served)}`);
    const workers = async () =>
      (await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as { id: string; healthy: boolean }[];

    const t0 = Date.now();
    await sims[0].proc.kill("SIGKILL");
    // At once, before any health verdict: prompts cached on the dead worker
    // still get 200 (a refused connection goes to the pick's second choice).
    const early = await Promise.all(prompts.map((p) => chat(ng.url, p)));
    for (const r of early) {
      assert.equal(r.status, 200, `right after the kill: ${r.body.slice(0, 200)}`);
      assert.equal(r.worker, sims[1].id);
    }
    await waitFor(
      "nginx marks the dead worker unhealthy",
      async () => (await workers()).some((w) => w.id === sims[0].address && w.healthy === false),
      3000,
    ).catch(async (e) => {
      throw new Error(`${(e as Error).message}: ${JSON.stringify(await workers())}\n${bridge.log().slice(-3000)}`);
    });
    const outMs = Date.now() - t0;
    assert.ok(outMs <= 3000, `out after ${outMs} ms`);
    // Every prompt, those cached on the dead worker included, is served by the live one.
    for (let round = 0; round < 3; round++)
      for (const p of prompts) {
        const r = await chat(ng.url, p);
        assert.equal(r.status, 200, `round ${round}: ${r.body.slice(0, 200)}`);
        assert.equal(r.worker, sims[1].id);
      }
    const rz = await readyz();
    assert.equal(rz.status, "ready");
    assert.match(rz.checks.workers.detail, /^1 of 2 worker\(s\) routable/);
  },
);
