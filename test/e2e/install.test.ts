// Production install: a clean copy of the repository, `npm ci --omit=dev`
// (no tsx, no TypeScript), then `npm start` runs compiled JavaScript.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { execFileSync, spawn, spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { ROOT, startSim, freePort, waitFor, fatal, httpOk, workerArg, stopAll } from "../harness";

after(stopAll);

test("npm ci --omit=dev && npm start works without dev dependencies", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-install-"));
  const files = execFileSync("git", ["ls-files", "-co", "--exclude-standard"], { cwd: ROOT, encoding: "utf8" })
    .split("\n")
    .filter((f) => f && !f.startsWith("test/") && !f.startsWith("bench/") && fs.existsSync(path.join(ROOT, f)));
  for (const f of files) {
    fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
    fs.copyFileSync(path.join(ROOT, f), path.join(dir, f));
  }
  const ci = spawnSync("npm", ["ci", "--omit=dev", "--no-audit", "--no-fund", "--prefer-offline"], {
    cwd: dir,
    encoding: "utf8",
    timeout: 300000,
  });
  assert.equal(ci.status, 0, ci.stderr);
  assert.ok(!fs.existsSync(path.join(dir, "node_modules", "tsx")), "tsx is not installed");
  assert.ok(!fs.existsSync(path.join(dir, "node_modules", "typescript")), "typescript is not installed");
  assert.ok(fs.existsSync(path.join(dir, "dist", "cli", "router.js")), "prepare compiled dist/");

  const v = spawnSync("npm", ["start", "-s", "--", "--version"], { cwd: dir, encoding: "utf8", timeout: 30000 });
  assert.equal(v.status, 0, v.stderr);
  assert.match(v.stdout, /^infera-gate \d+\.\d+\.\d+/);

  const sim = await startSim("inst0");
  const admin = await freePort();
  // What `npm start` runs, without npm in between so the test holds the router's own PID.
  const q = spawnRouter(dir, [
    "--workers",
    workerArg([sim]),
    "--ext-proc-port",
    String(await freePort()),
    "--admin-port",
    String(admin),
  ]);
  try {
    await waitFor(
      "installed router ready",
      async () => {
        if (q.exitCode !== null) throw fatal(`installed router exited ${q.exitCode}: ${out}`);
        return httpOk(`http://127.0.0.1:${admin}/readyz`);
      },
      60000,
    );
    const ws = (await (await fetch(`http://127.0.0.1:${admin}/v1/admin/workers`)).json()) as { id: string }[];
    assert.deepEqual(
      ws.map((w) => w.id),
      [sim.address],
    );
    // The simulator runs from dist/ too, in process through the shared CLI. It and data
    // parallelism are lazy import()s, which esbuild must turn into require for CommonJS
    // (an extension-less import() path does not resolve; etcd/k8s/NATS load the same way).
    const h = spawnSync(process.execPath, ["dist/cli/main.js", "sim", "--help"], {
      cwd: dir,
      encoding: "utf8",
      timeout: 30000,
    });
    assert.equal(h.status, 0, h.stderr);
    assert.match(h.stdout, /^infera-sim .*\n[\s\S]*--data-parallel-size N/);
    const simPort = await freePort();
    const s = spawn(
      process.execPath,
      [
        "dist/cli/main.js",
        "sim",
        "--id",
        "dist-sim",
        "--port",
        String(simPort),
        "--kv-events-port",
        "none",
        "--tokenizer-path",
        "none",
        "--data-parallel-size",
        "2",
      ],
      { cwd: dir, stdio: ["ignore", "ignore", "pipe"] },
    );
    let serr = "";
    s.stderr!.on("data", (d: Buffer) => (serr += d.toString()));
    try {
      await waitFor("installed sim ready", async () => {
        if (s.exitCode !== null) throw fatal(`installed sim exited ${s.exitCode}: ${serr}`);
        return httpOk(`http://127.0.0.1:${simPort}/health`);
      });
      const st = (await (await fetch(`http://127.0.0.1:${simPort}/sim/stats`)).json()) as {
        id: string;
        ranks: unknown[];
      };
      assert.equal(st.id, "dist-sim");
      assert.equal(st.ranks.length, 2);
    } finally {
      s.kill("SIGTERM");
    }
  } finally {
    q.kill("SIGTERM");
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

let out = "";
function spawnRouter(cwd: string, args: string[]) {
  const c = spawn(process.execPath, ["dist/cli/main.js", "router", ...args], {
    cwd,
    stdio: ["ignore", "pipe", "pipe"],
  });
  c.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  return c;
}
