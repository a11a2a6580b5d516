// test/tools.ts: a test whose tool is missing skips with the reason for a
// user, and fails the run under CI (CI=true or INFERA_REQUIRE_TOOLS=1). Runs a
// real node:test file in a child process each way.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { pythonMissing, binMissing } from "../tools";

const ROOT = path.resolve(__dirname, "../..");

function runProbe(env: NodeJS.ProcessEnv) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-tools-"));
  const file = path.join(dir, "probe.test.ts");
  fs.writeFileSync(
    file,
    `import { test } from "node:test";
import { needs, binMissing } from ${JSON.stringify(path.join(ROOT, "test", "tools"))};
test("needs a tool no machine has", { skip: needs(binMissing("infera-no-such-tool-x")) }, () => { throw new Error("ran without its tool"); });
test("needs nothing", { skip: needs(false) }, () => {});
`,
  );
  try {
    const clean: NodeJS.ProcessEnv = { ...process.env };
    delete clean.CI;
    delete clean.INFERA_REQUIRE_TOOLS;
    delete clean.INFERA_REQUIRE_DEPLOY_TOOLS;
    delete clean.NODE_TEST_CONTEXT; // else the child reports to this runner instead of printing TAP
    return spawnSync(process.execPath, ["--import", "tsx", "--test", "--test-reporter=tap", file], {
      cwd: ROOT,
      env: { ...clean, ...env },
      encoding: "utf8",
      timeout: 60000,
    });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

test("without CI a missing tool skips its test with the reason and the set-up command", () => {
  const r = runProbe({});
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /# SKIP infera-no-such-tool-x not installed \(bash scripts\/setup\.sh installs it\)/);
  assert.match(r.stdout, /^# pass 1$/m);
  assert.match(r.stdout, /^# fail 0$/m);
});

for (const env of [{ CI: "true" }, { INFERA_REQUIRE_TOOLS: "1" }]) {
  test(`with ${Object.keys(env)[0]} a missing tool fails the run, named`, () => {
    const r = runProbe(env);
    assert.notEqual(r.status, 0, r.stdout);
    assert.match(r.stdout, /not ok \d+ - required tool present: infera-no-such-tool-x not installed/);
    assert.match(r.stdout, /^# fail 1$/m);
    assert.doesNotMatch(r.stdout, /ran without its tool/);
  });
}

test("the probes tell present from missing", () => {
  assert.equal(binMissing("sh"), false);
  assert.equal(binMissing("infera-no-such-tool-x"), "infera-no-such-tool-x not installed");
  assert.equal(pythonMissing(["json"]), false);
  assert.match(
    pythonMissing(["infera_no_such_module"]) || "",
    /python3 cannot import infera_no_such_module .*ModuleNotFoundError/,
  );
});
