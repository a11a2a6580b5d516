// Issue 26 items 5/6 (KV event intake): duplicate worker ids, SGLang's
// BlockStoredWithMetadata, exact topics, exactly logged sequence numbers.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as path from "path";
import { oneLine } from "./helpers";
import { parseArgs } from "../../runtime/config";

const ROOT = path.resolve(__dirname, "../..");

function runCli(script: string, args: string[]) {
  const clean: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("INFERA_") && v !== undefined) clean[k] = v;
  return spawnSync(process.execPath, ["--import", "tsx", script, ...args], { cwd: ROOT, env: clean, encoding: "utf8", timeout: 30000 });
}

test("a worker id listed twice in --workers is refused at start: one line, exit 2 (router and bridge)", () => {
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1@tcp://127.0.0.1:5557,127.0.0.1:1@tcp://127.0.0.1:5999"], {}), /--workers: worker id '127.0.0.1:1' appears twice/);
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1,decode=127.0.0.1:1"], {}), /appears twice/, "a second role does not make a second worker");
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1/dp=2,127.0.0.1:1/dp=3"], {}), /worker id '127.0.0.1:1\/dp0' appears twice/, "DP rank targets too");
  assert.doesNotThrow(() => parseArgs(["--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/dp=2"], {}));
  oneLine(runCli("cli/router.ts", ["--workers", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:1", "--router-tokenizer-path", "none"]), /^infera-gate: --workers: worker id '127\.0\.0\.1:1' appears twice/);
  oneLine(runCli("njs/bridge.ts", ["--workers", "127.0.0.1:1,127.0.0.1:1", "--push-token", "t"]), /^infera-bridge: --workers: worker id '127\.0\.0\.1:1' appears twice/);
});
