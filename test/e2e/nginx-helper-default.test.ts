// The shipped config's tokenizer-helper threshold, through real nginx (njs
// 0.8) and the bridge: a prompt of a few hundred tokens already goes to the
// helper (the bridge counts it), a short one is tokenized in njs. Below about
// 512 estimated tokens njs's own BPE is as fast as the helper's round trip;
// above it, tokenizing in njs added a fixed 10-40 ms per request on the nginx
// worker (docs/benchmarks/2026-12-06-nginx-row.md).
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { ROOT, freePort, nginx08, startSim, stopAll, waitFor, workerArg } from "../harness";
import { startBridgeAt, startNginx1, freeEngineArgs } from "../nginx-stack";
import { needs } from "../tools";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");

after(stopAll);

async function helperCount(adminPort: number): Promise<number> {
  const m = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text();
  return Number(/infera_bridge_tokenize_requests_total\{result="ok"\} (\d+)/.exec(m)?.[1] ?? 0);
}

/** English words, `bytes` long: bytes/4 is nginx's token estimate. */
function prose(seed: string, bytes: number): string {
  const words = "the of and to in is that for it as was with be by on not he this are or his from at".split(" ");
  let s = seed;
  for (let i = 0; s.length < bytes && i < 100000; i++) s += " " + words[(i * 7) % words.length];
  return s.slice(0, bytes);
}

test(
  "shipped threshold: a 600-token prompt goes to the tokenizer helper, a 60-token one stays in njs",
  { skip },
  async () => {
    const sim = await startSim("hd0", freeEngineArgs(100000));
    const port = await freePort();
    // Only the helper's address is set (tests point it at a free port); the threshold is the shipped one.
    const ng = await startNginx1(n8!, { tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize` });
    const br = await startBridgeAt(workerArg([sim]), `${ng.url}/_infera/push`, port);
    await waitFor(
      "fleet",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 1,
    );
    const send = async (content: string) => {
      const r = await fetch(`${ng.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content }], max_tokens: 2 }),
      });
      await r.text();
      assert.equal(r.status, 200);
    };
    const c0 = await helperCount(br.adminPort);
    await send(prose("short", 240));
    assert.equal(await helperCount(br.adminPort), c0, "a 60-token prompt is tokenized in njs");
    await send(prose("medium", 2400));
    assert.equal(await helperCount(br.adminPort), c0 + 1, "a 600-token prompt goes to the helper");
  },
);
