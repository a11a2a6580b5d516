// infera-gate <command> [flags]: one entry point for the image and `npx`.
// Commands: router (default), bridge, relay, register, sim.
import { startRouter } from "./router";
import { startBridge } from "../njs/bridge";
import { startRelay } from "./relay";
import { startRegister } from "./register";
import { version } from "./args";
import { spawn } from "child_process";

const USAGE = `infera-gate ${version()}

usage: infera-gate [router|bridge|relay|register|sim] [flags]   (default: router)
       infera-gate <command> --help
`;

async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  if (cmd === undefined || cmd.startsWith("-")) {
    if (cmd === "--version") return void process.stdout.write(`infera-gate ${version()}\n`);
    if (cmd === "--help" || cmd === "-h") return void process.stdout.write(USAGE);
    return startRouter(argv);
  }
  if (cmd === "router") return startRouter(rest);
  if (cmd === "bridge") return startBridge(rest);
  if (cmd === "relay") return startRelay(rest);
  if (cmd === "register") return startRegister(rest);
  if (cmd === "sim") {
    // The simulator keeps its own flag parser and main (sim/engine.ts): run it as a child.
    const script = require.resolve("../sim/engine");
    const child = spawn(process.execPath, [...process.execArgv, script, ...rest], { stdio: "inherit" });
    for (const sig of ["SIGTERM", "SIGINT"] as const) process.on(sig, () => child.kill(sig));
    child.on("exit", (code) => process.exit(code ?? 1));
    return;
  }
  process.stderr.write(`infera-gate: unknown command '${cmd}'\n${USAGE}`);
  process.exit(2);
}

void main(process.argv.slice(2));
