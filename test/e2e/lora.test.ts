// LoRA-aware routing through real Envoy and through real nginx (njs >= 0.8)
// fed by the bridge: each worker's vllm:lora_requests_info is scraped (by the
// router, or by the bridge, which pushes it to nginx's shared dict), an
// adapter's requests are kept where it is loaded, and none is sent to a
// worker whose adapter slots are full while another has room. Two simulators
// with one adapter slot each (--max-loras 1), all on 127.0.0.1.
import { describe, test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import {
  chat,
  longText,
  stopAll,
  waitFor,
  needsEnvoy,
  needsNjs08,
  startEnvoyFleet,
  startNginxFleet,
  Sim,
} from "../harness";
import { parseLoraInfo } from "../../core/lora";

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

after(stopAll);

interface Gateway {
  url: string;
  sims: Sim[];
  settled(): Promise<void>;
  /** Resolves once the LoRA state scraped after this call is what the gateway routes by. */
  scraped(): Promise<void>;
}

/** The bridge's engine pushes (each a scrape round) nginx accepted so far. */
async function loraPushes(admin: string): Promise<number> {
  const text = await (await fetch(`${admin}/metrics`)).text();
  const m = /^infera_bridge_pushes_total\{type="engine",result="ok"\} (\d+)/m.exec(text);
  return m ? Number(m[1]) : 0;
}

const { n8, skip: skipNginx } = needsNjs08();
const gateways: { name: string; skip: string | false; start(): Promise<Gateway> }[] = [
  {
    name: "Envoy",
    skip: needsEnvoy(),
    async start() {
      const f = await startEnvoyFleet({
        ids: ["w0", "w1"],
        simArgs: SIM,
        routerArgs: ["--engine-metrics-interval-ms", "200"],
      });
      // The router scrapes every 200 ms in process: two intervals.
      const scraped = () => new Promise<void>((r) => setTimeout(r, 450));
      return { url: f.envoy.url, sims: f.sims, settled: () => f.settled(), scraped };
    },
  },
  {
    name: "nginx",
    skip: skipNginx,
    async start() {
      const f = await startNginxFleet(n8!, {
        ids: ["n0", "n1"],
        simArgs: SIM,
        bridgeArgs: ["--engine-metrics-interval-ms", "200"],
      });
      // A push that started after this call carries a scrape made after it.
      const scraped = async () => {
        const n0 = await loraPushes(f.bridge.admin);
        await waitFor("two more engine pushes", async () => (await loraPushes(f.bridge.admin)) >= n0 + 2, 10000);
      };
      return { url: f.ng.url, sims: f.sims, settled: () => f.settled(), scraped };
    },
  },
];

for (const gw of gateways) {
  describe(`LoRA through ${gw.name}`, { skip: gw.skip }, () => {
    let g: Gateway;
    before(async () => {
      g = await gw.start();
      // Adapters are known once the workers' /v1/models were read, and their slots once scraped.
      await chat(g.url, "warm up", { extra: { model: "base" } });
      await g.scraped();
    });
    const other = (id: string | null) => g.sims.find((s) => s.id !== id)!.id;

    test("the simulator exports vLLM's LoRA gauge and the router's parser reads the current series", async () => {
      const text = await (await fetch(`http://${g.sims[0].address}/metrics`)).text();
      assert.match(
        text,
        /^vllm:lora_requests_info\{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""\} \d/m,
      );
      assert.deepEqual(parseLoraInfo(text), { maxLora: 1, running: [], waiting: [] });
    });

    test("an adapter's next request, with another prompt, goes where the adapter was loaded", async () => {
      const a = await chat(g.url, longText("lora-one", 200), { extra: { model: "A" } });
      assert.equal(a.status, 200);
      await g.settled();
      // Cold everywhere: without LoRA affinity each tie goes by a hash of the
      // prompt's content, so of three cold prompts some would go to the other worker.
      for (let k = 0; k < 3; k++) {
        const b = await chat(g.url, longText("lora-next" + k, 200), { extra: { model: "A" } });
        assert.equal(b.status, 200);
        assert.equal(b.worker, a.worker, `the adapter's request ${k + 2} moved to a worker that must load it`);
        await g.settled();
      }
    });

    test("a worker whose only slot runs another adapter gets no request for a third while the other has room", async () => {
      // A long base-model document lands on one worker; an A request sharing it
      // follows the cache there and holds its only adapter slot for ~3 s.
      const doc = longText("lora-doc", 2000);
      const base = await chat(g.url, doc, { extra: { model: "base" } });
      assert.equal(base.status, 200);
      await g.settled();
      const holder = base.worker;
      const longA = chat(g.url, doc + " question for A", { extra: { model: "A" }, maxTokens: 400 });
      await waitFor("A running on the holder", async () => {
        const s = g.sims.find((x) => x.id === holder)!;
        const info = parseLoraInfo(await (await fetch(`http://${s.address}/metrics`)).text());
        return !!info && info.running.includes("A");
      });
      await g.scraped();
      // C shares the document too: the cache says the holder, its slot says no.
      const c = await chat(g.url, doc + " question for C", { extra: { model: "C" } });
      assert.equal(c.status, 200);
      assert.equal(c.worker, other(holder), "C was sent to the worker whose slot A holds");
      assert.ok(c.ttftMs < 2000, `C waited ${c.ttftMs.toFixed(0)} ms`);
      const a = await longA;
      assert.equal(a.worker, holder);
    });
  });
}
