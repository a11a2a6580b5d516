// The nginx worker's CPU per request on one stack (real nginx, njs 0.8, one
// worker, the bridge's tokenizer helper and KV events, two zero-cost
// simulators), N requests of a kind one after the other in one /proc window
// (10 ms ticks: N requests resolve 10/N ms per request):
//   admin    GET /v1/admin/reservations (answered by njs itself)
//   small    a one-line chat request (routed, no tokenizer helper)
//   ext4k    an extending turn of a cached 4k-token conversation (helper)
//   ext112k  an extending turn of a cached 112k-token conversation (helper)
// "small" is the floor every routed request pays whatever its size.
// Usage: node --import tsx bench/nginx-floor.ts [--n 20] [--dist DIR]   (DIR: another checkout's njs/dist)
import { freePort, nginx08, startSim, stopAll, waitFor, workerArg, sleep } from "../test/harness";
import {
  cpuMs,
  freeEngineArgs,
  mirrorSettled,
  NginxStack,
  startBridgeAt,
  startNginx1,
  textOfTokens,
} from "../test/nginx-stack";
import { optionReader } from "./args";

const opt = optionReader(process.argv.slice(2));
const N = Math.min(200, Math.max(1, Number(opt("--n", "20"))));
const dist = opt("--dist", "") || undefined;
const body = (content: string, more: { role: string; content: string }[] = []) =>
  JSON.stringify({ model: "m", max_tokens: 1, messages: [{ role: "user", content }, ...more] });

async function post(ng: NginxStack, b: string): Promise<void> {
  const r = await fetch(`${ng.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: b,
  });
  await r.text();
  if (r.status !== 200) throw new Error(`HTTP ${r.status}`);
}

/** Worker CPU ms per request over N requests. */
async function perRequest(ng: NginxStack, f: (i: number) => Promise<void>): Promise<number> {
  await sleep(50);
  const c0 = cpuMs(ng.workerPid);
  for (let i = 0; i < N; i++) await f(i);
  await sleep(50);
  return (cpuMs(ng.workerPid) - c0) / N;
}

async function main(): Promise<void> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up: bash scripts/njs08.sh");
  const sims = await Promise.all(["f0", "f1"].map((id) => startSim(id, freeEngineArgs(60000))));
  const port = await freePort();
  const ng = await startNginx1(fl, { tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize` }, dist);
  await startBridgeAt(workerArg(sims), `${ng.url}/_infera/push`, port);
  await waitFor(
    "fleet",
    async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === sims.length,
  );
  await post(ng, body(textOfTokens("warm", 3000)));
  const conv = textOfTokens("convX", 112000);
  const k4 = textOfTokens("k4", 4000);
  await post(ng, body(conv));
  await post(ng, body(k4));
  await mirrorSettled(ng, sims);
  const turn = (text: string, i: number) =>
    body(text, [
      { role: "assistant", content: "Noted." },
      { role: "user", content: "And the next step? " + i },
    ]);
  const admin = await perRequest(ng, async () => {
    await (await fetch(`${ng.url}/v1/admin/reservations`)).text();
  });
  const small = await perRequest(ng, (i) => post(ng, body("hello there " + i)));
  const ext4k = await perRequest(ng, (i) => post(ng, turn(k4, i)));
  const ext112k = await perRequest(ng, (i) => post(ng, turn(conv, i)));
  console.log(JSON.stringify({ bundle: dist || "this checkout", n: N, admin, small, ext4k, ext112k }));
}

main().then(
  async () => {
    await stopAll();
    process.exit(0);
  },
  async (e) => {
    process.stderr.write(`bench nginx-floor: ${e.stack || e.message}\n`);
    await stopAll();
    process.exit(1);
  },
);
