// What a user meets first, on the real entry point (cli/main.ts, as the image
// and `npx infera-gate` run it): a mistyped flag or command gets the nearest
// name suggested, each command's help shows how to run it with the one
// installed binary, and a cache-view of an unknown worker lists the known ids.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import { freePort, ROOT, startRouter, stopAll, entryArgs } from "../harness";

after(stopAll);

function cli(args: string[]) {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("INFERA_") && v !== undefined) env[k] = v;
  return spawnSync(process.execPath, [...entryArgs("cli/main.ts"), ...args], {
    cwd: ROOT,
    env,
    encoding: "utf8",
    timeout: 30000,
  });
}

test("a mistyped flag: one line naming the nearest flag, exit 2", () => {
  const r = cli(["router", "--worker", "127.0.0.1:1"]);
  assert.equal(r.status, 2);
  assert.equal(r.stderr, "infera-gate: unknown flag --worker; did you mean --workers? (see --help)\n");
  const b = cli(["bridge", "--nginx-push", "http://127.0.0.1:1"]);
  assert.equal(b.status, 2);
  assert.match(b.stderr, /did you mean --nginx-push-url\?/);
});

test("a mistyped command gets the nearest command suggested, then the usage; exit 2", () => {
  const r = cli(["brige"]);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /^infera-gate: unknown command 'brige'; did you mean 'bridge'\?\n/);
  assert.match(r.stderr, /usage: infera-gate \[router\|bridge\|relay\|register\|sim\] \[flags\]/);
  const far = cli(["zzzzzz"]);
  assert.equal(far.status, 2);
  assert.match(far.stderr, /^infera-gate: unknown command 'zzzzzz'\n/);
});

test("each command's --help has its own usage line, run through the one installed binary", () => {
  const want: Record<string, string> = {
    router: "usage: infera-gate [router] [flags]",
    bridge: "usage: infera-gate bridge [flags]",
    relay: "usage: infera-gate relay [flags] [zmq-endpoint nats-url subject]",
    register: "usage: infera-gate register [flags]",
    sim: "usage: infera-gate sim [flags]",
  };
  for (const [cmd, line] of Object.entries(want)) {
    const h = cli([cmd, "--help"]);
    assert.equal(h.status, 0, h.stderr);
    assert.ok(h.stdout.split("\n").includes(line), `${cmd}: ${h.stdout.split("\n").slice(0, 3).join(" | ")}`);
  }
});

test("GET /v1/admin/cache-view/<unknown> is a 404 that lists the known worker ids", async () => {
  const a = `127.0.0.1:${await freePort()}`;
  const b = `127.0.0.1:${await freePort()}`;
  const router = await startRouter(["--workers", `${a},${b}`, "--health-interval-ms", "0"]);
  const r = await fetch(`${router.admin}/v1/admin/cache-view/nope`);
  assert.equal(r.status, 404);
  const body = (await r.json()) as { error: { message: string; code: string } };
  assert.equal(body.error.message, `unknown worker 'nope' (known: ${a}, ${b})`);
  const ok = await fetch(`${router.admin}/v1/admin/cache-view/${encodeURIComponent(a)}`);
  assert.equal(ok.status, 200);
});
