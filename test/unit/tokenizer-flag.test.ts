// Issue 26: a tokenizer the operator named that cannot be loaded is a flag
// error like any other: one line naming the flag, exit 2 (it exited 1).
import { test } from "node:test";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { ROOT, entryArgs } from "../harness";
import { oneLine } from "./helpers";

function runCli(script: string, args: string[]) {
  const clean: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("INFERA_") && v !== undefined) clean[k] = v;
  return spawnSync(process.execPath, [...entryArgs(script), ...args], {
    cwd: ROOT,
    env: clean,
    encoding: "utf8",
    timeout: 30000,
  });
}

test("a missing or unreadable tokenizer: one line naming the flag, exit 2 (router, per-model form, simulator)", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-tok-"));
  const missing = path.join(dir, "missing");
  const base = ["--workers", "127.0.0.1:1", "--health-interval-ms", "0", "--admin-port", "0", "--ext-proc-port", "0"];
  oneLine(
    runCli("cli/main.ts", ["router", ...base, "--router-tokenizer-path", missing]),
    /^infera-gate: --router-tokenizer-path: no tokenizer.json at .*missing/,
  );
  oneLine(
    runCli("cli/router.ts", [...base, "--router-tokenizer-path", `m1=${missing}`]),
    /^infera-gate: --router-tokenizer-path: no tokenizer.json at .*missing/,
  );
  const bad = path.join(dir, "bad");
  fs.mkdirSync(bad);
  fs.writeFileSync(path.join(bad, "tokenizer.json"), "{not json");
  oneLine(
    runCli("cli/router.ts", [...base, "--router-tokenizer-path", bad]),
    /^infera-gate: --router-tokenizer-path .*bad: .*JSON/,
  );
  oneLine(
    runCli("sim/engine.ts", ["--port", "0", "--tokenizer-path", missing]),
    /^infera-sim: --tokenizer-path .*missing: no tokenizer.json at/,
  );
});
