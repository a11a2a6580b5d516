// Long prompts through real nginx (njs 0.8, one worker process) with the
// tokenizer helper (the bridge's POST /v1/tokenize, njs/offload.ts):
// - parity: the render corpus and long mixed-script prompts (1k to 200k
//   tokens) find every block the engine cached from transformers' rendering;
// - the helper killed, then hanging, then back: no request fails, each
//   fallback cause is logged once, routing is exact again afterwards;
// - a long prompt leaves the worker's event loop free for short requests.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as net from "net";
import * as os from "os";
import * as path from "path";
import { ROOT, freePort, longText, nginx08, startSim, stopAll, waitFor, workerArg, sleep } from "../harness";
import { cpuMs, NginxStack, startBridgeAt, startNginx1, mirrorSettled } from "../nginx-stack";
import { corpus, reference, CorpusItem } from "../render-corpus";
import { NJS_CORPUS } from "../tokenizer-corpus";
import { bodyKey } from "../../sim/render";
import { needs, pythonMissing } from "../tools";
import { parseRequest } from "../../core/request";

const n8 = nginx08();
const built = fs.existsSync(path.join(ROOT, "njs", "dist", "infera.js"));
const skip = needs(!n8 && "njs >= 0.8 not set up (bash scripts/njs08.sh)") || (!built && "run npm run build:njs");
const noReference = needs(pythonMissing(["transformers", "jinja2"], "'transformers>=5.24' 'jinja2>=3.1.6'"));
const FAST = ["--prefill-us-per-token", "0", "--decode-ms-per-token", "0", "--prefill-attn-us-per-kctx", "0"];

after(stopAll);

/** Mixed-script text of about `chars` characters (NFC: what both tokenizers see alike). */
function mixed(seed: number, chars: number): string {
  const parts = NJS_CORPUS.concat([
    longText("mix" + seed, 30),
    "def f(x):\n    return [y ** 2 for y in range(x) if y % 3 == 0]\n\n",
    "它的价格是１２３元，对吗？是的。テスト、テスト。",
    "I'd've thought it's OK, DON'T you? 'quoted' x'y 🎉🎉 👩‍💻",
  ]);
  const seps = [" ", "\n", "\n\n", "", "  ", "\t", ". "];
  let s = seed;
  const rnd = (n: number) => {
    s = (s * 1103515245 + 12345) & 0x7fffffff;
    return s % n;
  };
  const out: string[] = [];
  let len = 0;
  for (let i = 0; i < 200000 && len < chars; i++) {
    const p = parts[rnd(parts.length)] + seps[rnd(seps.length)];
    out.push(p);
    len += p.length;
  }
  return out.join("");
}

async function hitBlocks(ng: NginxStack): Promise<number> {
  const text = await (await fetch(`${ng.url}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^infera_router_cache_hit_blocks_total\{[^}]*\} (\d+)/gm)) n += Number(m[1]);
  return n;
}

async function post(ng: NginxStack, endpoint: string, body: unknown): Promise<number> {
  const r = await fetch(`${ng.url}${endpoint}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  await r.text();
  return r.status;
}

const PATHS: Record<string, string> = {
  chat: "/v1/chat/completions",
  completions: "/v1/completions",
  messages: "/v1/messages",
};

test(
  "helper path parity through real nginx: the render corpus and 1k-200k-token prompts hit every block transformers' rendering cached",
  { skip: skip || noReference, timeout: 240000 },
  async () => {
    const t0 = Date.now();
    const long: CorpusItem[] = [1000, 8000, 32000, 112000, 200000].map((tokens, i) => ({
      id: "long" + tokens,
      family: "qwen3",
      endpoint: "chat",
      body: {
        model: "m",
        max_tokens: 1,
        messages: [
          { role: "system", content: mixed(i + 1, Math.round(tokens * 2.2)) },
          { role: "user", content: "Summarise the above." },
        ],
      },
    }));
    const items = corpus()
      .filter((c) => c.family === "qwen3")
      .concat(long);
    const lap = (what: string) => process.stdout.write(`# ${what}: ${((Date.now() - t0) / 1000).toFixed(1)} s\n`);
    const ref = reference(items);
    lap("reference");
    const ok = items.filter((it) => ref.get(it.id)?.ids);
    const map: Record<string, number[]> = {};
    for (const it of ok) map[bodyKey(JSON.stringify(it.body))] = ref.get(it.id)!.ids!;
    const fixture = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "ngxtok-fixture-")), "fixture.json");
    fs.writeFileSync(fixture, JSON.stringify(map));
    const sizes = long.map((l) => ref.get(l.id)!.ids!.length);
    process.stdout.write(`# reference: ${ok.length}/${items.length} items, long prompts ${sizes.join(", ")} tokens\n`);
    assert.ok(sizes[4] > 150000, "the longest prompt has over 150k tokens");

    // One engine holds everything: a repeat of any prompt must find all its full blocks.
    const sim = await startSim("pt0", [...FAST, "--render-fixture", fixture, "--capacity-blocks", "400000"]);
    const port = await freePort();
    // Every prompt goes to the helper (threshold 0). This test is about the helper's
    // answers, not its bound: on a loaded machine a 200k prompt can take longer than
    // the shipped 2 s, and njs then falls back to its own tokenizer by design (the
    // next test covers that), so the bound is raised here.
    const ng = await startNginx1(n8!, {
      tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize`,
      tokenizer_min_tokens: "0",
      max_body_bytes: "16000000",
      fetch_timeout: "30s",
    });
    const br = await startBridgeAt(workerArg([sim]), `${ng.url}/_infera/push`, port);
    await waitFor(
      "fleet",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 1,
    );
    const send = async (it: CorpusItem) => {
      const st = await post(ng, PATHS[it.endpoint], { ...it.body, stream: false });
      assert.equal(st, 200, `${it.id}: HTTP ${st}`);
    };
    lap("stack up");
    for (let i = 0; i < ok.length; i += 8) await Promise.all(ok.slice(i, i + 8).map(send));
    lap("first pass");
    await mirrorSettled(ng, [sim]);
    lap("settled");
    // Second pass: a request's hits never exceed its full blocks (the chain stops at the first
    // block the engine does not hold), so the total equals the sum only if every prompt found all of its own.
    const before = await hitBlocks(ng);
    for (let i = 0; i < ok.length; i += 8) await Promise.all(ok.slice(i, i + 8).map(send));
    const got = (await hitBlocks(ng)) - before;
    let total = 0;
    for (const it of ok) total += Math.floor(ref.get(it.id)!.ids!.length / 16);
    lap("second pass");
    const m = await (await fetch(`http://127.0.0.1:${br.adminPort}/metrics`)).text();
    const viaHelper = Number(/infera_bridge_tokenize_requests_total\{result="ok"\} (\d+)/.exec(m)?.[1] ?? 0);
    process.stdout.write(
      `# ${ok.length} prompts, ${total} blocks, ${viaHelper} tokenized by the helper, ${((Date.now() - t0) / 1000).toFixed(1)} s\n`,
    );
    assert.equal(got, total, "every block of every prompt found");
    // Completions with token ids need no tokenizer; everything else went to the helper, twice.
    const textual = ok.filter((it) => !(it.endpoint === "completions" && typeof it.body.prompt !== "string"));
    assert.ok(viaHelper >= textual.length * 2 - 2, `helper answered ${viaHelper} of ${textual.length * 2}`);
  },
);

test(
  "the tokenizer helper killed, then hanging, then back: zero errors, each fallback logged once, exact again",
  { skip, timeout: 180000 },
  async () => {
    const sims = await Promise.all(["pk0", "pk1"].map((id) => startSim(id, FAST)));
    const port = await freePort();
    const ng = await startNginx1(n8!, { tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize` });
    let br = await startBridgeAt(workerArg(sims), `${ng.url}/_infera/push`, port);
    await waitFor(
      "fleet",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 2,
    );
    // ~30k tokens: over $infera_njs_tokenize_max_tokens (estimated), so without the helper it routes on the estimate.
    const long = longText("killlong", 4400);
    // ~5k tokens: between the helper threshold and the njs fallback limit: njs tokenizes it when the helper is away.
    const mid = longText("killmid", 750);
    let turn = 0;
    const ask = async (content: string) => {
      const before = await hitBlocks(ng);
      const b = {
        model: "m",
        max_tokens: 1,
        messages: [
          { role: "user", content },
          { role: "assistant", content: "ok" },
          { role: "user", content: "turn " + turn++ },
        ],
      };
      const st = await post(ng, "/v1/chat/completions", b);
      return { status: st, hits: (await hitBlocks(ng)) - before };
    };
    assert.equal((await ask(long)).status, 200);
    assert.equal((await ask(mid)).status, 200);
    await mirrorSettled(ng, sims);
    const up = await ask(long);
    assert.equal(up.status, 200);
    assert.ok(up.hits > 1500, `helper up: the cached conversation found (${up.hits} blocks)`);

    const warnings = (re: RegExp) =>
      ng.proc
        .log()
        .split("\n")
        .filter((l) => re.test(l)).length;
    await br.proc.kill("SIGKILL");
    const down: { status: number; hits: number }[] = [];
    for (let i = 0; i < 4; i++) down.push(await ask(long), await ask(mid));
    assert.deepEqual(
      down.map((d) => d.status),
      new Array(8).fill(200),
      "helper dead: every request routed",
    );
    assert.ok(
      down.filter((_, i) => i % 2 === 0).every((d) => d.hits === 0),
      "long prompts route on the estimate (no blocks)",
    );
    assert.ok(
      down.filter((_, i) => i % 2 === 1).every((d) => d.hits > 200),
      `mid prompts tokenized in njs find their cache: ${down.map((d) => d.hits).join(",")}`,
    );
    assert.equal(warnings(/tokenizer helper .* unreachable/), 1, "the dead helper is logged once");

    // A helper that accepts and never answers: bounded by js_fetch_timeout (2 s).
    const held: net.Socket[] = [];
    const hang = net.createServer((s) => held.push(s));
    await new Promise<void>((r) => hang.listen(port, "127.0.0.1", () => r()));
    const t0 = Date.now();
    const slow = [await ask(long), await ask(long)];
    const slowMs = (Date.now() - t0) / 2;
    assert.deepEqual(
      slow.map((d) => d.status),
      [200, 200],
    );
    assert.ok(slowMs < 6000, `a hanging helper costs a request at most the fetch timeout (${slowMs.toFixed(0)} ms)`);
    assert.equal(warnings(/tokenizer helper .* timeout/), 1, "the hanging helper is logged once");
    for (const s of held) s.destroy();
    await new Promise<void>((r) => hang.close(() => r()));

    br = await startBridgeAt(workerArg(sims), `${ng.url}/_infera/push`, port);
    await waitFor("bridge resynced nginx", async () => (await ask(mid)).status === 200, 30000);
    await mirrorSettled(ng, sims);
    const back = await ask(long);
    assert.equal(back.status, 200);
    assert.ok(back.hits > 1500, `helper back: exact routing again (${back.hits} blocks)`);
    assert.equal(
      warnings(/tokenizer helper .* answers again: /),
      1,
      "recovery logged once: " +
        ng.proc
          .log()
          .split("\n")
          .filter((l) => /tokenizer helper/.test(l))
          .map((l) => l.replace(/^.*infera: /, "").slice(0, 200))
          .join(" | "),
    );
  },
);

test(
  "a 112k-token prompt costs the nginx worker far less CPU on the helper path than tokenized in njs",
  { skip, timeout: 180000 },
  async () => {
    const sims = await Promise.all(["pc0", "pc1"].map((id) => startSim(id, FAST)));
    const body = (content: string) => ({ model: "m", max_tokens: 1, messages: [{ role: "user", content }] });
    const cpu: Record<string, number[]> = { njs: [], helper: [] };
    const stacks: Record<string, NginxStack> = {};
    for (const side of ["njs", "helper"]) {
      const port = await freePort();
      const ng = await startNginx1(n8!, {
        tokenizer_url: side === "helper" ? `http://127.0.0.1:${port}/v1/tokenize` : '""',
      });
      // No KV events: the worker's CPU is the request's own routing, not a mirror update landing meanwhile.
      await startBridgeAt(sims.map((s) => s.address).join(","), `${ng.url}/_infera/push`, port);
      await waitFor(
        "fleet",
        async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 2,
      );
      assert.equal(await post(ng, "/v1/chat/completions", body(longText("w" + side, 2000))), 200);
      stacks[side] = ng;
    }
    // 16,400 words = ~112k tokens; the sides alternate so machine noise hits both alike.
    for (let i = 0; i < 3; i++)
      for (const side of i % 2 ? ["helper", "njs"] : ["njs", "helper"]) {
        const ng = stacks[side];
        await sleep(50);
        const c0 = cpuMs(ng.workerPid);
        assert.equal(await post(ng, "/v1/chat/completions", body(longText(`cold${side}${i}`, 16400))), 200);
        await sleep(100);
        cpu[side].push(cpuMs(ng.workerPid) - c0);
      }
    const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / xs.length;
    process.stdout.write(
      `# nginx worker CPU ms per 112k-token request: in njs ${cpu.njs.join(", ")}; helper ${cpu.helper.join(", ")}\n`,
    );
    // What is left on the helper path is the pick's shared-dict bookkeeping (docs/gateways/nginx.md).
    assert.ok(
      mean(cpu.helper) < 0.6 * mean(cpu.njs),
      `helper ${mean(cpu.helper).toFixed(0)} ms vs njs ${mean(cpu.njs).toFixed(0)} ms`,
    );
  },
);

/**
 * One simulator, nginx with the bridge's helper at its admin port (vars on top), the fleet in nginx;
 * asked(): how many prompts the helper has tokenized.
 */
async function helperStack(
  simId: string,
  vars: Record<string, string>,
): Promise<{
  ng: Awaited<ReturnType<typeof startNginx1>>;
  asked: () => Promise<number>;
  helperUrl: string;
  sim: Awaited<ReturnType<typeof startSim>>;
}> {
  const sim = await startSim(simId, FAST);
  const port = await freePort();
  const ng = await startNginx1(n8!, { tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize`, ...vars });
  // workerArg: with its KV event stream, so nginx's mirror learns what the engine cached.
  const br = await startBridgeAt(workerArg([sim]), `${ng.url}/_infera/push`, port);
  await waitFor(
    "fleet",
    async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 1,
  );
  const asked = async () => {
    const m = await (await fetch(`http://127.0.0.1:${br.adminPort}/metrics`)).text();
    return Number(/infera_bridge_tokenize_requests_total\{result="ok"\} (\d+)/.exec(m)?.[1] ?? 0);
  };
  return { ng, asked, helperUrl: br.tokenizeUrl, sim };
}

test(
  "the helper packs a long prompt's hashes only for a caller that asks (X-Infera-Answer: packed), the same hashes as its JSON list; nginx routes on them",
  { skip, timeout: 120000 },
  async () => {
    const { ng, asked, helperUrl, sim } = await helperStack("pk0", {});
    const body = JSON.stringify({
      model: "m",
      max_tokens: 1,
      messages: [{ role: "user", content: longText("packed", 900) }],
    });
    const ask = async (extra: Record<string, string>) => {
      const r = await fetch(helperUrl, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "x-infera-endpoint": "chat",
          "x-infera-block-size": "16",
          "x-infera-limits": "8388608,4096,512,64",
          ...extra,
        },
        body,
      });
      assert.equal(r.status, 200);
      return r.text();
    };
    // A caller from before the packed answer (an older bundle) sends no X-Infera-Answer: the JSON list.
    const plain = JSON.parse(await ask({})) as { t: number; b: string[]; x: boolean; mh: string[] };
    assert.ok(plain.b.length > 100, `${plain.b.length} hashes`);
    const packed = await ask({ "x-infera-answer": "packed" });
    const nl = packed.indexOf("\n");
    assert.ok(nl > 0, "a JSON line, then the hashes");
    assert.deepEqual(JSON.parse(packed.slice(0, nl)), { t: plain.t, n: plain.b.length, x: plain.x, mh: plain.mh });
    assert.equal(packed.slice(nl + 1), plain.b.join(""));
    assert.equal(packed.length - nl - 1, plain.b.length * 16);
    // Through nginx (which asks for the packed answer): the second time, the prompt's blocks are found cached.
    const before = await asked();
    assert.equal(await post(ng, "/v1/chat/completions", JSON.parse(body)), 200);
    const hits0 = await hitBlocks(ng);
    const full = Math.floor(plain.t / 16);
    await waitFor(
      "the prompt's KV events in nginx's mirror",
      async () =>
        ((await (await fetch(`${ng.url}/v1/admin/cache-view/${sim.address}`)).json()) as { block_count: number })
          .block_count >= full,
    );
    await mirrorSettled(ng, [sim]);
    assert.equal(await post(ng, "/v1/chat/completions", JSON.parse(body)), 200);
    assert.equal((await asked()) - before, 2, "both went to the helper");
    assert.equal((await hitBlocks(ng)) - hits0, full, "every full block found cached");
  },
);

test(
  "njs estimates a prompt's tokens from its UTF-8 bytes as the Envoy path does: characters beyond U+FFFF count 4 bytes",
  { skip, timeout: 120000 },
  async () => {
    // 1,000 emoji: 4,000 UTF-8 bytes, so the estimate (bytes / 4, role included) is 1,001 tokens on
    // the Envoy path (core/request.ts under Node). Counted 3 bytes each, it would be 751: under the
    // threshold of 900 below, njs would tokenize the prompt itself instead of asking the helper.
    const body = { model: "m", max_tokens: 1, messages: [{ role: "user", content: "\u{1F600}".repeat(1000) }] };
    const node = parseRequest("chat", JSON.stringify(body), 0, { maxBodyBytes: 1e6 });
    assert.equal(node.estimatedTokens, 1001);
    const { ng, asked } = await helperStack("pe0", { tokenizer_min_tokens: "900" });
    const before = await asked();
    assert.equal(await post(ng, "/v1/chat/completions", body), 200);
    assert.equal((await asked()) - before, 1, "the helper tokenized the 1,001-token estimate (>= 900)");
    // And one under the threshold by the same count stays in njs: 800 emoji, 801 tokens.
    const small = { ...body, messages: [{ role: "user", content: "\u{1F600}".repeat(800) }] };
    assert.equal(await post(ng, "/v1/chat/completions", small), 200);
    assert.equal((await asked()) - before, 1, "the 801-token estimate (< 900) is tokenized in njs");
  },
);

test(
  "as shipped, a prompt under the old 2,048-token estimate goes to the helper too: the bench's dense text, ~3k tokens estimated at ~1k",
  { skip, timeout: 120000 },
  async () => {
    // No tokenizer_min_tokens here: nginx.conf's own value.
    const { ng, asked } = await helperStack("pd0", {});
    // A multi-turn turn of bench:trace: digit-heavy words, ~1.2 bytes per token.
    const content = longText("shipped", 280);
    const body = { model: "m", max_tokens: 1, messages: [{ role: "user", content }] };
    const est = parseRequest("chat", JSON.stringify(body), 0, { maxBodyBytes: 1e6 }).estimatedTokens;
    assert.ok(est > 500 && est < 2048, `estimated ${est} tokens`);
    const before = await asked();
    assert.equal(await post(ng, "/v1/chat/completions", body), 200);
    assert.equal((await asked()) - before, 1, `the helper tokenized the ${est}-token estimate`);
    // A one-line chat too.
    assert.equal(await post(ng, "/v1/chat/completions", { ...body, messages: [{ role: "user", content: "hi" }] }), 200);
    assert.equal((await asked()) - before, 2, "and the one-line chat");
  },
);

test(
  "a helper that timed out is skipped for a while by prompts njs can tokenize: one fetch timeout, then fast fallbacks",
  { skip, timeout: 120000 },
  async () => {
    const sims = await Promise.all(["ph0", "ph1"].map((id) => startSim(id, FAST)));
    const port = await freePort();
    const ng = await startNginx1(n8!, {
      tokenizer_url: `http://127.0.0.1:${port}/v1/tokenize`,
      tokenizer_min_tokens: "0",
    });
    // Fleet and KV events from a bridge on another port; the helper's port hangs.
    await startBridgeAt(workerArg(sims), `${ng.url}/_infera/push`);
    await waitFor(
      "fleet",
      async () => ((await (await fetch(`${ng.url}/v1/admin/workers`)).json()) as unknown[]).length === 2,
    );
    const held: net.Socket[] = [];
    const hang = net.createServer((s) => held.push(s));
    await new Promise<void>((r) => hang.listen(port, "127.0.0.1", () => r()));
    try {
      const timed = async (seed: string) => {
        const t0 = Date.now();
        const st = await post(ng, "/v1/chat/completions", {
          model: "m",
          max_tokens: 1,
          messages: [{ role: "user", content: longText(seed, 300) }],
        });
        return { status: st, ms: Date.now() - t0 };
      };
      const first = await timed("hold0");
      assert.equal(first.status, 200);
      assert.ok(first.ms >= 1500, `the first waits for the fetch timeout (${first.ms} ms)`);
      const next: { status: number; ms: number }[] = [];
      for (let i = 1; i <= 3; i++) next.push(await timed("hold" + i));
      assert.deepEqual(
        next.map((x) => x.status),
        [200, 200, 200],
      );
      assert.ok(
        next.every((x) => x.ms < 1000),
        `the next ones tokenize in njs at once: ${next.map((x) => x.ms).join(", ")} ms`,
      );
      assert.equal(held.length, 1, "the hanging helper was asked once");
    } finally {
      for (const s of held) s.destroy();
      await new Promise<void>((r) => hang.close(() => r()));
    }
  },
);
