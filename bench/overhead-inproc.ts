// The router's ext_proc work per phase, in one process, without gRPC or
// Envoy: the real App and the real ext_proc handler (whatever extproc/server.ts
// registers for Process) driven by an in-memory call that plays Envoy's five
// messages for one streamed chat request (request headers, the buffered body,
// response headers, two body chunks), one exchange at a time. Per phase, p50
// of the time from the message to the end of its turn (everything the event
// loop runs for it before the HTTP/2 session could flush the answer: its
// synchronous work and its microtasks), and for the body and the first chunk
// also to the answer's write; CPU per exchange; promises made per exchange
// (each one costs more while AsyncLocalStorage tags log lines). With
// --concurrency C, C exchanges at a time, CPU per exchange only (cold prompts
// then wait for prefill admission, as at line rate).
// Each side runs in its own process (this checkout, and a checkout of each
// --baseline REV), in turn, --repeat times, so both see the same machine.
// Usage: node --import tsx bench/overhead-inproc.ts [--rounds N] [--warm N] [--long] [--concurrency C] [--repeat R] [--baseline REV]... [--extra "FLAGS" (this checkout's router only)]
import { execFileSync } from "child_process";
import { EventEmitter } from "events";
import * as async_hooks from "async_hooks";
import * as path from "path";
import { toBinary } from "@bufbuild/protobuf";
import { baselineRouterEntry } from "./baseline";
import { nullEngine, reporter } from "./overhead";
import { freePort, longText } from "../test/harness";

const num = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const str = (name: string) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : null;
};
const ROUNDS = Math.min(50000, num("--rounds", 3000));
const WARM = Math.min(50000, num("--warm", 3000));
const REPEAT = Math.min(10, num("--repeat", 2));
const CONC = Math.min(64, num("--concurrency", 1));
const LONG = process.argv.includes("--long");
// Router flags for this checkout's side only (a variant, e.g. a default turned off; baselines run their defaults).
const EXTRA = (str("--extra") || "").split(" ").filter(Boolean);

/** An ext_proc call held in memory: what the handler writes is kept, in order. */
class MemoryCall extends EventEmitter {
  writable = true;
  readonly peer = { trusted: true, address: "127.0.0.1" };
  readonly got: unknown[] = [];
  /** performance.now() of the last write. */
  wroteAt = 0;
  write(m: unknown) {
    this.wroteAt = performance.now();
    this.got.push(m);
  }
  end() {
    this.writable = false;
  }
  fail() {
    this.writable = false;
  }
  hold() {
    return true;
  }
  releaseHeld() {}
}

/** The end of the current turn: setImmediate runs after the turn's microtasks (and after an HTTP/2 flush). */
const turn = () => new Promise<void>((r) => setImmediate(r));

/** One side, in this process: the tree at root. Prints one JSON line. */
async function side(root: string): Promise<void> {
  // That tree's own modules, loaded as the router loads them (CommonJS through tsx).
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const r = (p: string) => require(path.join(root, p));
  const { GrpcServer } = r("extproc/grpc.ts");
  const { App } = r("runtime/app.ts");
  const { parseArgs } = r("runtime/config.ts");
  const { makeLogger } = r("runtime/log.ts");
  const { startExtProc } = r("extproc/server.ts");
  const { decodeRequest } = r("extproc/wire.ts");
  const { ProcessingRequestSchema } = r("extproc/gen/envoy/service/ext_proc/v3/external_processor_pb.ts");
  const cl = r("test/extproc-client.ts");
  let handler: ((c: MemoryCall) => void) | null = null;
  const add = GrpcServer.prototype.add;
  GrpcServer.prototype.add = function (p: string, m: { handler: (c: MemoryCall) => void }) {
    if (p.endsWith("ExternalProcessor/Process")) handler = m.handler;
    return add.call(this, p, m);
  };
  const port = await freePort();
  const engine = await nullEngine(port);
  const own = root === path.resolve(__dirname, "..");
  const flags = ["--workers", `127.0.0.1:${port}`, "--log-level", "warn", ...(own ? EXTRA : [])];
  // As cli/router.ts makes it: App.create and the real logger (at warn, so nothing is written).
  const opts = parseArgs(flags, {});
  const app = await App.create(opts, makeLogger(opts.logLevel, opts.logFormat, { component: "router" }));
  app.setWorkers(app.opts.workers);
  app.setSynced?.(true);
  const srv = await startExtProc(app, "127.0.0.1", 0);
  app.startHealthChecks?.();
  app.startEngineMetrics?.();
  await new Promise((res) => setTimeout(res, 300));
  if (!handler) throw new Error("no ext_proc handler registered");
  const h = handler as (c: MemoryCall) => void;
  const enc = (m: Parameters<typeof toBinary>[1]) => decodeRequest(toBinary(ProcessingRequestSchema, m));
  const text = LONG ? longText("inproc", 370) : "What is the capital of France?";
  const H = enc(
    cl.reqHeaders("/v1/chat/completions", "POST", false, {
      "content-type": "application/json",
      "x-request-id": "inproc",
    }),
  );
  const RH = enc(cl.respHeaders());
  const B0 = enc(cl.respBody(false));
  const B1 = enc(cl.respBody(true));
  const t: { [phase: string]: number[] } = {
    headers: [],
    body: [],
    bodyWritten: [],
    respHeaders: [],
    first: [],
    firstWritten: [],
  };
  let n = 0;
  // Waits (bounded) until the call holds k answers; a cold prompt may wait for another's first token.
  const answers = async (c: MemoryCall, k: number) => {
    for (let i = 0; i < 100000 && c.got.length < k; i++) await turn();
    if (c.got.length < k) throw new Error(`no answer ${k}`);
  };
  const one = async (keep: boolean) => {
    const c = new MemoryCall();
    h(c);
    const step = async (m: unknown, k: number, phase: string, written?: string) => {
      const t0 = performance.now();
      c.emit("data", m);
      await turn();
      const done = performance.now() - t0;
      if (c.got.length < k) await answers(c, k);
      if (keep) {
        t[phase].push(done);
        if (written) t[written].push(c.wroteAt - t0);
      }
    };
    await step(H, 1, "headers");
    const body = JSON.stringify({
      model: "m",
      stream: true,
      max_tokens: 16,
      messages: [{ role: "user", content: `${text} #${n++}` }],
    });
    await step(enc(cl.reqBody(body)), 2, "body", "bodyWritten");
    await step(RH, 3, "respHeaders");
    await step(B0, 4, "first", "firstWritten");
    c.emit("data", B1);
    await answers(c, 5);
    c.emit("end");
    c.emit("close");
  };
  const run = (k: number) =>
    Promise.all(
      Array.from({ length: CONC }, async () => {
        for (let i = 0; i < Math.ceil(k / CONC); i++) await one(CONC === 1);
      }),
    );
  await run(WARM);
  let promises = 0;
  const hook = async_hooks
    .createHook({
      init(_id, type) {
        if (type === "PROMISE") promises++;
      },
    })
    .enable();
  const P = 200;
  for (let i = 0; i < P; i++) await one(false);
  hook.disable();
  for (const k in t) t[k] = [];
  const c0 = process.cpuUsage();
  await run(ROUNDS);
  const cpu = process.cpuUsage(c0);
  const p50 = (xs: number[]) => (xs.length ? xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)] * 1000 : NaN);
  const out: { [k: string]: number } = {};
  for (const k in t) out[k] = p50(t[k]);
  out.cpu = (cpu.user + cpu.system) / ROUNDS;
  // The promise count includes this bench's own (one per await of a turn).
  out.promises = promises / P;
  console.log(JSON.stringify(out));
  srv.server.forceShutdown();
  engine.close();
  await app.close();
}

async function main(): Promise<void> {
  const si = process.argv.indexOf("--side");
  if (si > 0) return side(process.argv[si + 1]);
  const revs: string[] = [];
  process.argv.forEach((a, i) => a === "--baseline" && revs.push(process.argv[i + 1]));
  const root = path.resolve(__dirname, "..");
  const sides: [string, string][] = [["this checkout", root]];
  for (const r of revs) sides.push([`at ${r}`, path.dirname(path.dirname(baselineRouterEntry(r)))]);
  const pass = process.argv.slice(2).filter((a, i, all) => a !== "--baseline" && all[i - 1] !== "--baseline");
  const res: { [side: string]: { [k: string]: number }[] } = {};
  for (let k = 0; k < REPEAT; k++)
    for (const [name, dir] of sides) {
      const line = execFileSync(process.execPath, ["--import", "tsx", __filename, ...pass, "--side", dir], {
        cwd: root,
        encoding: "utf8",
        timeout: 600_000,
      });
      (res[name] ??= []).push(JSON.parse(line.trim().split("\n").pop()!));
    }
  const { say, save } = reporter();
  const med = (xs: number[]) => xs.slice().sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
  say(
    `Router ext_proc work in process, ${new Date().toISOString()}, node ${process.version}; ${LONG ? "~4k-token" : "short"} prompt, ${CONC > 1 ? `concurrency ${CONC}, ` : ""}${ROUNDS} exchanges per side after ${WARM} warm-up, ${REPEAT} runs per side in turn (each figure: the median over the runs of the run's p50)`,
  );
  say(
    `command: node --import tsx bench/overhead-inproc.ts --rounds ${ROUNDS} --warm ${WARM} --repeat ${REPEAT}${LONG ? " --long" : ""}${CONC > 1 ? ` --concurrency ${CONC}` : ""}${EXTRA.length ? ` --extra "${EXTRA.join(" ")}"` : ""}${revs.map((r) => ` --baseline ${r}`).join("")}\n`,
  );
  if (CONC > 1) {
    say("| router | CPU µs/exchange |");
    say("|---|---:|");
    for (const [name] of sides) say(`| ${name} | ${med(res[name].map((x) => x.cpu)).toFixed(1)} |`);
  } else {
    say(
      "| router | request headers µs | request body µs (to its answer) | response headers µs | first chunk µs (to its answer) | CPU µs/exchange | promises/exchange |",
    );
    say("|---|---:|---:|---:|---:|---:|---:|");
    for (const [name] of sides) {
      const m = (k: string) => med(res[name].map((x) => x[k])).toFixed(1);
      say(
        `| ${name} | ${m("headers")} | ${m("body")} (${m("bodyWritten")}) | ${m("respHeaders")} | ${m("first")} (${m("firstWritten")}) | ${m("cpu")} | ${m("promises")} |`,
      );
    }
  }
  save();
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
