// The CLI layer every command shares (router, bridge, relay, register, sim): flags
// come from core/flags.ts; values resolve as command line > env (INFERA_…) >
// --config file > default. Errors are one line naming the flag.
import { parseArgs as nodeParseArgs } from "node:util";
import * as fs from "fs";
import * as path from "path";
import { parse as parseYaml } from "yaml";
import { Command, envName, FlagSpec, flagsFor, FlagValue, parseFlagValue } from "../core/flags";

/** A usage error: printed as one line, exit code 2. */
export class CliError extends Error {}

export interface CommandInfo {
  name: Command;
  /** Program name in help and errors. */
  prog: string;
  /** How it is run: the one installed binary, infera-gate, and the command. */
  invoke: string;
  summary: string;
  /** Positional arguments, mapped in order onto these flags. */
  positionals?: string[];
}

export const COMMANDS: Record<Command, CommandInfo> = {
  router: {
    name: "router",
    prog: "infera-gate",
    invoke: "infera-gate [router]",
    summary: "Envoy ext_proc server: KV-cache-aware routing for an OpenAI/Anthropic-compatible fleet",
  },
  bridge: {
    name: "bridge",
    prog: "infera-bridge",
    invoke: "infera-gate bridge",
    summary: "feeds nginx's njs router: discovery + KV events pushed to nginx's push location",
  },
  relay: {
    name: "relay",
    prog: "infera-kv-relay",
    invoke: "infera-gate relay",
    summary: "republishes a worker's ZMQ KV events on NATS",
    positionals: ["zmq-endpoint", "nats-url", "subject"],
  },
  register: {
    name: "register",
    prog: "infera-register",
    invoke: "infera-gate register",
    summary: "keeps a worker registered in etcd under a kept-alive lease",
  },
  sim: {
    name: "sim",
    prog: "infera-sim",
    invoke: "infera-gate sim",
    summary:
      "engine simulator: an OpenAI/Anthropic-compatible worker over a vLLM-like engine model, publishing vLLM KV events",
  },
};

export function version(): string {
  // dist/runtime/args.js and runtime/args.ts both sit one or two levels below package.json.
  for (const up of ["..", "../.."]) {
    const p = path.join(__dirname, up, "package.json");
    if (fs.existsSync(p)) {
      const pkg = JSON.parse(fs.readFileSync(p, "utf8"));
      if (pkg.name === "infera-gate") return pkg.version;
    }
  }
  return "unknown";
}

export function helpText(cmd: Command): string {
  const info = COMMANDS[cmd];
  const lines = [
    `${info.prog} ${version()}: ${info.summary}`,
    "",
    `usage: ${info.invoke} [flags]${info.positionals ? " [" + info.positionals.join(" ") + "]" : ""}`,
    "",
  ];
  const rows: [string, string][] = [];
  for (const f of flagsFor(cmd)) {
    const left = `--${f.name}${f.kind === "bool" ? "" : " " + (f.metavar ?? (f.choices ? f.choices.join("|") : f.kind === "int" || f.kind === "number" ? "N" : "S"))}`;
    const bits: string[] = [];
    if (f.required) bits.push("required");
    else if (f.def !== null) bits.push(`default ${f.def === "" ? '""' : f.def}`);
    if (f.min !== undefined && f.max !== undefined) bits.push(`${f.min}..${f.max}`);
    else if (f.min !== undefined) bits.push(`>= ${f.min}`);
    bits.push(`env ${envName(f.name)}`);
    rows.push([left, `${f.help} (${bits.join("; ")})`]);
  }
  rows.push(["--help, -h", "this text"], ["--version", "print the version"]);
  const w = Math.min(40, Math.max(...rows.map((r) => (r.length > 0 ? r[0].length : 0))) + 2);
  for (const [l, r] of rows) lines.push(`  ${l.padEnd(w)} ${r}`);
  return lines.join("\n") + "\n";
}

export interface Parsed {
  values: Record<string, FlagValue>;
  /** Which flags were given explicitly (command line, env or file). */
  given: Record<string, string>;
  help: boolean;
  version: boolean;
}

/** Reads a --config file: YAML or JSON, keys are flag names (kebab-case; camelCase accepted). */
export function readConfigFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    throw new CliError(`--config: cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = /\.json$/i.test(file) ? JSON.parse(text) : parseYaml(text);
  } catch (e) {
    throw new CliError(
      `--config ${file}: not valid ${/\.json$/i.test(file) ? "JSON" : "YAML"}: ${(e as Error).message.split("\n")[0]}`,
    );
  }
  if (doc === null || doc === undefined) return {};
  if (typeof doc !== "object" || Array.isArray(doc))
    throw new CliError(`--config ${file}: want a mapping of flag names to values`);
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(doc as Record<string, unknown>))
    out[k.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase())] = v;
  return out;
}

/** Parses argv for one command. Throws CliError with the flag named. */
export function parseCommand(cmd: Command, argv: string[], env: NodeJS.ProcessEnv = process.env): Parsed {
  const specs = flagsFor(cmd);
  const byName: Record<string, FlagSpec> = {};
  for (const f of specs) byName[f.name] = f;
  // `--flag -3` would read as two flags; join each non-boolean known flag with its value first.
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const f = a.startsWith("--") && !a.includes("=") ? byName[a.slice(2)] : undefined;
    if (f && f.kind !== "bool") {
      if (i + 1 >= argv.length) throw new CliError(`${a} needs a value`);
      args.push(`${a}=${argv[++i]}`);
    } else args.push(a);
  }
  const options: Record<string, { type: "string" | "boolean"; short?: string }> = {
    help: { type: "boolean", short: "h" },
    version: { type: "boolean" },
  };
  for (const f of specs) options[f.name] = { type: f.kind === "bool" ? "boolean" : "string" };
  let raw: { values: Record<string, string | boolean | undefined>; positionals: string[] };
  try {
    raw = nodeParseArgs({ args, options, strict: true, allowPositionals: !!COMMANDS[cmd].positionals }) as never;
  } catch (e) {
    const m = /Unknown option '([^']+)'/.exec((e as Error).message);
    if (m) {
      const near = nearestFlag(m[1].replace(/^-+/, "").split("=")[0], specs);
      throw new CliError(`unknown flag ${m[1]}${near ? `; did you mean --${near}?` : ""} (see --help)`);
    }
    const p = /Unexpected argument '([^']+)'/.exec((e as Error).message);
    if (p) throw new CliError(`unexpected argument '${p[1]}' (see --help)`);
    throw new CliError((e as Error).message.split("\n")[0]);
  }
  const out: Parsed = { values: {}, given: {}, help: !!raw.values.help, version: !!raw.values.version };
  if (out.help || out.version) return out;
  const pos = COMMANDS[cmd].positionals ?? [];
  if (raw.positionals.length > pos.length)
    throw new CliError(`too many arguments: ${raw.positionals.slice(pos.length).join(" ")}`);
  const cli: Record<string, string | boolean> = {};
  raw.positionals.forEach((p, i) => (cli[pos[i]] = p));
  for (const [k, v] of Object.entries(raw.values)) if (k !== "help" && k !== "version" && v !== undefined) cli[k] = v;
  const cfgPath = (cli.config as string | undefined) ?? env[envName("config")];
  const file = cfgPath ? readConfigFile(cfgPath) : {};
  for (const k of Object.keys(file))
    if (!byName[k] || k === "config") throw new CliError(`--config ${cfgPath}: unknown key '${k}' (not a ${cmd} flag)`);
  for (const f of specs) {
    let v: FlagValue = f.def;
    try {
      if (cli[f.name] !== undefined) {
        v = parseFlagValue(f, cli[f.name], `--${f.name}`);
        out.given[f.name] = "flag";
      } else if (env[envName(f.name)] !== undefined && env[envName(f.name)] !== "") {
        v = parseFlagValue(f, env[envName(f.name)] as string, envName(f.name));
        out.given[f.name] = "env";
      } else if (file[f.name] !== undefined && file[f.name] !== null) {
        const fv = file[f.name];
        const s = Array.isArray(fv) ? fv.join(",") : (fv as string | number | boolean);
        if (typeof s === "object") throw new Error(`${cfgPath}: '${f.name}' must be a scalar`);
        v = parseFlagValue(f, s, `${cfgPath}: ${f.name}`);
        out.given[f.name] = "file";
      }
    } catch (e) {
      throw new CliError((e as Error).message);
    }
    if (f.required && (v === null || v === "")) throw new CliError(`--${f.name} is required (or ${envName(f.name)})`);
    out.values[f.name] = v;
  }
  return out;
}

/**
 * Runs a command's main: --help / --version, then start(values). Usage and
 * startup errors (bad flag, busy port) print one line and exit 2; anything
 * else unexpected still prints its message, not a stack, unless debugging.
 */
export async function runCommand(cmd: Command, argv: string[], start: (p: Parsed) => Promise<void>): Promise<void> {
  const prog = COMMANDS[cmd].prog;
  let p: Parsed;
  try {
    p = parseCommand(cmd, argv);
  } catch (e) {
    process.stderr.write(`${prog}: ${(e as Error).message}\n`);
    process.exit(2);
  }
  if (p.help) {
    process.stdout.write(helpText(cmd));
    process.exit(0);
  }
  if (p.version) {
    process.stdout.write(`${prog} ${version()}\n`);
    process.exit(0);
  }
  try {
    await start(p);
  } catch (e) {
    const msg = (e as Error).message;
    process.stderr.write(`${prog}: ${msg}\n`);
    if (p.values["log-level"] === "debug" && !(e instanceof CliError)) process.stderr.write(`${(e as Error).stack}\n`);
    process.exit(e instanceof CliError ? 2 : 1);
  }
}

/** The command's flag closest to a mistyped name (edit distance at most 2, or a unique prefix), if any. */
export function nearestFlag(name: string, specs: FlagSpec[]): string | null {
  return nearestName(
    name,
    specs.map((f) => f.name),
  );
}

/** The name closest to a mistyped one (edit distance at most 2, or a unique prefix of 3+ characters), if any. */
export function nearestName(name: string, names: string[]): string | null {
  const dist = (a: string, b: string): number => {
    let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
    for (let i = 1; i <= a.length; i++) {
      const cur = [i];
      for (let j = 1; j <= b.length; j++)
        cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
    return prev[b.length];
  };
  let best: string | null = null;
  let bestD = 3;
  for (const n of names) {
    const d = dist(name, n);
    if (d < bestD) {
      best = n;
      bestD = d;
    }
  }
  if (best) return best;
  const prefixed = names.filter((n) => name.length >= 3 && n.startsWith(name));
  return prefixed.length === 1 ? prefixed[0] : null;
}

/** Turns a listen failure into a one-line error naming the flag. */
export function listenError(flag: string, host: string, port: number, e: unknown): CliError {
  const code = (e as NodeJS.ErrnoException).code;
  const msg = (e as Error).message || String(e);
  if (code === "EADDRINUSE" || /address already in use|No address added/i.test(msg))
    return new CliError(`${flag} ${port}: ${host}:${port} is already in use`);
  if (code === "EACCES") return new CliError(`${flag} ${port}: permission denied binding ${host}:${port}`);
  if (code === "EADDRNOTAVAIL" || code === "ENOTFOUND") return new CliError(`--host ${host}: cannot bind this address`);
  return new CliError(`${flag} ${port}: cannot listen on ${host}:${port}: ${msg.split("\n")[0]}`);
}
