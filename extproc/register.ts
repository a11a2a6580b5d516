// infera-register: keeps a worker registered in etcd while it runs, for
// launchers of real engines (run it beside `vllm serve` or SGLang):
//   infera-register --etcd-endpoint http://127.0.0.1:2379 --id w0 \
//     --address 10.0.0.5:8000 --role decode --block-size 16 --kv-events tcp://10.0.0.5:5557
import { registerWorker, Registration } from "./etcd";

async function main(): Promise<void> {
  const a = process.argv.slice(2);
  const get = (f: string, d?: string) => {
    const i = a.indexOf(f);
    return i >= 0 ? a[i + 1] : d;
  };
  const id = get("--id");
  const address = get("--address");
  if (!id || !address) {
    process.stderr.write("usage: infera-register --id ID --address host:port [--role mixed|prefill|decode] [--block-size 16] [--kv-events tcp://…|subject] [--kv-replay tcp://…] [--etcd-endpoint URL] [--etcd-prefix /infera/workers/] [--ttl 5]\n");
    process.exit(2);
  }
  const reg: Registration = { address, role: (get("--role", "mixed") as Registration["role"]), block_size: Number(get("--block-size", "16")), kv_events: get("--kv-events"), kv_replay: get("--kv-replay") };
  const r = await registerWorker(get("--etcd-endpoint", "http://127.0.0.1:2379")!, get("--etcd-prefix", "/infera/workers/")!, id, reg, Number(get("--ttl", "5")));
  process.stderr.write(`registered ${id} -> ${JSON.stringify(reg)}\n`);
  const stop = () => r.close().then(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
