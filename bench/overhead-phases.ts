// Where the router's added latency goes, phase by phase, without Envoy: real
// router processes (cli/router.ts, this checkout and each --baseline REV),
// each driven by a gRPC client that sends Envoy's messages for one streamed
// chat request (request headers with an x-request-id, the buffered body,
// response headers, two response body chunks). One exchange at a time, the
// sides rotated request by request. Per side: p50 time from sending each
// message to its answer for the three that gate the client's first byte
// (request headers, request body = the routing decision, first response body
// chunk = first-token bookkeeping), and the router process's CPU per exchange
// (/proc/<pid>/stat, client excluded). bench/overhead.ts measures the same
// routers through Envoy; this one says which phase a difference comes from.
// Usage: node --import tsx bench/overhead-phases.ts [--rounds N] [--long] [--baseline REV]...
import { baselineRouterEntry } from "./baseline";
import { cpuMs, nullEngine, reporter } from "./overhead";
import { freePort, longText, startRouter, stopAll } from "../test/harness";
import { processStream, reqBody, reqHeaders, respBody, respHeaders } from "../test/extproc-client";
import * as grpc from "@grpc/grpc-js";
import { runBench } from "./run-bench";

const num = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const ROUNDS = Math.min(20000, num("--rounds", 3000));
const WARM = Math.min(20000, num("--warm", 2000));

interface Side {
  name: string;
  pid: number;
  client: grpc.Client;
  t: { headers: number[]; body: number[]; first: number[] };
}

async function main() {
  const revs: string[] = [];
  process.argv.forEach((a, i) => a === "--baseline" && revs.push(process.argv[i + 1]));
  const long = process.argv.includes("--long");
  const enginePort = await freePort();
  const engine = await nullEngine(enginePort);
  const args = ["--workers", `127.0.0.1:${enginePort}`, "--log-level", "warn"];
  const sides: Side[] = [];
  const entries: [string, Record<string, string>][] = [["this checkout", {}]];
  for (const r of revs) entries.push([`at ${r}`, { INFERA_ROUTER_ENTRY: baselineRouterEntry(r) }]);
  for (const [name, env] of entries) {
    const r = await startRouter(args, env);
    const client = new grpc.Client(`127.0.0.1:${r.grpcPort}`, grpc.credentials.createInsecure());
    sides.push({ name, pid: r.proc.child.pid!, client, t: { headers: [], body: [], first: [] } });
  }
  const text = long ? longText("phases", 370) : "What is the capital of France?";
  let n = 0;
  const one = async (s: Side, keep: boolean) => {
    const st = processStream(s.client);
    const id = `phases-${n}`;
    let t0 = performance.now();
    st.send(
      reqHeaders("/v1/chat/completions", "POST", false, { "content-type": "application/json", "x-request-id": id }),
    );
    await st.next();
    const th = performance.now() - t0;
    const body = JSON.stringify({
      model: "m",
      stream: true,
      max_tokens: 16,
      messages: [{ role: "user", content: `${text} #${n++}` }],
    });
    t0 = performance.now();
    st.send(reqBody(body));
    const a = await st.next();
    const tb = performance.now() - t0;
    if (a.response.case !== "requestBody") throw new Error(`${s.name}: answered ${a.response.case}`);
    st.send(respHeaders());
    await st.next();
    t0 = performance.now();
    st.send(respBody(false));
    await st.next();
    const tf = performance.now() - t0;
    st.send(respBody(true));
    await st.next();
    st.call.end();
    if (keep) {
      s.t.headers.push(th);
      s.t.body.push(tb);
      s.t.first.push(tf);
    }
  };
  for (let i = 0; i < WARM; i++) for (const s of sides) await one(s, false);
  const cpu0 = sides.map((s) => cpuMs(s.pid));
  for (let i = 0; i < ROUNDS; i++)
    for (let k = 0; k < sides.length; k++) await one(sides[(i + k) % sides.length], true);
  const cpu = sides.map((s, i) => (cpuMs(s.pid) - cpu0[i]) / ROUNDS);
  const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const { say, save } = reporter();
  say(
    `Router phases, ${new Date().toISOString()}, node ${process.version}; ${long ? "~4k-token" : "short"} prompt, ${ROUNDS} exchanges per side after ${WARM} warm-up, sides rotated per request`,
  );
  say(
    `command: node --import tsx bench/overhead-phases.ts --rounds ${ROUNDS} --warm ${WARM}${long ? " --long" : ""}${revs.map((r) => ` --baseline ${r}`).join("")}\n`,
  );
  say(
    "| router | request headers p50 ms | request body (decision) p50 ms | first response chunk p50 ms | sum | router CPU ms/exchange |",
  );
  say("|---|---:|---:|---:|---:|---:|");
  sides.forEach((s, i) => {
    const h = p50(s.t.headers);
    const b = p50(s.t.body);
    const f = p50(s.t.first);
    say(
      `| ${s.name} | ${h.toFixed(3)} | ${b.toFixed(3)} | ${f.toFixed(3)} | ${(h + b + f).toFixed(3)} | ${cpu[i].toFixed(3)} |`,
    );
  });
  save();
  for (const s of sides) s.client.close();
  engine.close();
  await stopAll();
}

runBench(main);
