// The njs variant: the bundle on njs's own engine (CLI, 0.7.9 and 0.8.x) and
// inside real nginx with the bridge feeding it KV events.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import {
  ROOT,
  nginx08,
  nginxSystem,
  startSim,
  startNginx,
  startBridge,
  workerArg,
  chat,
  longText,
  openStream,
  stopAll,
  sleep,
  waitFor,
  Sim,
  renderNginx,
  freePort,
  njsClis,
} from "../harness";
import { loadTokenizer } from "../../runtime/tokenizer";
import { xxh3Hex } from "../../core/xxh3";
import { corpus, reference } from "../render-corpus";
import { NJS_CORPUS } from "../tokenizer-corpus";
import { needs, pythonMissing } from "../tools";

const DIST = path.join(ROOT, "njs", "dist");
const built = fs.existsSync(path.join(DIST, "infera.js")) && fs.existsSync(path.join(DIST, "tokenizer.json"));
const CORPUS = NJS_CORPUS;

function runNjs(bin: string, script: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-njs-"));
  const f = path.join(dir, "t.mjs");
  fs.writeFileSync(f, script);
  const r = spawnSync(bin, ["-p", DIST, f], { encoding: "utf8", timeout: 120000, maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error(`${bin} failed (${r.status}): ${r.stderr}${r.stdout}`);
  return r.stdout;
}

/**
 * Parse + render + tokenize each {endpoint, body} on njs's engine (cli.renderIds).
 * njs's console.log cuts lines at 2048 bytes: results come back in indexed chunks.
 */
function renderIdsInNjs(bin: string, input: string): { ids?: number[]; error?: string }[] {
  const out = runNjs(
    bin,
    `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync(${JSON.stringify(path.join(DIST, "tokenizer.json"))}));
const res = cli.renderIds(vocab, JSON.parse(fs.readFileSync(${JSON.stringify(input)})));
for (let i = 0; i < res.length; i++) {
  const s = JSON.stringify(res[i]);
  for (let k = 0; k < s.length; k += 1000) console.log(i + "\t" + s.slice(k, k + 1000));
}`,
  );
  const parts: string[] = [];
  for (const l of out.split("\n")) {
    const m = /^(\d+)\t(.*)$/.exec(l);
    if (m) parts[Number(m[1])] = (parts[Number(m[1])] || "") + m[2];
  }
  return parts.map((p) => JSON.parse(p));
}

const clis = njsClis();
const noCli = needs(clis.length === 0 && "no njs CLI (apt-get install njs)");
const noReference = needs(pythonMissing(["transformers", "jinja2"], "'transformers>=5.24' 'jinja2>=3.1.6'"));

test(
  "the njs bundle runs on njs's engine: BPE ids equal @huggingface/tokenizers, XXH3 equals Node",
  { skip: noCli || (!built && "run npm run build:njs") },
  () => {
    const tok = loadTokenizer(null)!;
    const expected = CORPUS.map((s) => tok.encode(s));
    const bytes = [0, 3, 8, 16, 17, 100, 129, 240, 241, 500, 1100].map((n) =>
      Array.from({ length: n }, (_, i) => (i * 31 + n) & 255),
    );
    for (const [label, bin] of clis) {
      const out = runNjs(
        bin,
        `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync(${JSON.stringify(path.join(DIST, "tokenizer.json"))}));
console.log(JSON.stringify({ ids: cli.encodeAll(vocab, ${JSON.stringify(CORPUS)}), hashes: cli.hashes(${JSON.stringify(bytes)}) }));`,
      );
      const got = JSON.parse(out.trim().split("\n").pop()!);
      for (let i = 0; i < CORPUS.length; i++)
        assert.deepEqual(got.ids[i], expected[i], `${label}: ${JSON.stringify(CORPUS[i])}`);
      assert.deepEqual(
        got.hashes,
        bytes.map((b) => xxh3Hex(new Uint8Array(b))),
        label,
      );
    }
  },
);

test(
  "render parity in njs: the Qwen3 corpus renders + tokenizes to transformers' ids on njs's engine",
  { skip: noCli || (!built && "run npm run build:njs") || noReference },
  () => {
    const items = corpus().filter((c) => c.family === "qwen3");
    const ref = reference(items);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "njs-parity-"));
    const input = path.join(dir, "items.json");
    fs.writeFileSync(input, JSON.stringify(items.map((c) => ({ endpoint: c.endpoint, body: JSON.stringify(c.body) }))));
    for (const [label, bin] of clis) {
      const got = renderIdsInNjs(bin, input);
      assert.equal(got.length, items.length, label + ": one result per request");
      let exact = 0;
      const misses: string[] = [];
      items.forEach((it, i) => {
        const want = ref.get(it.id)!;
        const ok = want.error
          ? !!got[i].error
          : !got[i].error && JSON.stringify(got[i].ids) === JSON.stringify(want.ids);
        if (ok) exact++;
        else if (misses.length < 5)
          misses.push(`${it.id}: ${got[i].error || "ids differ"}${want.error ? " (engine: " + want.error + ")" : ""}`);
      });
      process.stdout.write(`# ${label}: render parity ${exact}/${items.length}\n`);
      assert.equal(exact, items.length, `${label}: ${misses.join("; ")}`);
    }
    fs.rmSync(dir, { recursive: true, force: true });
  },
);

/** A JSON schema `levels` objects deep (each level is 2 JSON levels: the object and its properties). */
function deepSchema(levels: number): unknown {
  let schema: unknown = { type: "string" };
  for (let i = 0; i < levels; i++) schema = { type: "object", properties: { [`k${i}`]: schema } };
  return schema;
}

test(
  "deep bodies on njs's engine: a 60-deep tool schema and a 40-deep tool_use input render to transformers' ids (njs's stack overflowed: the pick went random)",
  { skip: noCli || (!built && "run npm run build:njs") || noReference },
  () => {
    // Nesting just under --max-json-depth's 64: body, tools, tool, function = 4, then 2 per schema level.
    const items = [
      {
        id: "deep-openai",
        family: "qwen3",
        endpoint: "chat" as const,
        body: {
          model: "m",
          tools: [{ type: "function", function: { name: "deep", description: "d", parameters: deepSchema(29) } }],
          messages: [{ role: "user", content: "call deep" }],
        },
      },
      {
        id: "deep-anthropic",
        family: "qwen3",
        endpoint: "messages" as const,
        body: {
          model: "m",
          max_tokens: 8,
          tools: [{ name: "deep", description: "d", input_schema: deepSchema(20) }],
          messages: [
            { role: "user", content: "call deep" },
            { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "deep", input: deepSchema(17) }] },
            { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: "ok" }] },
          ],
        },
      },
    ];
    const depth = (v: unknown): number =>
      typeof v === "object" && v !== null ? 1 + Math.max(0, ...Object.values(v).map(depth)) : 0;
    assert.ok(
      items.every((it) => depth(it.body) >= 40 && depth(it.body) <= 64),
      items.map((it) => depth(it.body)).join(),
    );
    const ref = reference(items);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "njs-deep-"));
    const input = path.join(dir, "items.json");
    fs.writeFileSync(input, JSON.stringify(items.map((c) => ({ endpoint: c.endpoint, body: JSON.stringify(c.body) }))));
    for (const [label, bin] of clis) {
      const res = renderIdsInNjs(bin, input);
      items.forEach((it, i) => {
        const got = res[i];
        const want = ref.get(it.id)!;
        assert.equal(want.error, undefined, `${it.id}: the reference renders it`);
        assert.equal(got.error, undefined, `${label} ${it.id}: ${got.error}`);
        assert.deepEqual(got.ids, want.ids, `${label} ${it.id}: ids`);
      });
    }
    fs.rmSync(dir, { recursive: true, force: true });
  },
);

test(
  "njs tokenize + hash + pick time for 1k and 8k-token prompts (reported in README)",
  { skip: noCli || (!built && "run npm run build:njs") },
  () => {
    for (const [label, bin] of clis) {
      const out = runNjs(
        bin,
        `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync(${JSON.stringify(path.join(DIST, "tokenizer.json"))}));
const t1 = cli.timePick(vocab, ${JSON.stringify(longText("bench", 150))}, 5);
const t8 = cli.timePick(vocab, ${JSON.stringify(longText("bench", 1180))}, 3);
console.log(JSON.stringify({ t1: t1, t8: t8 }));`,
      );
      const r = JSON.parse(out.trim().split("\n").pop()!);
      process.stdout.write(
        `# ${label}: ${r.t1.tokens} tokens ${r.t1.ms} ms; ${r.t8.tokens} tokens ${r.t8.ms} ms (tokenize+hash+pick, 8 workers)\n`,
      );
      assert.ok(r.t1.tokens > 800 && r.t1.tokens < 1400, `~1k tokens, got ${r.t1.tokens}`);
      assert.ok(r.t8.tokens > 7000 && r.t8.tokens < 10000, `~8k tokens, got ${r.t8.tokens}`);
      assert.ok(r.t8.ms < 5000);
    }
  },
);

test(
  "njs memory per request grows linearly with the conversation (it grew quadratically: 5k messages took 511 MB)",
  { skip: noCli || (!built && "run npm run build:njs") },
  () => {
    for (const [label, bin] of clis) {
      const out = runNjs(
        bin,
        `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync(${JSON.stringify(path.join(DIST, "tokenizer.json"))}));
const res = [];
[1000, 4000].forEach(function (n) {
  const msgs = [];
  for (let i = 0; i < n; i++) msgs.push({ role: i % 2 ? 'assistant' : 'user', content: 'message ' + i + ' with a few words to tokenize' });
  const body = JSON.stringify({ model: 'm', messages: msgs });
  const before = njs.memoryStats.size;
  const r = cli.renderIds(vocab, [{ endpoint: 'chat', body: body }]);
  res.push({ n: n, ids: r[0].ids ? r[0].ids.length : -1, mb: (njs.memoryStats.size - before) / 1e6 });
});
console.log(JSON.stringify(res));`,
      );
      const [a, b] = JSON.parse(out.trim().split("\n").pop()!) as { n: number; ids: number; mb: number }[];
      process.stdout.write(
        `# ${label}: ${a.n} messages ${a.mb.toFixed(1)} MB, ${b.n} messages ${b.mb.toFixed(1)} MB\n`,
      );
      assert.ok(a.ids > 0 && b.ids > 3 * a.ids, "both conversations rendered and tokenized");
      // 4x the messages: linear is 4x the memory, quadratic 16x.
      assert.ok(b.mb / a.mb < 6, `memory ratio ${(b.mb / a.mb).toFixed(1)} for 4x the messages`);
      assert.ok(b.mb < 200, `${b.n} messages took ${b.mb.toFixed(0)} MB`);
    }
  },
);

const sys = nginxSystem();
test(
  "Debian 12's njs 0.7.9 cannot hold router state: nginx refuses the config naming js_shared_dict_zone",
  {
    skip:
      needs(!sys && "no system nginx with njs (Debian 12's nginx-light + libnginx-mod-http-js)") ||
      (!built && "run npm run build:njs"),
  },
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-ng7-"));
    const file = renderNginx(sys!, await freePort(), dir);
    const r = spawnSync(sys!.bin, ["-p", dir, "-c", file, "-t"], { encoding: "utf8" });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /unknown directive "js_shared_dict_zone"/);
  },
);

const n8 = nginx08();
const skip8 = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
let sims: Sim[];
let ng: { url: string; dir: string };

// The stack starts with the first test that uses it, not in a before() hook:
// the njs CLI tests above block the event loop in spawnSync for a minute or
// more, long enough for nginx to close the warm-up's idle keep-alive
// connection (keepalive_timeout 75 s) while undici, blocked, still pools it;
// the next POST then went out on a closed socket ("other side closed").
let ready: Promise<void> | null = null;
const stack = () =>
  (ready =
    ready ||
    (async () => {
      if (skip8) return;
      sims = await Promise.all(
        ["n0", "n1", "n2"].map((id) => startSim(id, ["--prefill-us-per-token", "150", "--decode-ms-per-token", "3"])),
      );
      ng = await startNginx(n8!);
      await startBridge(["--workers", workerArg(sims)], `${ng.url}/_infera/push`);
      await waitFor(
        "fleet in nginx",
        async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 3,
      );
      await chat(ng.url, "warm up " + longText("warm", 50));
    })());
after(stopAll);

const adminWorkers = async () =>
  (await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as {
    id: string;
    block_count: number;
    active_blocks: number;
  }[];
const simOf = (id: string | null) => sims.find((s) => s.id === id)!;
const viewOf = async (s: Sim) =>
  ((await (await fetch(`${ng.url}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number }).block_count;

test("nginx+njs: same prefix -> same worker, TTFT drops, cache-view unchanged", { skip: skip8 }, async () => {
  await stack();
  const prompt = longText("njsalpha", 1500);
  const a = await chat(ng.url, prompt);
  assert.equal(a.status, 200, a.body);
  const s = simOf(a.worker);
  await waitFor(
    "mirror in nginx",
    async () => (await viewOf(s)) === (await s.stats()).cached_blocks && (await viewOf(s)) > 100,
  );
  const before = await viewOf(s);
  const b = await chat(ng.url, prompt);
  assert.equal(b.worker, a.worker);
  assert.ok(b.cachedTokens > 0);
  assert.ok(b.ttftMs < a.ttftMs * 0.5, `TTFT ${a.ttftMs.toFixed(1)} -> ${b.ttftMs.toFixed(1)}`);
  await sleep(300);
  assert.equal(await viewOf(s), before);
  const seen = new Set<string>();
  for (const seed of ["njsred", "njsgreen", "njsblue"]) {
    const r = await chat(ng.url, longText(seed, 300));
    seen.add(r.worker!);
    await waitFor(
      "events",
      async () => (await viewOf(simOf(r.worker))) === (await simOf(r.worker).stats()).cached_blocks,
    );
  }
  assert.ok(seen.size >= 2, "unrelated prompts spread");
});

test("nginx+njs: client abort releases the load; every guard released", { skip: skip8 }, async () => {
  await stack();
  const s = await openStream(ng.url, longText("njsabort", 300), 2000);
  const held = (await adminWorkers()).reduce((n, w) => n + w.active_blocks, 0);
  assert.ok(held > 10, `active while streaming: ${held}`);
  s.abort();
  await waitFor("released", async () => (await adminWorkers()).every((w) => w.active_blocks === 0), 5000);
  const o = (await (await fetch(`${ng.url}/v1/admin/reservations`)).json()) as { open_guards: number };
  assert.equal(o.open_guards, 0);
});

test("nginx+njs: bad JSON is a 400; unauthorised and stale pushes are refused", { skip: skip8 }, async () => {
  await stack();
  const bad = await fetch(`${ng.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: "{nope",
  });
  assert.equal(bad.status, 400);
  assert.equal(((await bad.json()) as { error: { message: string } }).error.message, "request body is not valid JSON");
  const before = await viewOf(sims[0]);
  const push = (token: string, body: unknown) =>
    fetch(`${ng.url}/_infera/push`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-push-token": token },
      body: JSON.stringify(body),
    });
  const unauth = await push("wrong", {
    type: "events",
    pseq: Date.now() * 1000 + 5e6,
    worker: sims[0].address,
    seq: 0,
    events: [{ type: "AllBlocksCleared" }],
  });
  assert.equal(unauth.status, 403);
  const stale = await push("test-token", {
    type: "events",
    pseq: 1,
    worker: sims[0].address,
    seq: 0,
    events: [{ type: "AllBlocksCleared" }],
  });
  assert.equal(stale.status, 409);
  assert.match(await stale.text(), /stale push/);
  assert.equal(await viewOf(sims[0]), before, "refused AllBlocksCleared pushes changed nothing");
});

test(
  "nginx+njs PD: decode worker gets the request with the prefill worker named; same prefix -> same prefill worker",
  { skip: skip8 },
  async () => {
    const args = ["--prefill-us-per-token", "150", "--decode-ms-per-token", "2"];
    const p = await Promise.all(["np0", "np1"].map((id) => startSim(id, args, "prefill")));
    const d = await Promise.all(["nd0", "nd1"].map((id) => startSim(id, args, "decode")));
    const roles = Object.fromEntries([...p.map((s) => [s.id, "prefill"]), ...d.map((s) => [s.id, "decode"])]);
    const ng2 = await startNginx(n8!, {
      kv_prefill_overlap_weight: "20",
      kv_decode_overlap_weight: "2",
      decode_input_demand: "on",
    });
    await startBridge(["--workers", workerArg([...p, ...d], roles)], `${ng2.url}/_infera/push`);
    await waitFor(
      "PD fleet in nginx",
      async () => ((await (await fetch(`${ng2.url}/v1/admin/workers`)).json()) as unknown[]).length === 4,
    );
    const send = async (content: string) => {
      const r = await fetch(`${ng2.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m", stream: false, max_tokens: 2, messages: [{ role: "user", content }] }),
      });
      await r.text();
      return {
        status: r.status,
        decode: r.headers.get("x-sim-worker"),
        prefill: r.headers.get("x-sim-prefill-worker"),
        cached: Number(r.headers.get("x-sim-cached-tokens")),
      };
    };
    const prompt = longText("njspd", 600);
    const a = await send(prompt);
    assert.equal(a.status, 200);
    assert.ok(
      d.some((s) => s.id === a.decode),
      `decode served: ${a.decode}`,
    );
    const pw = p.find((s) => s.address === a.prefill)!;
    assert.ok(pw, `prefill named: ${a.prefill}`);
    await waitFor(
      "prefill mirror in nginx",
      async () =>
        ((await (await fetch(`${ng2.url}/v1/admin/cache-view/${pw.address}`)).json()) as { block_count: number })
          .block_count === (await pw.stats()).cached_blocks,
    );
    const b = await send(prompt);
    assert.equal(b.prefill, a.prefill);
    assert.ok(b.cached > 0);
    // Release runs at nginx's log phase, just after the last byte reaches the client.
    await waitFor(
      "all released after completion",
      async () => {
        const ws = (await (await fetch(`${ng2.url}/v1/admin/workers`)).json()) as {
          active_blocks: number;
          demand: { tokens: number };
        }[];
        return ws.every((w) => w.active_blocks === 0 && w.demand.tokens === 0);
      },
      5000,
    );
    const m = await (await fetch(`${ng2.url}/metrics`)).text();
    assert.match(
      m,
      /infera_router_decode_demand_decisions_total\{mode="on",input="exact",agrees="(true|false)"\} [1-9]/,
    );
    assert.match(
      m,
      new RegExp(`infera_router_decode_demand_tokens\\{target="${d[0].address.replace(/\./g, "\\.")}"\\} 0`),
    );
    assert.ok(
      !m.includes(`infera_router_decode_demand_tokens{target="${p[0].address}"}`),
      "prefill workers are not decode targets",
    );
  },
);
