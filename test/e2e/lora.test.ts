// LoRA-aware routing through real Envoy: the router scrapes each simulator's
// vllm:lora_requests_info, keeps an adapter's requests where it is loaded, and
// never sends one to a worker whose adapter slots are full while another has
// room. Two simulators with one adapter slot each (--max-loras 1), all on
// 127.0.0.1.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, longText, stopAll, waitFor, needsEnvoy, startEnvoyFleet, EnvoyFleet } from "../harness";
import { parseLoraInfo } from "../../core/lora";

const skip = needsEnvoy();
let fleet: EnvoyFleet;

const SIM = [
  "--served-model-name",
  "base",
  "--lora-modules",
  "A,B,C",
  "--max-loras",
  "1",
  "--lora-load-ms",
  "200",
  "--decode-ms-per-token",
  "8",
];

before(async () => {
  if (skip) return;
  fleet = await startEnvoyFleet({
    ids: ["w0", "w1"],
    simArgs: SIM,
    routerArgs: ["--engine-metrics-interval-ms", "200"],
  });
  // The router knows A, B, C are adapters once it has read the workers' /v1/models.
  await chat(fleet.envoy.url, "warm up", { extra: { model: "base" } });
});

after(stopAll);

const other = (id: string | null) => fleet.sims.find((s) => s.id !== id)!.id;
const settled = () => fleet.settled();

test("the simulator exports vLLM's LoRA gauge and the router's parser reads the current series", { skip }, async () => {
  const text = await (await fetch(`http://${fleet.sims[0].address}/metrics`)).text();
  assert.match(text, /^vllm:lora_requests_info\{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""\} \d/m);
  assert.deepEqual(parseLoraInfo(text), { maxLora: 1, running: [], waiting: [] });
});

test("an adapter's next request, with another prompt, goes where the adapter was loaded", { skip }, async () => {
  const a = await chat(fleet.envoy.url, longText("lora-one", 200), { extra: { model: "A" } });
  assert.equal(a.status, 200);
  await settled();
  // Cold everywhere: without LoRA affinity each tie goes by a hash of the
  // prompt's content, so of three cold prompts some would go to the other worker.
  for (let k = 0; k < 3; k++) {
    const b = await chat(fleet.envoy.url, longText("lora-next" + k, 200), { extra: { model: "A" } });
    assert.equal(b.status, 200);
    assert.equal(b.worker, a.worker, `the adapter's request ${k + 2} moved to a worker that must load it`);
    await settled();
  }
});

test(
  "a worker whose only slot runs another adapter gets no request for a third while the other has room",
  { skip },
  async () => {
    // A long base-model document lands on one worker; an A request sharing it
    // follows the cache there and holds its only adapter slot for ~3 s.
    const doc = longText("lora-doc", 2000);
    const base = await chat(fleet.envoy.url, doc, { extra: { model: "base" } });
    assert.equal(base.status, 200);
    await settled();
    const holder = base.worker;
    const longA = chat(fleet.envoy.url, doc + " question for A", { extra: { model: "A" }, maxTokens: 400 });
    await waitFor("A running on the holder", async () => {
      const s = fleet.sims.find((x) => x.id === holder)!;
      const info = parseLoraInfo(await (await fetch(`http://${s.address}/metrics`)).text());
      return !!info && info.running.includes("A");
    });
    // C shares the document too: the cache says the holder, its slot says no.
    const c = await chat(fleet.envoy.url, doc + " question for C", { extra: { model: "C" } });
    assert.equal(c.status, 200);
    assert.equal(c.worker, other(holder), "C was sent to the worker whose slot A holds");
    assert.ok(c.ttftMs < 2000, `C waited ${c.ttftMs.toFixed(0)} ms`);
    const a = await longA;
    assert.equal(a.worker, holder);
  },
);
