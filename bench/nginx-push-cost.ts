// What one KV-event push costs the nginx worker that applies it, by the
// number of blocks it stores: nginx with the project's config and one worker
// process, a fleet of one (pushed by hand, no bridge), and pushes of fresh
// chains of n blocks (16 tokens each) with the bridge's hashes attached (as
// the bridge sends them: njs/kv-annotate.ts), their worker CPU read from
// /proc/<pid>/schedstat. The "0" row is an events push with no events (the
// events handler's fixed cost: its VM, the token, the body, the sequence
// checks, the answer); the "engine" row an engine push with no pages (the
// same through infera.js's push with the router built). Two rows split the
// fixed cost: "403" is a push with a wrong token (the VM, its bundle's top
// level and the token check), "nginx" a request nginx answers itself (404,
// no njs).
//
// --dist DIR[,DIR...]: other bundle directories (baseline builds), each on an
// nginx of its own beside this checkout's, measured in turn in every round.
//
// Usage: node --import tsx bench/nginx-push-cost.ts [--sizes nginx,403,engine,0,1,16,64,256] [--n 40] [--rounds 2] [--dist DIR,...]
import { nginx08, stopAll } from "../test/harness";
import { startNginx1, workerCpuMs } from "../test/nginx-stack";
import { KvAnnotator } from "../njs/kv-annotate";
import { KvEvent } from "../core/kvevents";
import { runBench } from "./run-bench";
import { optionReader } from "./args";

const argv = process.argv.slice(2);
const opt = optionReader(argv);
const ENGINE = -1;
const BAD_TOKEN = -2;
const NGINX = -3;
const NAMED: Record<string, number> = { engine: ENGINE, "403": BAD_TOKEN, nginx: NGINX };
const LABEL: Record<number, string> = {
  [ENGINE]: "engine (no pages)",
  [BAD_TOKEN]: "403 (wrong token)",
  [NGINX]: "nginx's own 404 (no njs)",
};
const sizes = opt("--sizes", "nginx,403,engine,0,1,16,64,256")
  .split(",")
  .map((x) => (x.trim() in NAMED ? NAMED[x.trim()] : Number(x)));
const n = Math.min(500, Math.max(1, Number(opt("--n", "40"))));
const rounds = Math.min(10, Math.max(1, Number(opt("--rounds", "2"))));
const dists = opt("--dist", "")
  .split(",")
  .filter((x) => x.trim() !== "");

let pseq = Date.now() * 1000;
async function push(url: string, body: Record<string, unknown>): Promise<void> {
  if (body.nginx) {
    const r = await fetch(`${url}/nothing-here`);
    await r.text();
    if (r.status !== 404) throw new Error(`GET /nothing-here: ${r.status}`);
    return;
  }
  const r = await fetch(`${url}/_infera/push`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-infera-push-token": body.badToken ? "wrong" : "test-token" },
    body: JSON.stringify({ ...body, pseq: ++pseq }),
  });
  const t = await r.text();
  const want = body.badToken ? 403 : 200;
  if (r.status !== want) throw new Error(`push: ${r.status} ${t.slice(0, 200)}`);
}

interface Side {
  name: string;
  url: string;
  pid: number;
  body: (blocks: number) => Record<string, unknown>;
  acc: Record<number, number[]>;
}

async function startSide(fl: NonNullable<ReturnType<typeof nginx08>>, dist?: string): Promise<Side> {
  const ng = await startNginx1(fl, {}, dist);
  await push(ng.url, { type: "workers", workers: [{ id: "w0", address: "127.0.0.1:9", role: "mixed" }] });
  const ann = new KvAnnotator();
  let seq = 0;
  let eh = 1;
  let chain = 0;
  const batch = (blocks: number): KvEvent[] => {
    const c = chain++;
    const hashes: string[] = [];
    const tokens: number[] = [];
    for (let i = 0; i < blocks; i++) {
      hashes.push(String(eh++));
      for (let k = 0; k < 16; k++) tokens.push(1000 + ((c * 7919 + i * 131 + k) % 50000));
    }
    return [{ type: "BlockStored", hashes, parent: null, tokens, blockSize: 16 } as KvEvent];
  };
  const body = (blocks: number): Record<string, unknown> => {
    if (blocks === NGINX) return { nginx: true };
    if (blocks === BAD_TOKEN) return { type: "events", worker: "w0", seq: 0, events: [], badToken: true };
    if (blocks === ENGINE) return { type: "engine", pages: {} };
    const events = blocks ? batch(blocks) : [];
    const s = ++seq;
    ann.annotate("w0", s, events);
    return { type: "events", worker: "w0", seq: s, events };
  };
  const acc: Record<number, number[]> = {};
  for (const b of sizes) acc[b] = [];
  return { name: dist || "this checkout", url: ng.url, pid: ng.workerPid, body, acc };
}

async function main(): Promise<void> {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up (bash scripts/njs08.sh)");
  const sides: Side[] = [await startSide(fl)];
  for (const d of dists) sides.push(await startSide(fl, d));
  for (let r = 0; r < rounds; r++)
    for (const b of r % 2 ? [...sizes].reverse() : sizes)
      for (const side of r % 2 ? [...sides].reverse() : sides) {
        const bodies = Array.from({ length: n }, () => side.body(b));
        const c0 = workerCpuMs(side.pid);
        for (const x of bodies) await push(side.url, x);
        side.acc[b].push((workerCpuMs(side.pid) - c0) / n);
      }
  const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / xs.length;
  const head = ["| blocks per push |", "|---:|"];
  for (const side of sides) {
    head[0] += ` ${side.name}: worker CPU ms per push | per block ms |`;
    head[1] += "---:|---:|";
  }
  const rows = head.slice();
  for (const b of sizes) {
    let row = `| ${b < 0 ? LABEL[b] : String(b)} |`;
    for (const side of sides) {
      const m = mean(side.acc[b]);
      const base = sizes.includes(0) ? mean(side.acc[0]) : 0;
      row += ` ${m.toFixed(3)} | ${b > 0 ? ((m - base) / b).toFixed(4) : "–"} |`;
    }
    rows.push(row);
  }
  await stopAll();
  process.stdout.write(
    `nginx-push-cost, ${new Date().toISOString()}, ${n} pushes x ${rounds} rounds per size and side; command: node --import tsx bench/nginx-push-cost.ts ${argv.join(" ")}\n\n` +
      rows.join("\n") +
      "\n",
  );
}

runBench(main);
