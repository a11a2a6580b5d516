// Issue 8 item 2: a 20 s etcd outage. The router keeps its last known fleet
// (ready meanwhile, discovery reported degraded: issue 26), re-lists when etcd returns, and
// neither the router nor the registrants (the simulator's registration and
// `npm run register`) log a line per retry or grow a lease/grant loop per
// failed attempt.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import { spawnSync } from "child_process";
import { startEtcd, startSim, startRouter, run, stopAll, waitFor, sleep, fatal, entryArgs } from "../harness";
import { needs } from "../tools";

const has = (bin: string) => spawnSync("sh", ["-c", `command -v ${bin}`]).status === 0;
after(stopAll);

const rssKb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0);
// etcd's JSON gateway (no etcdctl needed).
const leases = async (endpoint: string) =>
  (
    (
      (await (await fetch(`${endpoint}/v3/lease/leases`, { method: "POST", body: "{}" })).json()) as {
        leases?: unknown[];
      }
    ).leases ?? []
  ).length;

test(
  "a 20 s etcd outage: last fleet kept, re-listed on return, registrants neither leak nor spam",
  { skip: needs(!has("etcd") && "etcd not installed"), timeout: 180000 },
  async () => {
    const etcd = await startEtcd();
    const s0 = await startSim("h0", ["--etcd-endpoint", etcd.endpoint]);
    const s1 = await startSim("h1");
    const reg = run("register-h1", process.execPath, [
      ...entryArgs("cli/register.ts"),
      "--etcd-endpoint",
      etcd.endpoint,
      "--id",
      "h1",
      "--address",
      s1.address,
      "--kv-events",
      s1.events,
      "--ttl",
      "2",
      "--log-format",
      "text",
    ]);
    const router = await startRouter([
      "--discovery-backend",
      "etcd",
      "--etcd-endpoint",
      etcd.endpoint,
      "--health-interval-ms",
      "200",
      "--router-tokenizer-path",
      "none",
      "--log-format",
      "text",
    ]);
    const ids = async () =>
      (await router.workers())
        .map((w) => w.id)
        .sort()
        .join();
    await waitFor("both workers from etcd", async () => (await ids()) === "h0,h1", 15000);
    await waitFor("ready", async () => (await fetch(`${router.admin}/readyz`)).status === 200, 10000);
    await sleep(1000);
    const rss0 = rssKb(reg.child.pid!);
    const logLen = { router: router.proc.log().length, reg: reg.log().length, sim: s0.proc.log().length };

    await etcd.proc.kill("SIGKILL");
    const t0 = Date.now();
    let sawDegraded = false;
    while (Date.now() - t0 < 20000) {
      assert.equal(await ids(), "h0,h1", "the last known fleet is kept during the outage");
      // Still routing on that fleet: ready (issue 26), with discovery reported degraded.
      const r = await fetch(`${router.admin}/readyz`);
      assert.equal(r.status, 200, "ready while it routes on the last known fleet");
      const b = (await r.json()) as { degraded: string[]; checks: { discovery: { ok: boolean } } };
      if (!b.checks.discovery.ok && b.degraded.includes("discovery")) sawDegraded = true;
      await sleep(1000);
    }
    assert.ok(sawDegraded, "readiness reports discovery degraded");
    // Backoff + state-change logging: a handful of lines for 20 s, not one per 500 ms.
    const lines = (s: string) => s.split("\n").filter((l) => /etcd/i.test(l));
    const routerLines = lines(router.proc.log().slice(logLen.router));
    assert.ok(
      routerLines.length <= 3,
      `router etcd lines during the outage: ${routerLines.length}\n${routerLines.join("\n")}`,
    );
    const regLines = lines(reg.log().slice(logLen.reg));
    assert.ok(regLines.length <= 3, `register lines during the outage: ${regLines.length}\n${regLines.join("\n")}`);
    const simLines = lines(s0.proc.log().slice(logLen.sim));
    assert.ok(
      simLines.length <= 3,
      `simulator registration lines during the outage: ${simLines.length}\n${simLines.join("\n")}`,
    );
    const rss1 = rssKb(reg.child.pid!);
    assert.ok(rss1 - rss0 < 30000, `register RSS grew ${rss0} -> ${rss1} kB over the outage`);

    const etcd2 = await startEtcd(etcd.dataDir, etcd.ports);
    await waitFor(
      "discovery back after etcd returns",
      async () =>
        ((await (await fetch(`${router.admin}/readyz`)).json()) as { degraded: string[] }).degraded.length === 0,
      30000,
    );
    // Old leases expire (TTL 2 s) and the registrants' new ones take over: the fleet must stay whole through that.
    const t1 = Date.now();
    while (Date.now() - t1 < 8000) {
      const cur = await ids();
      // On failure, say which registrant was late: their logs and the router's.
      if (!(cur === "h0,h1" || cur === "h0" || cur === "h1"))
        assert.fail(
          `fleet after return: '${cur}' at ${Date.now() - t1} ms\nregister h1:\n${reg.log().slice(-1500)}\nsim h0:\n${s0.proc.log().slice(-1500)}\nrouter:\n${router.proc.log().slice(-2500)}`,
        );
      await sleep(250);
    }
    await waitFor("both registered after the outage", async () => (await ids()) === "h0,h1", 15000);
    await waitFor("the outage's stale leases expire", async () => (await leases(etcd2.endpoint)) <= 2, 10000);
    await sleep(3000);
    const n = await leases(etcd2.endpoint);
    assert.ok(n <= 2 && n >= 1, `one live lease per registrant, got ${n}`);
    assert.match(router.proc.log(), /etcd: discovery at .* recovered after/);
    if (reg.child.exitCode !== null) throw fatal("register exited: " + reg.log());
  },
);
