// Issue 26 items 5/6 over real ZMQ: exact topic match (a kv-events-canary
// topic is not ours; SGLang's epoch suffix is, and a new epoch is a restart),
// a flood of bad frames logged a few times a minute but counted one by one on
// the router and the bridge, and 64-bit sequence numbers logged exactly.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as zmq from "zeromq";
import { encode } from "@msgpack/msgpack";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { Bridge } from "../../njs/bridge";
import { freePort, sleep, waitFor } from "../harness";

const opened: { close(): Promise<void> }[] = [];
after(async () => {
  for (const o of opened.reverse()) await o.close().catch(() => undefined);
});

const seqFrame = (n: bigint) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(n);
  return b;
};
const stored = (hash: number, base: number) =>
  encode([0, [["BlockStored", [hash], null, Array.from({ length: 16 }, (_, i) => base + i), 16, null, "GPU"]], 0]);
const empty = () => encode([0, [], 0]);

async function publisher(): Promise<{ pub: zmq.Publisher; ep: string }> {
  const port = await freePort();
  const pub = new zmq.Publisher({ sendHighWaterMark: 100000, linger: 0 });
  await pub.bind(`tcp://127.0.0.1:${port}`);
  opened.push({ close: async () => pub.close() });
  return { pub, ep: `tcp://127.0.0.1:${port}` };
}

function router(ep: string, topic: string, lines: string[]): App {
  const a = new App(
    parseArgs(
      [
        "--workers",
        `127.0.0.1:9@${ep}`,
        "--health-interval-ms",
        "0",
        "--router-tokenizer-path",
        "none",
        "--kv-event-topic",
        topic,
      ],
      {},
    ),
    (l, m) => lines.push(`${l} ${m}`),
  );
  a.setWorkers(a.opts.workers);
  opened.push({ close: () => a.close() });
  return a;
}

/** Sends empty batches on the topic until the subscriber has joined (ZMQ's slow joiner); returns the next seq. */
async function join(pub: zmq.Publisher, topic: string, seen: () => boolean): Promise<bigint> {
  let seq = 0n;
  const end = Date.now() + 20000;
  while (!seen() && Date.now() < end) {
    await pub.send([topic, seqFrame(seq++), empty()]);
    await sleep(50);
  }
  assert.ok(seen(), "subscriber joined");
  return seq;
}

test("exact topic: kv-events-canary is ignored by a router on kv-events; SGLang's epoch suffix is ours and a new epoch is a restart", async () => {
  const { pub, ep } = await publisher();
  const lines: string[] = [];
  const a = router(ep, "kv-events", lines);
  const ek = a.router.worker("127.0.0.1:9")!.epochKey;
  let seq = await join(pub, "kv-events", () => a.state.mirror.sequence(ek) !== undefined);
  // The canary carries the next seq, the real topic the one after: a router that
  // takes the canary applies both; one that drops it sees a gap and the real block.
  await pub.send(["kv-events-canary", seqFrame(seq), stored(1001, 100)]);
  await pub.send(["kv-events", seqFrame(seq + 1n), stored(2001, 200)]);
  seq += 2n;
  await waitFor("real topic applied", async () => a.state.mirror.lookup(ek, "2001" as never) !== undefined, 10000);
  assert.equal(a.state.mirror.lookup(ek, "1001" as never), undefined, "the canary's block is not mirrored");
  assert.equal(
    lines.filter((l) => /ignores frames on topic 'kv-events-canary': --kv-event-topic is 'kv-events'/.test(l)).length,
    1,
    lines.join("\n"),
  );
  // A topic that merely starts like ours, or an empty epoch, is not ours either.
  await pub.send(["kv-events\u0000other", seqFrame(seq), stored(1002, 300)]);
  await pub.send(["kv-events\u0000sgl-kv-epoch=", seqFrame(seq), stored(1003, 400)]);
  // SGLang with a snapshot endpoint: "<topic>\0sgl-kv-epoch=<epoch>", barriers add "\0sgl-kv-snapshot=<id>".
  await pub.send(["kv-events\u0000sgl-kv-epoch=e1", seqFrame(seq), stored(3001, 500)]);
  await pub.send(["kv-events\u0000sgl-kv-epoch=e1\u0000sgl-kv-snapshot=b1", seqFrame(seq + 1n), empty()]);
  await waitFor("epoch e1 applied", async () => a.state.mirror.sequence(ek) === Number(seq + 1n), 10000);
  assert.ok(a.state.mirror.lookup(ek, "3001" as never) !== undefined);
  assert.equal(a.state.mirror.lookup(ek, "1002" as never), undefined);
  assert.equal(a.state.mirror.lookup(ek, "1003" as never), undefined);
  // Another epoch continuing the numbers is another publisher: the old blocks go.
  await pub.send(["kv-events\u0000sgl-kv-epoch=e2", seqFrame(seq + 2n), stored(3002, 600)]);
  await waitFor("epoch e2 applied", async () => a.state.mirror.lookup(ek, "3002" as never) !== undefined, 10000);
  assert.equal(a.state.mirror.lookup(ek, "3001" as never), undefined, "a new epoch drops the old publisher's blocks");
  assert.match(await a.metrics.registry.metrics(), /reason="engine_restart"\} 1/);
});

const N = 10000;

/** 10,000 bad frames over real ZMQ, in chunks the subscriber can take (no HWM drops). */
async function flood(pub: zmq.Publisher, topic: string, first: bigint, counted: () => Promise<number>): Promise<void> {
  const chunk = 500;
  for (let sent = 0; sent < N;) {
    for (let i = 0; i < chunk && sent < N; i++, sent++) {
      // Half with a payload that is not msgpack, half with a sequence frame of the wrong size.
      if (sent % 2 === 0) await pub.send([topic, seqFrame(first + BigInt(sent)), Buffer.from([0xc1, 0xff, 0x00])]);
      else await pub.send([topic, Buffer.from("bogus"), Buffer.from([0x90])]);
    }
    await waitFor(`${sent} bad frames counted`, async () => (await counted()) >= sent, 30000);
  }
}

const counterOf = (text: string, name: string) => {
  let n = 0;
  for (const m of text.matchAll(
    new RegExp(`^${name}\\{worker="127\\.0\\.0\\.1:9",reason="malformed"\\} (\\d+)$`, "gm"),
  ))
    n += Number(m[1]);
  return n;
};

test("10,000 bad KV frames: the router logs a few lines (sequence numbers exact) and counts 10,000", async (t) => {
  const { pub, ep } = await publisher();
  const lines: string[] = [];
  const a = router(ep, "", lines);
  const ek = a.router.worker("127.0.0.1:9")!.epochKey;
  await join(pub, "", () => a.state.mirror.sequence(ek) !== undefined);
  const t0 = Date.now();
  // 2^53 + 1: a double cannot hold it; the log must show it as sent.
  await flood(pub, "", 9007199254740993n, async () =>
    counterOf(await a.metrics.registry.metrics(), "infera_router_kv_event_errors_total"),
  );
  const secs = (Date.now() - t0) / 1000;
  assert.equal(counterOf(await a.metrics.registry.metrics(), "infera_router_kv_event_errors_total"), N);
  const refused = lines.filter((l) => /refused frame/.test(l));
  t.diagnostic(`router: ${N} bad frames in ${secs.toFixed(1)}s, ${refused.length} refused-frame log lines`);
  assert.ok(
    refused.length <= 3 * Math.ceil(secs / 60) + 1,
    `${refused.length} refused-frame lines in ${secs}s:\n${refused.join("\n")}`,
  );
  assert.match(refused[0], /seq=9007199254740993: /, "the first line names the frame's exact sequence number");
  await a.close();
  const all = lines.filter((l) => /kv-events/.test(l));
  assert.ok(all.length <= 8, `${all.length} kv-events lines:\n${all.join("\n")}`);
  const summary = lines.find((l) => /more line\(s\) suppressed/.test(l));
  assert.ok(
    summary &&
      new RegExp(
        `kv-events refused frame: ${N - refused.length} more line\\(s\\) suppressed .*127\\.0\\.0\\.1:9: ${N - refused.length}`,
      ).test(summary),
    summary,
  );
});

test("10,000 bad KV frames: the bridge logs a few lines and counts 10,000 in its /metrics", async (t) => {
  const { pub, ep } = await publisher();
  const lines: string[] = [];
  const deadPort = await freePort();
  const opts = parseArgs(
    ["--workers", `127.0.0.1:9@${ep}`, "--push-token", "t", "--nginx-push-url", `http://127.0.0.1:${deadPort}/push`],
    {},
    "bridge",
  );
  const b = await Bridge.create(opts, (l, m) => lines.push(`${l} ${m}`));
  opened.push({ close: () => b.close() });
  b.addWorker(opts.workers[0]);
  await join(
    pub,
    "",
    () => (b as unknown as { shadows: Record<string, { seq: number | null }> }).shadows["127.0.0.1:9"]?.seq !== null,
  );
  const t0 = Date.now();
  await flood(pub, "", 5n, async () => counterOf(await b.registry.metrics(), "infera_bridge_kv_event_errors_total"));
  const secs = (Date.now() - t0) / 1000;
  assert.equal(counterOf(await b.registry.metrics(), "infera_bridge_kv_event_errors_total"), N);
  const refused = lines.filter((l) => /refused frame/.test(l));
  t.diagnostic(`bridge: ${N} bad frames in ${secs.toFixed(1)}s, ${refused.length} refused-frame log lines`);
  assert.ok(
    refused.length >= 1 && refused.length <= 3 * Math.ceil(secs / 60) + 1,
    `${refused.length} refused-frame lines in ${secs}s:\n${refused.join("\n")}`,
  );
  await b.close();
  assert.ok(
    lines.some((l) => new RegExp(`${N - refused.length} more line\\(s\\) suppressed`).test(l)),
    lines.filter((l) => /kv-events/.test(l)).join("\n"),
  );
});
