// The njs module reads the coding agents' session headers too: real nginx
// (njs >= 0.8) fed by the bridge, two simulators, all on 127.0.0.1.
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
  Sim,
} from "../harness";
import { needs } from "../tools";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
after(stopAll);

test(
  "nginx: a Claude Code session's turns with different prompts stay on one worker, with no session header configured",
  { skip, timeout: 120000 },
  async () => {
    const sims: Sim[] = await Promise.all(["n0", "n1"].map((id) => startSim(id, ["--decode-ms-per-token", "1"])));
    const ng = await startNginx(n8!, { session_affinity: "prefill" });
    const admin = await freePort();
    await startBridge(["--workers", workerArg(sims), "--admin-port", String(admin)], `${ng.url}/_infera/push`);
    await waitFor("bridge ready", () => httpOk(`http://127.0.0.1:${admin}/readyz`), 15000);
    const view = async (s: Sim) =>
      ((await (await fetch(`${ng.url}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number })
        .block_count;
    const settled = () =>
      waitFor(
        "nginx mirrors the engines",
        async () => {
          for (const s of sims) if ((await view(s)) !== (await s.stats()).cached_blocks) return false;
          return true;
        },
        15000,
      );
    const h = { "X-Claude-Code-Session-Id": "njs-claude-secret-1" };
    const a = await chat(ng.url, longText("njs-sess-one", 300), { headers: h });
    assert.equal(a.status, 200);
    await settled();
    // Cold prompts: without the session each tie goes by a hash of its content
    // (the control shows some go elsewhere); with it, every turn stays.
    for (let k = 0; k < 3; k++) {
      const b = await chat(ng.url, longText("njs-sess-turn" + k, 300), { headers: h });
      assert.equal(b.status, 200);
      assert.equal(b.worker, a.worker, `the session's turn ${k + 2} moved`);
      await settled();
    }
    const control: string[] = [];
    for (let k = 0; k < 4; k++) {
      const c = await chat(ng.url, longText("njs-sess-control" + k, 300));
      control.push(c.worker!);
      await settled();
    }
    assert.ok(
      control.some((w) => w !== a.worker),
      `control: without the header cold prompts spread, not all to ${a.worker}: ${control}`,
    );
  },
);
