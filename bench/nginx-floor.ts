// The nginx worker's CPU per request on one stack (real nginx, njs 0.8, one
// worker, the bridge's tokenizer helper and KV events, two zero-cost
// simulators), N requests of a kind one after the other in one window:
//   nginx    GET /infera-floor-404 (nginx's own 404: no njs at all, the control)
//   admin    GET /v1/admin/reservations (answered by njs itself)
//   small    a one-line chat request (routed, no tokenizer helper)
//   ext4k    an extending turn of a cached 4k-token conversation (helper)
//   ext112k  an extending turn of a cached 112k-token conversation (helper)
// "small" is the floor every routed request pays whatever its size.
//   floor112k  the same turn through what any njs router of it pays and no
//            design on the nginx side removes: a VM that reads the body, sends
//            it to the tokenizer helper and reads its (packed) answer, then
//            nginx proxies the body to a worker through the product's proxy
//            setup (first-byte filter, log-phase variable) in a second VM. No
//            parse, no pick, no guards (bench-only locations, FLOOR_JS below).
// The worker's CPU time is read from /proc/<pid>/schedstat (nanoseconds); where
// the kernel has none, from utime + stime (10 ms ticks: N requests resolve 10/N ms).
// --baseline-dist DIR: a second nginx (with its own bridge, on the same two
// simulators) runs another checkout's njs/dist, and every kind is measured on
// both in the same minute, the order alternating per round.
// --inflight K: K other conversations (--inflight-tokens each, 30k unless
// told, distinct) are in flight on every side for the whole run, so every
// kind is measured with K guards in flight (the simulators then decode at 20
// ms per token, which costs the measured requests wall time, not worker CPU).
// Both sides' requests, prompts and decoded tokens, must fit the two
// simulators' 60,000 blocks, or evictions land in the measured windows.
// Usage: node --import tsx bench/nginx-floor.ts [--n 20] [--rounds 2] [--dist DIR] [--baseline-dist DIR]
//        [--inflight K] [--inflight-tokens T]
import { freePort, nginx08, startSim, stopAll, waitFor, workerArg, sleep } from "../test/harness";
import {
  freeEngineArgs,
  mirrorSettled,
  NginxStack,
  startBridgeAt,
  startNginx1,
  textOfTokens,
  workerCpuMs,
} from "../test/nginx-stack";
import { optionReader } from "./args";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

const opt = optionReader(process.argv.slice(2));
const N = Math.min(200, Math.max(1, Number(opt("--n", "20"))));
const ROUNDS = Math.min(10, Math.max(1, Number(opt("--rounds", "2"))));
const dist = opt("--dist", "") || undefined;
const baseDist = opt("--baseline-dist", "") || undefined;
const INFLIGHT = Math.min(64, Math.max(0, Number(opt("--inflight", "0"))));
const INFLIGHT_TOKENS = Math.min(100000, Math.max(100, Number(opt("--inflight-tokens", "30000"))));
const KINDS = ["nginx", "admin", "small", "ext4k", "ext112k", "floor112k"] as const;

// The floor's content handler: the helper round trip the route makes, then the proxy location.
const FLOOR_JS = `function floor(r) {
  ngx.fetch(r.variables.infera_tokenizer_url, {
    method: "POST",
    body: r.requestText,
    headers: {
      "Content-Type": "application/json",
      "X-Infera-Endpoint": "chat",
      "X-Infera-Block-Size": "16",
      "X-Infera-Limits": "8388608,4096,512,64",
      "X-Infera-Root": "",
      "X-Infera-Answer": "packed",
    },
  })
    .then(function (res) {
      return res.text();
    })
    .then(function (text) {
      if (text.length < 1000) return r.return(500, "helper: " + text);
      r.variables.infera_upstream = r.args.u;
      r.internalRedirect("@floor_upstream");
    })
    .catch(function (e) {
      r.return(500, String(e));
    });
}
export default { floor: floor };
`;

/** The floor's locations; the first-byte filter as the bundle's config has it (a baseline from before the phases bundle has none by that name). */
function floorLocations(jsFile: string, phases: boolean): string {
  return `    location = /floor {
      js_import floor from ${jsFile};
      js_content floor.floor;
      js_fetch_timeout 2s;
      js_fetch_max_response_buffer_size 16m;
    }
    location @floor_upstream {
      proxy_pass http://$infera_upstream/v1/chat/completions;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
${phases ? "      js_header_filter inferap.firstByte;\n" : ""}    }
`;
}
type Kind = (typeof KINDS)[number];

const body = (content: string, more: { role: string; content: string }[] = []) =>
  JSON.stringify({ model: "m", max_tokens: 1, messages: [{ role: "user", content }, ...more] });

async function post(ng: NginxStack, b: string, where = "/v1/chat/completions"): Promise<void> {
  const r = await fetch(`${ng.url}${where}`, {
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
  const c0 = workerCpuMs(ng.workerPid);
  for (let i = 0; i < N; i++) await f(i);
  await sleep(50);
  return (workerCpuMs(ng.workerPid) - c0) / N;
}

interface Side {
  label: string;
  ng: NginxStack;
}

async function startSide(label: string, sims: Awaited<ReturnType<typeof startSim>>[], d?: string): Promise<Side> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up: bash scripts/njs08.sh");
  const port = await freePort();
  const jsFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "infera-floor-")), "floor.js");
  fs.writeFileSync(jsFile, FLOOR_JS);
  const ng = await startNginx1(
    fl,
    { tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize` },
    d,
    floorLocations(jsFile, !d || fs.existsSync(path.join(d, "infera-phases.js"))),
  );
  await startBridgeAt(workerArg(sims), `${ng.url}/_infera/push`, port);
  await waitFor(
    "fleet",
    async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === sims.length,
  );
  return { label, ng };
}

async function main(): Promise<void> {
  const simArgs = freeEngineArgs(60000, INFLIGHT ? 20 : 0);
  const sims = await Promise.all(["f0", "f1"].map((id) => startSim(id, simArgs)));
  const sides = [await startSide(dist || "this checkout", sims, dist)];
  if (baseDist) sides.push(await startSide(`baseline ${baseDist}`, sims, baseDist));
  const conv = textOfTokens("convX", 112000);
  const k4 = textOfTokens("k4", 4000);
  // Both conversations cached on a simulator; every side's mirror has their KV events.
  for (const s of sides) await post(s.ng, body(textOfTokens("warm", 3000)));
  await post(sides[0].ng, body(conv));
  await post(sides[0].ng, body(k4));
  for (const s of sides) await mirrorSettled(s.ng, sims);
  const turn = (text: string, i: number) =>
    body(text, [
      { role: "assistant", content: "Noted." },
      { role: "user", content: "And the next step? " + i },
    ]);
  // The simulator that cached the conversation: the floor proxies the turn there, as the route does.
  let holder = sims[0].address;
  let most = -1;
  for (const sim of sims) {
    const v = (await (await fetch(`${sides[0].ng.url}/v1/admin/cache-view/${sim.address}`)).json()) as {
      block_count: number;
    };
    if (v.block_count > most) {
      most = v.block_count;
      holder = sim.address;
    }
  }
  // The requests in flight: each holds its guards until it ends (10,000 tokens
  // at 20 ms, past the run). Not streamed, so that no chunk passes the worker
  // while a kind is measured.
  const stop = new AbortController();
  const streams: Promise<unknown>[] = [];
  for (const s of sides)
    for (let k = 0; k < INFLIGHT; k++) {
      const b = JSON.stringify({
        model: "m",
        max_tokens: 10000,
        messages: [{ role: "user", content: textOfTokens("held" + k, INFLIGHT_TOKENS) }],
      });
      streams.push(
        fetch(`${s.ng.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: b,
          signal: stop.signal,
        })
          .then((res) => res.text())
          .catch(() => ""),
      );
    }
  // Each holds its main guard and its queued-prefill guard (its prompt is not
  // cached anywhere) until its answer's first byte, at its end.
  if (INFLIGHT) {
    for (const s of sides)
      await waitFor(
        `${s.label}: ${2 * INFLIGHT} guards open`,
        async () =>
          ((await (await fetch(`${s.ng.url}/v1/admin/reservations`)).json()) as { open_guards: number }).open_guards >=
          2 * INFLIGHT,
      );
    await sleep(1000);
  }
  const send: Record<Kind, (ng: NginxStack, i: number) => Promise<void>> = {
    nginx: async (ng) => {
      await (await fetch(`${ng.url}/infera-floor-404`)).text();
    },
    admin: async (ng) => {
      await (await fetch(`${ng.url}/v1/admin/reservations`)).text();
    },
    small: (ng, i) => post(ng, body("hello there " + i)),
    ext4k: (ng, i) => post(ng, turn(k4, i)),
    ext112k: (ng, i) => post(ng, turn(conv, i)),
    floor112k: (ng, i) => post(ng, turn(conv, i), "/floor?u=" + holder),
  };
  const sums = sides.map(() => Object.fromEntries(KINDS.map((k) => [k, 0])) as Record<Kind, number>);
  for (let round = 0; round < ROUNDS; round++) {
    for (const k of KINDS) {
      const order = round % 2 === 0 ? sides.map((_, i) => i) : sides.map((_, i) => sides.length - 1 - i);
      for (const i of order) sums[i][k] += await perRequest(sides[i].ng, (j) => send[k](sides[i].ng, round * N + j));
    }
  }
  stop.abort();
  await Promise.all(streams);
  const rows = sides.map((s, i) => ({
    bundle: s.label,
    n: N,
    rounds: ROUNDS,
    inflight: INFLIGHT,
    ...Object.fromEntries(KINDS.map((k) => [k, Math.round((sums[i][k] / ROUNDS) * 1000) / 1000])),
  }));
  for (const r of rows) console.log(JSON.stringify(r));
  console.log(`\n| bundle | ${KINDS.join(" | ")} |\n|---|${KINDS.map(() => "---:").join("|")}|`);
  for (const r of rows)
    console.log(
      `| ${r.bundle} | ${KINDS.map((k) => (r as unknown as Record<string, number>)[k].toFixed(2)).join(" | ")} |`,
    );
  console.log(
    `\n(worker CPU ms per request, mean of ${N} x ${ROUNDS} rounds${INFLIGHT ? `, ${INFLIGHT} streams in flight per side` : ""})`,
  );
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
