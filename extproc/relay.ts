// infera-kv-relay: subscribes to a worker's ZMQ KV-event PUB and republishes
// every batch, byte for byte, on a NATS subject (run it beside each engine
// when the router uses --kv-event-transport nats).
import * as zmq from "zeromq";
import { natsConnect, natsPublish } from "./nats";
import { decodeSeq } from "./events";
import { makeLogger } from "./app";

export async function runRelay(zmqEndpoint: string, natsUrl: string, subject: string, topic = ""): Promise<{ close(): Promise<void> }> {
  const log = makeLogger("info");
  const nc = await natsConnect(natsUrl, log, "infera-kv-relay");
  const sock = new zmq.Subscriber({ reconnectInterval: 200 });
  sock.connect(zmqEndpoint);
  sock.subscribe(topic);
  (async () => {
    for await (const frames of sock) {
      try {
        const seq = decodeSeq(frames[frames.length - 2]);
        natsPublish(nc, subject, seq, frames[frames.length - 1]);
      } catch (e) {
        log("warn", `relay dropped a frame: ${(e as Error).message}`);
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

if (require.main === module) {
  const [zmqEndpoint, natsUrl, subject] = process.argv.slice(2);
  if (!zmqEndpoint || !natsUrl || !subject) {
    process.stderr.write("usage: infera-kv-relay <zmq-endpoint> <nats-url> <subject>\n");
    process.exit(2);
  }
  runRelay(zmqEndpoint, natsUrl, subject).then(() => process.stderr.write(`relaying ${zmqEndpoint} -> ${natsUrl} ${subject}\n`));
}
