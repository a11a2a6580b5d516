// infera-register: keeps a worker registered in etcd while it runs, for
// launchers of real engines (run it beside `vllm serve` or SGLang):
//   infera-register --etcd-endpoint http://127.0.0.1:2379 --id w0 \
//     --address 10.0.0.5:8000 --role decode --block-size 16 --kv-events tcp://10.0.0.5:5557
import { registerWorker, Registration } from "../runtime/etcd";
import { CliError, runCommand } from "../runtime/args";
import { badEventEndpoint } from "../runtime/config";
import { configureTransportSecurity } from "../runtime/transport-security";
import { Level, makeLogger } from "../runtime/log";
import { CLOSE_BUDGET_MS, closeStep, onShutdown } from "../runtime/shutdown";

export function startRegister(argv: string[]): Promise<void> {
  return runCommand("register", argv, async (p) => {
    const v = p.values;
    configureTransportSecurity(v);
    const log = makeLogger(v["log-level"] as Level, v["log-format"] as "json" | "text", { component: "register" });
    const kv = v["kv-events"] as string | null;
    if (kv) {
      const why = badEventEndpoint(kv);
      if (why) throw new CliError(`--kv-events: ${why}`);
    }
    const id = v.id as string;
    if (!/^[A-Za-z0-9_.:-]+$/.test(id)) throw new CliError(`--id: '${id}' may use letters, digits and _ . : - only`);
    const reg: Registration = {
      address: v.address as string,
      role: v.role as Registration["role"],
      block_size: v["block-size"] as number,
      kv_events: kv ?? undefined,
    };
    if (v["kv-replay"]) reg.kv_replay = v["kv-replay"] as string;
    const r = await registerWorker(
      v["etcd-endpoint"] as string,
      v["etcd-prefix"] as string,
      id,
      reg,
      v.ttl as number,
      log,
    );
    log("info", "registered", { id, registration: reg });
    // Bounded like the router's: a hung etcd or NATS does not keep the process up, a second signal ends it at once.
    onShutdown(log, CLOSE_BUDGET_MS + 1000, () =>
      closeStep(log, "registration close", () => r.close(), CLOSE_BUDGET_MS),
    );
  });
}

if (require.main === module) void startRegister(process.argv.slice(2));
