// The engine simulator on the shared flag table and CLI layer (core/flags.ts,
// cli/args.ts): help, env, --config, defaults, one-line errors, as for every
// other command.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { oneLine } from "./helpers";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as net from "net";
import * as os from "os";
import * as path from "path";
import { flagTable, flagsFor, envName } from "../../core/flags";
import { parseSimArgs, simDefaults, modelConfig } from "../../sim/engine";
import { llama8bH100 } from "../../sim/model";
import { SIM_FLAGS as SIM_FLAGS_TABLE } from "../../sim/flags";
import { entryArgs } from "../harness";

const FLAGS = flagTable();

const ROOT = path.resolve(__dirname, "../..");

function cli(args: string[], env: Record<string, string> = {}) {
  const clean: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("INFERA_") && v !== undefined) clean[k] = v;
  return spawnSync(process.execPath, [...entryArgs("cli/main.ts"), ...args], {
    cwd: ROOT,
    env: { ...clean, ...env },
    encoding: "utf8",
    timeout: 30000,
  });
}

const SIM_FLAGS = [
  "id",
  "host",
  "port",
  "kv-events-port",
  "topic",
  "block-size",
  "capacity-blocks",
  "prefill-us-per-token",
  "prefill-base-ms",
  "decode-ms-per-token",
  "prefill-attn-us-per-kctx",
  "decode-us-per-seq",
  "kv-read-us-per-ktoken",
  "max-num-batched-tokens",
  "max-num-seqs",
  "time-scale",
  "stream-interval",
  "kv-events-map-port",
  "kv-replay-port",
  "kv-event-encoding",
  "kv-cpu-blocks",
  "kv-sliding-window",
  "data-parallel-size",
  "role",
  "malformed-every",
  "tokenizer-path",
  "etcd-endpoint",
  "etcd-prefix",
  "advertise",
  "prefill-header",
  "render-fixture",
  "render-divergent",
  "served-model-name",
  "lora-modules",
  "max-loras",
  "lora-load-ms",
];

test("infera-gate sim --help lists every simulator flag of the table, with its env variable, and no router flag", () => {
  const names = flagsFor("sim").map((f) => f.name);
  for (const n of SIM_FLAGS) assert.ok(names.includes(n), `--${n} is in the table under sim`);
  assert.ok(names.includes("config"));
  const h = cli(["sim", "--help"]);
  assert.equal(h.status, 0, h.stderr);
  assert.match(h.stdout, /^infera-sim \S+: engine simulator/);
  for (const f of flagsFor("sim")) {
    assert.match(h.stdout, new RegExp(`^  --${f.name}[ \\n]`, "m"), `--${f.name} in help`);
    assert.ok(h.stdout.includes(envName(f.name)), `${envName(f.name)} in help`);
  }
  for (const f of FLAGS)
    if (!f.commands.includes("sim") && !FLAGS.some((g) => g.name === f.name && g.commands.includes("sim")))
      assert.doesNotMatch(h.stdout, new RegExp(`^  --${f.name}[ \\n]`, "m"), `--${f.name} is not a sim flag`);
  const v = cli(["sim", "--version"]);
  assert.equal(v.status, 0, v.stderr);
  assert.match(v.stdout, /^infera-sim \d+\.\d+\.\d+\n$/);
});

test("the table's simulator defaults are the engine model's (Llama-3.1-8B on an H100) and the simulator's own", () => {
  const d = simDefaults();
  assert.deepEqual(modelConfig(d), llama8bH100());
  assert.equal(d.id, "sim");
  assert.equal(d.host, "127.0.0.1");
  assert.equal(d.port, 8001);
  assert.equal(d.kvEventsPort, 5557);
  assert.equal(d.role, "mixed");
  assert.equal(d.kvEventEncoding, "array");
  assert.equal(d.kvEventsMapPort, null);
  assert.equal(d.kvReplayPort, null);
  assert.equal(d.dpSize, 1);
  assert.equal(d.streamInterval, 1);
  assert.equal(d.timeScale, 1);
  assert.equal(d.prefillHeader, "x-infera-prefill");
  assert.deepEqual(d.servedModels, []);
  // Shared with the router, whose default is a local etcd: a simulator registers only when told where.
  assert.equal(d.etcdEndpoint, null);
  assert.equal(parseSimArgs(["--etcd-endpoint", "http://127.0.0.1:2379"], {}).etcdEndpoint, "http://127.0.0.1:2379");
  assert.equal(
    parseSimArgs([], { INFERA_ETCD_ENDPOINT: "http://127.0.0.1:2380" }).etcdEndpoint,
    "http://127.0.0.1:2380",
  );
});

test("env variables and --config files set simulator flags: command line > env > file > default", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-sim-cli-"));
  const yml = path.join(dir, "sim.yaml");
  fs.writeFileSync(
    yml,
    "id: from-file\ncapacity-blocks: 700\nserved-model-name: [llama3, alias]\nkvEventsPort: none\nrole: decode\nrender-divergent: true\netcd-endpoint: http://127.0.0.1:2381\n",
  );
  let o = parseSimArgs(["--config", yml], {});
  assert.equal(o.id, "from-file");
  assert.equal(o.capacityBlocks, 700);
  assert.deepEqual(o.servedModels, ["llama3", "alias"]);
  assert.equal(o.kvEventsPort, null);
  assert.equal(o.role, "decode");
  assert.equal(o.renderDivergent, true);
  assert.equal(o.etcdEndpoint, "http://127.0.0.1:2381", "a file counts as given");
  o = parseSimArgs(["--config", yml], {
    INFERA_CAPACITY_BLOCKS: "800",
    INFERA_KV_EVENTS_PORT: "6000",
    INFERA_TIME_SCALE: "4",
  });
  assert.equal(o.capacityBlocks, 800, "env beats file");
  assert.equal(o.kvEventsPort, 6000);
  assert.equal(o.timeScale, 4);
  o = parseSimArgs(["--config", yml, "--capacity-blocks", "900"], { INFERA_CAPACITY_BLOCKS: "800" });
  assert.equal(o.capacityBlocks, 900, "flag beats env");
  o = parseSimArgs([], { INFERA_CONFIG: yml, INFERA_PREFILL_HEADER: "X-Prefiller-Host-Port" });
  assert.equal(o.id, "from-file", "INFERA_CONFIG names the file");
  assert.equal(o.prefillHeader, "x-prefiller-host-port", "header names are lower-cased from any source");
  fs.writeFileSync(yml, "ext-proc-port: 1\n");
  assert.throws(() => parseSimArgs(["--config", yml], {}), /unknown key 'ext-proc-port' \(not a sim flag\)/);
  fs.writeFileSync(yml, JSON.stringify({ "lora-modules": "sql-lora=/adapters/sql,chat" }));
  fs.renameSync(yml, path.join(dir, "sim.json"));
  assert.deepEqual(parseSimArgs(["--config", path.join(dir, "sim.json")], {}).loraModules, ["sql-lora", "chat"]);
});

test("unknown flags and bad values are rejected with the flag named", () => {
  const bad: [string[], Record<string, string>, RegExp][] = [
    [["--bogus", "1"], {}, /unknown flag --bogus/],
    [["--workers", "127.0.0.1:1"], {}, /unknown flag --workers/],
    [["--role", "bogus"], {}, /--role: 'bogus' is not one of mixed, prefill, decode/],
    [["--kv-events-port", "off"], {}, /--kv-events-port: off must be a port 0..65535 or none/],
    [["--kv-event-encoding", "json"], {}, /--kv-event-encoding: 'json' is not one of array, map/],
    [["--time-scale", "0"], {}, /--time-scale: 0 must be > 0/],
    [["--stream-interval", "0"], {}, /--stream-interval: 0 is below the minimum 1/],
    [["--port", "70000"], {}, /--port: 70000 is above the maximum 65535/],
    [["--capacity-blocks", "x"], {}, /--capacity-blocks: 'x' is not a number/],
    [["--port"], {}, /--port needs a value/],
    [[], { INFERA_MAX_NUM_SEQS: "1.5" }, /INFERA_MAX_NUM_SEQS: '1.5' is not an integer/],
  ];
  for (const [args, env, re] of bad)
    assert.throws(() => parseSimArgs(args, env), re, args.join(" ") + JSON.stringify(env));
});

test("infera-gate sim: bad flags and busy ports end the process with one line naming the flag, exit 2", async () => {
  oneLine(cli(["sim", "--bogus", "1"]), /^infera-sim: unknown flag --bogus \(see --help\)$/);
  oneLine(cli(["sim"], { INFERA_ROLE: "bogus" }), /^infera-sim: INFERA_ROLE: 'bogus' is not one of/);
  const holder = net.createServer();
  await new Promise<void>((r) => holder.listen(0, "127.0.0.1", r));
  const busy = (holder.address() as net.AddressInfo).port;
  try {
    oneLine(
      cli(["sim", "--port", String(busy), "--kv-events-port", "none", "--tokenizer-path", "none"]),
      new RegExp(`^infera-sim: --port ${busy}: 127.0.0.1:${busy} is already in use`),
    );
    oneLine(
      cli(["sim", "--port", "0", "--kv-events-port", String(busy), "--tokenizer-path", "none"]),
      new RegExp(`^infera-sim: --kv-events-port ${busy}: 127.0.0.1:${busy} is already in use`),
    );
  } finally {
    holder.close();
  }
});

test("the simulator's own flags live in sim/flags.ts: core/flags.ts (which njs bundles) holds only the shared ones", () => {
  // A fresh process that loads core/flags.ts alone, as the njs bundle does.
  const r = spawnSync(
    process.execPath,
    [
      "--import",
      "tsx",
      "-e",
      'console.log(JSON.stringify(require("./core/flags").flagsFor("sim").map((f) => f.name)))',
    ],
    { cwd: ROOT, encoding: "utf8", timeout: 30000 },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), ["config", "block-size", "etcd-endpoint", "etcd-prefix", "role"]);
  // With sim/flags.ts loaded (sim/engine.ts imports it) the simulator sees its whole table.
  for (const f of SIM_FLAGS_TABLE) assert.ok(flagsFor("sim").includes(f), `--${f.name} joined the table`);
  const bundle = path.join(ROOT, "njs/dist/infera.js");
  if (fs.existsSync(bundle)) {
    const code = fs.readFileSync(bundle, "utf8");
    for (const f of SIM_FLAGS_TABLE) assert.ok(!code.includes(f.help), `the njs bundle does not carry --${f.name}`);
  }
});
