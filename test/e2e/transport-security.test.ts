// The router's own clients over TLS with credentials: KV events through a
// TLS + token nats-server (relay and router), discovery through an etcd that
// wants client certificates. Real nats-server and etcd on 127.0.0.1.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import {
  startSim,
  startRouter,
  stopAll,
  waitFor,
  freePort,
  run,
  chat,
  longText,
  ROOT,
  tcpOpen,
  entryArgs,
} from "../harness";
import { makePki } from "../pki";
import { needs } from "../tools";

after(stopAll);
const has = (bin: string) => spawnSync("which", [bin]).status === 0;

test(
  "KV events over a TLS nats-server that wants a token: relay and router connect with --nats-ca-file/--nats-token-file",
  { skip: needs(!has("nats-server") && "nats-server not installed") },
  async () => {
    const k = makePki();
    const token = path.join(k.dir, "nats-token");
    fs.writeFileSync(token, "nats-s3cret\n");
    const port = await freePort();
    const nats = run("nats-tls", "nats-server", [
      "-a",
      "127.0.0.1",
      "-p",
      String(port),
      "--tls",
      "--tlscert",
      k.cert,
      "--tlskey",
      k.key,
      "--auth",
      "nats-s3cret",
    ]);
    await waitFor("nats", () => tcpOpen(port), 10000);
    void nats;
    const url = `nats://127.0.0.1:${port}`;
    const sec = ["--nats-ca-file", k.ca, "--nats-token-file", token];
    const sim = await startSim("tn0");
    const subject = "infera.kv.tn0";
    const relay = run("relay-tls", process.execPath, [
      ...entryArgs("cli/relay.ts"),
      "--zmq-endpoint",
      sim.events,
      "--nats-url",
      url,
      "--subject",
      subject,
      ...sec,
    ]);
    const router = await startRouter([
      "--kv-event-transport",
      "nats",
      "--nats-url",
      url,
      "--workers",
      `${sim.address}@${subject}`,
      ...sec,
    ]);
    await chat(`http://${sim.address}`, longText("natstls", 300));
    await waitFor(
      "mirror over TLS NATS",
      async () =>
        (await router.cacheView(sim.address)).block_count > 0 &&
        (await router.cacheView(sim.address)).block_count === (await sim.stats()).cached_blocks,
      20000,
    ).catch((e) => {
      throw new Error(`${(e as Error).message}\n${relay.log().slice(-1500)}\n${router.proc.log().slice(-1500)}`);
    });
    // Without the token the relay is refused: the server wants credentials.
    const anon = run("relay-anon", process.execPath, [
      ...entryArgs("cli/relay.ts"),
      "--zmq-endpoint",
      sim.events,
      "--nats-url",
      url,
      "--subject",
      subject,
      "--nats-ca-file",
      k.ca,
    ]);
    await waitFor(
      "anonymous relay refused",
      async () => /authoriz|auth/i.test(anon.log()) || anon.child.exitCode !== null,
      20000,
    );
    assert.ok(!/relaying/.test(anon.log()), anon.log().slice(-800));
  },
);

test(
  "etcd over mTLS: register and router discovery use --etcd-ca-file/--etcd-cert-file/--etcd-key-file; without them nothing is seen",
  { skip: needs(!has("etcd") && "etcd not installed") },
  async () => {
    const k = makePki();
    const client = await freePort();
    const peer = await freePort();
    const endpoint = `https://127.0.0.1:${client}`;
    const data = fs.mkdtempSync(path.join(os.tmpdir(), "infera-etcd-tls-"));
    run(
      "etcd-tls",
      "etcd",
      [
        "--data-dir",
        data,
        "--listen-client-urls",
        endpoint,
        "--advertise-client-urls",
        endpoint,
        "--listen-peer-urls",
        `http://127.0.0.1:${peer}`,
        "--initial-advertise-peer-urls",
        `http://127.0.0.1:${peer}`,
        "--initial-cluster",
        `default=http://127.0.0.1:${peer}`,
        "--cert-file",
        k.cert,
        "--key-file",
        k.key,
        "--client-cert-auth",
        "--trusted-ca-file",
        k.ca,
        "--log-level",
        "error",
      ],
      { ETCD_UNSUPPORTED_ARCH: "" },
    );
    await waitFor("etcd tls", () => tcpOpen(client), 20000);
    const sec = ["--etcd-ca-file", k.ca, "--etcd-cert-file", k.clientCert, "--etcd-key-file", k.clientKey];
    const reg = run("register-tls", process.execPath, [
      ...entryArgs("cli/register.ts"),
      "--etcd-endpoint",
      endpoint,
      "--id",
      "tls0",
      "--address",
      "127.0.0.1:9",
      "--role",
      "mixed",
      ...sec,
    ]);
    const router = await startRouter([
      "--discovery-backend",
      "etcd",
      "--etcd-endpoint",
      endpoint,
      "--health-interval-ms",
      "0",
      ...sec,
    ]);
    await waitFor(
      "worker discovered over mTLS",
      async () => (await router.workers()).some((w) => w.id === "tls0"),
      20000,
    ).catch((e) => {
      throw new Error(`${(e as Error).message}\n${reg.log().slice(-1200)}\n${router.proc.log().slice(-1200)}`);
    });
    const blind = await startRouter([
      "--discovery-backend",
      "etcd",
      "--etcd-endpoint",
      endpoint,
      "--health-interval-ms",
      "0",
      "--etcd-ca-file",
      k.ca,
    ]);
    await new Promise((r) => setTimeout(r, 3000));
    assert.equal((await blind.workers()).length, 0, "no client certificate, no fleet");
    void ROOT;
  },
);
