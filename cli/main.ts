// infera-gate <command> [flags]: one entry point for the image and `npx`.
// Commands: router (default), bridge, relay, register, sim.
import { startRouter } from "./router";
import { startBridge } from "../njs/bridge";
import { startRelay } from "./relay";
import { startRegister } from "./register";
import { COMMANDS, nearestName, version } from "../runtime/args";

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
  // Loaded on demand: the router need not load the simulator's engine model.
  if (cmd === "sim") return (await import("../sim/engine")).startSimCommand(rest);
  const near = nearestName(cmd, Object.keys(COMMANDS));
  process.stderr.write(`infera-gate: unknown command '${cmd}'${near ? `; did you mean '${near}'?` : ""}\n${USAGE}`);
  process.exit(2);
}

void main(process.argv.slice(2));
