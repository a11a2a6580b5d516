// infera-kv-relay: subscribes to a worker's ZMQ KV-event PUB and republishes
// every batch, byte for byte, on a NATS subject (run it beside each engine
// when the router uses --kv-event-transport nats).
import * as zmq from "zeromq";
import { natsConnect, natsPublish } from "../runtime/nats";
import { decodeSeq, parseTopic } from "../runtime/events";
import { Level, Logger, makeLogger } from "../runtime/log";
import { CLOSE_BUDGET_MS, closeStep, onShutdown } from "../runtime/shutdown";
import { CliError, runCommand } from "../runtime/args";
import { badEventEndpoint } from "../runtime/config";
import { configureTransportSecurity } from "../runtime/transport-security";

export async function runRelay(
  zmqEndpoint: string,
  natsUrl: string,
  subject: string,
  topic = "",
  log: Logger = makeLogger("info"),
): Promise<{ close(): Promise<void> }> {
  const nc = await natsConnect(natsUrl, log, "infera-kv-relay");
  const sock = new zmq.Subscriber({ reconnectInterval: 200 });
  sock.connect(zmqEndpoint);
  sock.subscribe(topic);
  (async () => {
    for await (const frames of sock) {
      try {
        // The subscription is a prefix filter: relay only our topic (SGLang's epoch suffix included).
        if (frames.length === 3 && !parseTopic(frames[0], topic)) continue;
        const seq = decodeSeq(frames[frames.length - 2]);
        natsPublish(nc, subject, seq, frames[frames.length - 1]);
      } catch (e) {
        log("warn", "relay dropped a frame", { error: (e as Error).message });
      }
    }
  })().catch(() => undefined);
  return {
    async close() {
      sock.close();
      await nc.drain().catch(() => undefined);
    },
  };
}

export function startRelay(argv: string[]): Promise<void> {
  return runCommand("relay", argv, async (p) => {
    const v = p.values;
    configureTransportSecurity(v);
    const log = makeLogger(v["log-level"] as Level, v["log-format"] as "json" | "text", { component: "relay" });
    const ep = v["zmq-endpoint"] as string;
    const why = /^[a-z]+:\/\//.test(ep) ? badEventEndpoint(ep) : `'${ep}' needs tcp://host:port or ipc://path`;
    if (why) throw new CliError(`--zmq-endpoint: ${why}`);
    const r = await runRelay(
      v["zmq-endpoint"] as string,
      v["nats-url"] as string,
      v.subject as string,
      v["kv-event-topic"] as string,
      log,
    );
    log("info", "relaying", { from: v["zmq-endpoint"], to: v["nats-url"], subject: v.subject });
    // Bounded like the router's: a hung NATS does not keep the process up, a second signal ends it at once.
    onShutdown(log, CLOSE_BUDGET_MS + 1000, () => closeStep(log, "relay close", () => r.close(), CLOSE_BUDGET_MS));
  });
}

if (require.main === module) void startRelay(process.argv.slice(2));
