// The one CLI layer: flag table -> parsing, env, --config, help, version,
// README, and the njs config reader; real processes for the one-line errors.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { oneLine } from "./helpers";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as net from "net";
import * as os from "os";
import * as path from "path";
import { parseCommand, helpText, COMMANDS } from "../../runtime/args";
import { flagTable, flagsFor, routerConfigFromVars, nginxFlag, envName } from "../../core/flags";
import { optionsFrom, parseArgs } from "../../runtime/config";
import { renderFlagTable, FLAG_DOC } from "../../scripts/flags-doc";
import { specFromEtcd } from "../../runtime/etcd";
import { App } from "../../runtime/app";
import { enumVar } from "../../njs/phases";
import { intVar } from "../../njs/push";
import { entryArgs } from "../harness";

const FLAGS = flagTable();

const ROOT = path.resolve(__dirname, "../..");
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8"));
const ENTRY: Record<string, string> = {
  router: "cli/router.ts",
  bridge: "njs/bridge.ts",
  relay: "cli/relay.ts",
  register: "cli/register.ts",
  sim: "sim/engine.ts",
};

function runCli(script: string, args: string[], env: Record<string, string> = {}) {
  // Strip any INFERA_* of the caller's: only what the test sets counts.
  const clean: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("INFERA_") && v !== undefined) clean[k] = v;
  return spawnSync(process.execPath, [...entryArgs(script), ...args], {
    cwd: ROOT,
    env: { ...clean, ...env },
    encoding: "utf8",
    timeout: 30000,
  });
}

test("each command's --help lists its own flags; --version prints package.json's version", () => {
  for (const [cmd, script] of Object.entries(ENTRY)) {
    const h = runCli(script, ["--help"]);
    assert.equal(h.status, 0, `${cmd} --help: ${h.stderr}`);
    assert.ok(h.stdout.startsWith(COMMANDS[cmd as keyof typeof COMMANDS].prog + " "), `${cmd} help names its program`);
    for (const f of FLAGS) {
      const mine = f.commands.includes(cmd as never);
      assert.equal(
        h.stdout.includes(`--${f.name} `) || h.stdout.includes(`--${f.name}\n`),
        mine || FLAGS.some((g) => g.name === f.name && g.commands.includes(cmd as never)),
        `${cmd} help and --${f.name}`,
      );
    }
    const v = runCli(script, ["--version"]);
    assert.equal(v.status, 0);
    assert.match(v.stdout, new RegExp(`^infera-[a-z-]+ ${pkg.version.replace(/\./g, "\\.")}\\n$`));
  }
  assert.doesNotMatch(helpText("bridge"), /--ext-proc-port/, "the bridge no longer prints the router's help");
  assert.match(helpText("bridge"), /--nginx-push-url/);
});

test("ranges and choices are checked with the flag named", () => {
  const bad: [string, string[], RegExp][] = [
    ["router", ["--workers", "127.0.0.1:1", "--admin-port", "99999"], /--admin-port: 99999 is above the maximum 65535/],
    [
      "router",
      ["--workers", "127.0.0.1:1", "--health-interval-ms", "-3"],
      /--health-interval-ms: -3 is below the minimum 0/,
    ],
    [
      "router",
      ["--workers", "127.0.0.1:1", "--health-interval-ms", "5"],
      /--health-interval-ms: 5 must be 0 \(off\) or at least 50/,
    ],
    ["router", ["--workers", "127.0.0.1:1", "--block-size", "1.5"], /--block-size: '1.5' is not an integer/],
    [
      "router",
      ["--workers", "127.0.0.1:1", "--router-policy", "best"],
      /--router-policy: 'best' is not one of kv-aware, round-robin, random/,
    ],
    ["router", ["--workers", "127.0.0.1:1", "--ext-proc-port", "x"], /--ext-proc-port: 'x' is not a number/],
    [
      "register",
      ["--id", "w", "--address", "127.0.0.1:1", "--role", "bogus"],
      /--role: 'bogus' is not one of mixed, prefill, decode/,
    ],
    ["register", ["--address", "127.0.0.1:1"], /--id is required/],
    ["register", ["--id", "w", "--address", "nohost"], /--address: nohost must be host:port/],
    ["relay", ["tcp://127.0.0.1:1"], /--subject is required/],
    ["router", ["--workers", "127.0.0.1:1", "--bogus", "1"], /unknown flag --bogus/],
  ];
  for (const [cmd, args, re] of bad) assert.throws(() => parseCommand(cmd as never, args, {}), re, args.join(" "));
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1@tcp://nohost"], {}),
    /--workers: '127.0.0.1:1@tcp:\/\/nohost': KV event endpoint .* needs tcp:\/\/host:port/,
  );
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1@tcp://h:99999"], {}), /port 1..65535/);
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1@udp://h:1"], {}), /scheme udp/);
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1@has space"], {}), /neither tcp/);
  assert.doesNotThrow(() =>
    parseArgs(["--workers", "127.0.0.1:1@tcp://127.0.0.1:5557,127.0.0.1:2@infera.kv.w1,127.0.0.1:3@ipc:///tmp/x"], {}),
  );
  assert.throws(() => parseArgs(["--discovery-backend", "static"], {}), /--workers is required/);
  assert.throws(() => parseArgs(["--workers", "127.0.0.1:1"], {}, "bridge"), /--push-token .* is required/);
});

test("env vars (INFERA_…) and --config files set every flag; command line > env > file > default", () => {
  for (const f of FLAGS) assert.match(envName(f.name), /^INFERA_[A-Z0-9_]+$/);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-cli-"));
  const yml = path.join(dir, "router.yaml");
  fs.writeFileSync(
    yml,
    "workers:\n  - 127.0.0.1:1\n  - decode=127.0.0.1:2\nadmin-port: 7001\nblock-size: 32\nsessionAffinity: prefill\n",
  );
  let o = parseArgs(["--config", yml], {});
  assert.deepEqual(
    o.workers.map((w) => w.role),
    ["mixed", "decode"],
  );
  assert.equal(o.adminPort, 7001);
  assert.equal(o.router.blockSize, 32);
  assert.equal(o.router.sessionAffinity, "prefill");
  o = parseArgs(["--config", yml], { INFERA_ADMIN_PORT: "7002", INFERA_BLOCK_SIZE: "64" });
  assert.equal(o.adminPort, 7002, "env beats file");
  o = parseArgs(["--config", yml, "--admin-port", "7003"], { INFERA_ADMIN_PORT: "7002" });
  assert.equal(o.adminPort, 7003, "flag beats env");
  o = parseArgs([], { INFERA_CONFIG: yml });
  assert.equal(o.adminPort, 7001, "INFERA_CONFIG names the file");
  const json = path.join(dir, "bridge.json");
  fs.writeFileSync(json, JSON.stringify({ workers: "127.0.0.1:1", "push-token": "s3cret", "bridge-queue-max": 5 }));
  const b = parseArgs(["--config", json], {}, "bridge");
  assert.equal(b.pushToken, "s3cret");
  assert.equal(b.bridgeQueueMax, 5);
  assert.equal(b.adminPort, 9101, "the bridge's own default admin port");
  fs.writeFileSync(json, JSON.stringify({ workers: "127.0.0.1:1", "ext-proc-port": 1 }));
  assert.throws(() => parseArgs(["--config", json], {}, "bridge"), /unknown key 'ext-proc-port' \(not a bridge flag\)/);
  fs.writeFileSync(yml, "admin-port: 123456\n");
  assert.throws(
    () => parseArgs(["--config", yml, "--workers", "127.0.0.1:1"], {}),
    new RegExp(`${yml.replace(/[/.]/g, "\\$&")}: admin-port: 123456 is above the maximum`),
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1"], { INFERA_HEALTH_INTERVAL_MS: "-1" }),
    /^Error: INFERA_HEALTH_INTERVAL_MS: -1 is below the minimum 0/,
  );
  assert.throws(
    () => parseArgs(["--config", path.join(dir, "missing.yaml")], {}),
    /--config: cannot read .*missing.yaml: ENOENT/,
  );
});

test("the njs config reader comes from the same table: nginx variables, defaults, errors naming the variable", () => {
  const vars: Record<string, string> = {
    infera_policy: "round-robin",
    infera_block_size: "32",
    infera_kv_prefill_overlap_weight: "",
    infera_kv_decode_overlap_weight: "2",
    infera_session_affinity: "both",
    infera_max_body_bytes: "100",
  };
  const c = routerConfigFromVars((n) => vars[n]);
  assert.equal(c.policy, "round-robin");
  assert.equal(c.blockSize, 32);
  assert.equal(c.prefillOverlapWeight, null);
  assert.equal(c.decodeOverlapWeight, 2);
  assert.equal(c.sessionAffinity, "both");
  assert.equal(c.mmLruSize, 256, "unset keeps the default");
  assert.equal(
    nginxFlag("max-body-bytes", (n) => vars[n]),
    100,
  );
  assert.equal(
    nginxFlag("session-header", (n) => vars[n]),
    "x-session-id",
  );
  // njs's header filter reads $infera_response_worker_header raw and takes unset, "" and "off" as off without the table.
  for (const v of [undefined, "", "off"])
    assert.equal(
      nginxFlag("response-worker-header", () => v),
      "off",
    );
  assert.throws(
    () => routerConfigFromVars((n) => (n === "infera_block_size" ? "abc" : undefined)),
    /^Error: \$infera_block_size: 'abc' is not a number/,
  );
  assert.throws(
    () => routerConfigFromVars((n) => (n === "infera_decode_input_demand" ? "maybe" : undefined)),
    /\$infera_decode_input_demand: 'maybe' is not one of off, shadow, on/,
  );
  // Every router flag njs reads has its variable set in the shipped nginx.conf.
  const conf = fs.readFileSync(path.join(ROOT, "nginx/nginx.conf"), "utf8");
  for (const f of flagsFor("router"))
    if (f.nginx) assert.match(conf, new RegExp(`set \\$${f.nginx} `), `nginx.conf sets $${f.nginx}`);
});

test("the flag table in docs/configuration.md is generated from the table and up to date", () => {
  const doc = fs.readFileSync(path.join(ROOT, FLAG_DOC), "utf8");
  assert.equal(doc, renderFlagTable(doc), "run npm run docs:flags");
  for (const f of FLAGS) assert.ok(doc.includes("`--" + f.name + "`"));
});

test("bad flags, busy ports and bad worker endpoints end the process with one line, exit 2, no stack trace", async () => {
  oneLine(
    runCli(ENTRY.router, ["--workers", "127.0.0.1:1", "--admin-port", "99999"]),
    /^infera-gate: --admin-port: 99999 is above the maximum 65535/,
  );
  oneLine(
    runCli(ENTRY.router, ["--workers", "127.0.0.1:1", "--health-interval-ms", "-3"]),
    /^infera-gate: --health-interval-ms: -3 is below the minimum 0/,
  );
  oneLine(
    runCli(ENTRY.router, ["--workers", "127.0.0.1:1@tcp://nohost", "--router-tokenizer-path", "none"]),
    /^infera-gate: --workers: .*needs tcp:\/\/host:port/,
  );
  oneLine(
    runCli(ENTRY.register, ["--id", "w0", "--address", "127.0.0.1:1", "--role", "bogus"]),
    /^infera-register: --role: 'bogus' is not one of/,
  );
  oneLine(runCli(ENTRY.bridge, ["--workers", "127.0.0.1:1"]), /^infera-bridge: --push-token .* is required/);
  oneLine(
    runCli(ENTRY.relay, ["tcp://nohost", "nats://127.0.0.1:1", "infera.kv.w0"]),
    /^infera-kv-relay: --zmq-endpoint: .*needs tcp:\/\/host:port/,
  );
  // A port someone else holds.
  const holder = net.createServer();
  await new Promise<void>((r) => holder.listen(0, "127.0.0.1", r));
  const busy = (holder.address() as net.AddressInfo).port;
  try {
    const r = runCli(ENTRY.router, [
      "--workers",
      "127.0.0.1:1",
      "--router-tokenizer-path",
      "none",
      "--health-interval-ms",
      "0",
      "--ext-proc-port",
      "0",
      "--admin-port",
      String(busy),
    ]);
    oneLine(r, new RegExp(`^infera-gate: --admin-port ${busy}: 127.0.0.1:${busy} is already in use`));
    const g = runCli(ENTRY.router, [
      "--workers",
      "127.0.0.1:1",
      "--router-tokenizer-path",
      "none",
      "--health-interval-ms",
      "0",
      "--admin-port",
      "0",
      "--ext-proc-port",
      String(busy),
    ]);
    oneLine(g, new RegExp(`^infera-gate: --ext-proc-port ${busy}: 127.0.0.1:${busy} is already in use`));
  } finally {
    holder.close();
  }
});

test("etcd registrations are checked like flags; a transport that refuses an endpoint does not take the router down", () => {
  assert.throws(
    () => specFromEtcd("w", JSON.stringify({ address: "127.0.0.1:1", kv_events: "tcp://nohost" })),
    /registration w: 'kv_events' .*needs tcp:\/\/host:port/,
  );
  assert.throws(
    () => specFromEtcd("w", JSON.stringify({ address: "127.0.0.1:1", block_size: -4 })),
    /'block_size' must be a positive integer/,
  );
  assert.throws(
    () => specFromEtcd("w", JSON.stringify({ address: "127.0.0.1:1", role: "bogus" })),
    /unknown role 'bogus'/,
  );
  assert.equal(
    specFromEtcd("w", JSON.stringify({ address: "127.0.0.1:1", kv_events: "tcp://127.0.0.1:5557" })).events,
    "tcp://127.0.0.1:5557",
  );
  const lines: string[] = [];
  const app = new App(
    parseArgs(
      ["--workers", "127.0.0.1:1@tcp://127.0.0.1:5557", "--health-interval-ms", "0", "--router-tokenizer-path", "none"],
      {},
    ),
    (l, m) => lines.push(`${l} ${m}`),
    {
      subscribe: () => {
        throw new Error("Invalid argument");
      },
      close: async () => undefined,
    },
  );
  assert.doesNotThrow(() => app.setWorkers(app.opts.workers));
  assert.equal(app.router.workers().length, 1, "the worker stays, routed by load");
  assert.ok(lines.some((l) => /cannot subscribe to tcp:\/\/127.0.0.1:5557: Invalid argument/.test(l)));
});

test("list-valued flags (--scorer-weights) parse the same from argv, env, file and nginx", () => {
  assert.deepEqual(
    parseArgs(["--workers", "127.0.0.1:1", "--scorer-weights", "prefix-overlap=2, active-blocks=0"], {}).router
      .scorerWeights,
    { "prefix-overlap": 2, "active-blocks": 0 },
  );
  assert.deepEqual(
    parseArgs(["--workers", "127.0.0.1:1"], {}).router.scorerWeights,
    {},
    "unset keeps the empty default",
  );
  assert.deepEqual(
    parseArgs(["--workers", "127.0.0.1:1"], { INFERA_SCORER_WEIGHTS: "queued-prefill=3" }).router.scorerWeights,
    { "queued-prefill": 3 },
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1", "--scorer-weights", "prefix-overlap"], {}),
    /--scorer-weights: 'prefix-overlap' is not name=weight/,
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1", "--scorer-weights", "a=-1"], {}),
    /weight of a must be a number >= 0/,
  );
  assert.deepEqual(
    routerConfigFromVars((n) => (n === "infera_scorer_weights" ? "image-affinity=4" : undefined)).scorerWeights,
    { "image-affinity": 4 },
  );
  assert.equal(parseArgs(["--workers", "127.0.0.1:1", "--max-session-id-bytes", "64"], {}).maxSessionIdBytes, 64);
  assert.equal(
    nginxFlag("max-session-id-bytes", () => undefined),
    256,
  );
});

test("runtime/config.ts repeats no default of the flag table: every flag's default comes from core/flags.ts", () => {
  const src = fs.readFileSync(path.join(__dirname, "../../runtime/config.ts"), "utf8");
  const repeats: string[] = [];
  // v("flag") followed by a `??` fallback is a second default; so is a literal equal to the table's beside the name.
  for (const m of src.matchAll(/v\("([a-z0-9-]+)"\)[^,\n]*?\?\?\s*([^,\n)}]+)/g)) {
    const f = FLAGS.find((x) => x.name === m[1]);
    if (!f) continue;
    const lit = m[2].trim();
    const same = f.def !== null && (lit === JSON.stringify(f.def) || lit === String(f.def));
    if (same || (f.def !== null && f.def !== "" && /^[0-9"]/.test(lit))) repeats.push(`${m[1]} ?? ${lit}`);
  }
  assert.deepEqual(repeats, []);
  // And the bridge, which lacks the router's flags, still gets the table's values for them.
  const o = optionsFrom(parseCommand("bridge", ["--workers", "127.0.0.1:1", "--push-token", "t"], {}).values, "bridge");
  const def = (n: string) => FLAGS.find((x) => x.name === n && x.commands.includes("router"))!.def;
  assert.equal(o.tokenize.inlineChars, def("tokenize-inline-chars"));
  assert.equal(o.maxBodyBytes, def("max-body-bytes"));
  assert.equal(o.extProcMaxStreams, def("ext-proc-max-streams"));
  assert.equal(o.bridgeQueueMax, FLAGS.find((x) => x.name === "bridge-queue-max")!.def);
});

test("a mistyped flag gets the nearest one suggested", () => {
  assert.throws(
    () => parseCommand("router", ["--worker", "127.0.0.1:1"], {}),
    /unknown flag --worker; did you mean --workers\? \(see --help\)/,
  );
  assert.throws(() => parseCommand("router", ["--kv-overlap-weigth", "2"], {}), /did you mean --kv-overlap-weight\?/);
  assert.throws(() => parseCommand("bridge", ["--nginx-push", "x"], {}), /did you mean --nginx-push-url\?/);
  assert.throws(
    () => parseCommand("router", ["--zzzzzz", "1"], {}),
    (e: Error) => /unknown flag --zzzzzz \(see --help\)/.test(e.message) && !/did you mean/.test(e.message),
  );
});

/** What f gives: its value, or the message of what it throws (a flag reader's answer either way). */
function outcome(f: () => unknown): unknown {
  try {
    return f();
  } catch (e) {
    return (e as Error).message;
  }
}

test("the njs phases bundle reads its two enum flags as nginxFlag does, without the flag table", () => {
  // njs/phases.ts cannot import core/flags.ts (it needs the router): its reader must agree with the table.
  for (const [name, nginx] of [
    ["response-worker-header", "infera_response_worker_header"],
    ["pd-prefill-guard-release", "infera_pd_prefill_guard_release"],
  ]) {
    const spec = flagTable().find((f) => f.name === name)!;
    assert.equal(spec.nginx, nginx);
    assert.equal(spec.kind, "enum");
    for (const v of [undefined, "", "on", "off", " on ", "first-token", "completion", "maybe", " "]) {
      assert.equal(
        outcome(() => enumVar(v, nginx, spec.choices!, String(spec.def))),
        outcome(() => nginxFlag(name, () => v)),
        `${name} = ${JSON.stringify(v)}`,
      );
    }
  }
});

test("the njs push bundle reads its two int flags as nginxFlag does, without the flag table", () => {
  // njs/push.ts cannot import core/flags.ts (it needs the router): its reader must agree with the table.
  for (const [name, nginx] of [
    ["block-size", "infera_block_size"],
    ["max-mirror-blocks", "infera_max_mirror_blocks"],
  ]) {
    const spec = flagTable().find((f) => f.name === name)!;
    assert.equal(spec.nginx, nginx);
    assert.equal(spec.kind, "int");
    assert.equal(spec.check, undefined);
    for (const v of [
      undefined,
      "",
      " ",
      "16",
      " 32 ",
      "0",
      "-1",
      "1.5",
      "abc",
      "4096",
      "4097",
      "1e3",
      "0x10",
      "Infinity",
    ]) {
      assert.equal(
        outcome(() => intVar(v, nginx, spec.def as number, spec.min, spec.max)),
        outcome(() => nginxFlag(name, () => v)),
        `${name} = ${JSON.stringify(v)}`,
      );
    }
  }
});
