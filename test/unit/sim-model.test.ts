// The engine model behind the simulator: batching, chunked prefill, KV memory,
// prefix cache with LRU eviction, and KV events that match what it holds.
import { test } from "node:test";
import assert from "node:assert/strict";
import { EngineModel, ModelConfig, ModelEvent, TokenOut, llama8bH100 } from "../../sim/model";
import { blockHashesOf } from "../../sim/engine";

function cfg(over: Partial<ModelConfig> = {}): ModelConfig {
  return { ...llama8bH100(), ...over };
}

function prompt(seed: number, len: number, shared?: number[]): number[] {
  const t = shared ? shared.slice(0, len) : [];
  for (let i = t.length; i < len; i++) t.push((seed * 7919 + i * 104729) % 150000);
  return t;
}

function req(id: string, tokens: number[], maxTokens = 4) {
  return { id, tokens, hashes: blockHashesOf(tokens, 16, ""), maxTokens };
}

/** Mirror of the model's cache built only from its events, as a router builds it. */
class Mirror {
  held = new Set<bigint>();
  apply(evs: ModelEvent[]): void {
    for (const e of evs) {
      if (e.type === "stored") {
        assert.equal(e.tokens.length, e.hashes.length * 16, "token ids cover the stored blocks");
        if (e.parent !== null) assert.ok(this.held.has(e.parent), "parent of a stored run is held");
        for (const h of e.hashes) {
          assert.ok(!this.held.has(h), "a hash is stored once while held");
          this.held.add(h);
        }
      } else for (const h of e.hashes) assert.ok(this.held.delete(h), "removed hash was held");
    }
  }
}

/** Runs the model until idle; returns tokens, per-step plans and engine time. */
function drain(m: EngineModel, mirror?: Mirror, maxSteps = 100000) {
  const out: TokenOut[] = [];
  const steps: { ms: number; prefill: number; decode: number }[] = [];
  let t = 0;
  for (let i = 0; i < maxSteps; i++) {
    const p = m.schedule();
    mirror?.apply(m.drainEvents());
    if (!p) return { out, steps, t };
    t += p.ms;
    steps.push({ ms: p.ms, prefill: p.prefillTokens, decode: p.decodeSeqs });
    out.push(...m.complete(p));
    mirror?.apply(m.drainEvents());
  }
  throw new Error("model did not go idle");
}

test("a repeated prompt hits the prefix cache in whole blocks, leaving one token to compute", () => {
  const m = new EngineModel(cfg());
  const mir = new Mirror();
  const p = prompt(1, 100);
  m.add(req("a", p));
  const a = drain(m, mir);
  assert.equal(a.out[0].cachedTokens, 0);
  assert.equal(mir.held.size, 6, "100 tokens = 6 full blocks stored");
  assert.equal(m.cachedBlocks(), 6);
  m.add(req("b", p));
  const b = drain(m, mir);
  assert.equal(b.out[0].cachedTokens, 96);
  assert.equal(b.steps[0].prefill, 4, "only the 4 uncached tokens are prefilled");
  // a 96-token prompt is fully cached, but the last block is recomputed so a token can be sampled
  m.add(req("c", p.slice(0, 96)));
  assert.equal(drain(m, mir).out[0].cachedTokens, 80);
});

test("long prompts are prefilled in chunks of the token budget, and decodes share the step", () => {
  const m = new EngineModel(cfg({ maxNumBatchedTokens: 2048 }));
  m.add(req("long", prompt(2, 5000), 3));
  m.add(req("short", prompt(3, 50), 50));
  const r = drain(m);
  const firstLong = r.out.findIndex((o) => o.id === "long");
  assert.ok(firstLong >= 0);
  assert.deepEqual(
    r.steps.slice(0, 3).map((s) => s.prefill),
    [2048, 2048, 954],
    "5000 + 50 tokens over three 2048-token steps",
  );
  // the short request got its first token in step 3 and decodes alongside the rest
  assert.ok(r.steps[3].decode === 2);
  assert.ok(r.steps[0].ms > r.steps[3].ms * 10, "a 2k-token prefill step costs far more than a decode step");
});

test("step time grows with running sequences and KV tokens read", () => {
  const time = (n: number, len: number) => {
    const m = new EngineModel(cfg());
    for (let i = 0; i < n; i++) m.add(req("r" + i, prompt(10 + i, len), 100));
    // prefill (one step each for short prompts fits the budget), then a pure decode step
    let p = m.schedule()!;
    while (p.prefillTokens > 0) {
      m.complete(p);
      p = m.schedule()!;
    }
    assert.equal(p.decodeSeqs, n);
    return p.ms;
  };
  const one = time(1, 200);
  const sixteen = time(16, 200);
  const sixteenLong = time(16, 4000);
  assert.ok(one > 6 && one < 7, `lone decode step ${one.toFixed(2)} ms (H100, Llama-3.1-8B: ~6.5 ms TPOT)`);
  assert.ok(sixteen > one + 1, `16 sequences ${sixteen.toFixed(2)} ms > 1 sequence ${one.toFixed(2)} ms`);
  assert.ok(
    sixteenLong > sixteen + 2,
    `more KV read costs more: ${sixteenLong.toFixed(2)} vs ${sixteen.toFixed(2)} ms`,
  );
});

test("requests wait when KV memory is full and run when it frees", () => {
  const m = new EngineModel(cfg({ numBlocks: 40 }));
  m.add(req("a", prompt(4, 400), 20)); // 420 tokens -> 27 blocks at the end
  m.add(req("b", prompt(5, 400), 20));
  const p = m.schedule()!;
  assert.equal(m.numRunning(), 1);
  assert.equal(m.numWaiting(), 1, "b does not fit next to a");
  assert.ok(m.usage() > 0.6);
  m.complete(p);
  const r = drain(m);
  assert.deepEqual(
    r.out.filter((o) => o.done).map((o) => o.id),
    ["a", "b"],
  );
  assert.equal(m.numWaiting(), 0);
  assert.equal(m.usage(), 0, "everything freed (cached blocks count as free)");
});

test("a request larger than the whole KV cache is refused", () => {
  const m = new EngineModel(cfg({ numBlocks: 10 }));
  assert.throws(() => m.add(req("big", prompt(6, 400))), /KV blocks/);
});

test("freed blocks stay cached and are evicted least recently used first, with BlockRemoved", () => {
  const m = new EngineModel(cfg({ numBlocks: 30 }));
  const mir = new Mirror();
  const a = prompt(7, 160);
  const b = prompt(8, 160);
  m.add(req("a", a, 1));
  drain(m, mir);
  m.add(req("b", b, 1));
  drain(m, mir);
  assert.equal(m.cachedBlocks(), 20, "a and b both cached after finishing");
  // touch a again so b is the least recently used
  m.add(req("a2", a, 1));
  drain(m, mir);
  // c needs 15 blocks: the 10 never-cached ones go first, then b's blocks tail first
  const c = prompt(9, 240);
  m.add(req("c", c, 1));
  drain(m, mir);
  const ah = blockHashesOf(a, 16, "");
  const bh = blockHashesOf(b, 16, "");
  const ch = blockHashesOf(c, 16, "");
  assert.ok(
    ah.every((h) => m.holds(h)),
    "recently used a survives",
  );
  assert.ok(!m.holds(bh[9]) && !m.holds(bh[5]), "b's tail went first");
  assert.ok(m.holds(bh[4]) && m.holds(bh[0]), "b's head outlives its tail");
  assert.ok(ch.every((h) => m.holds(h)));
  assert.equal(m.cachedBlocks(), 10 + 5 + 15);
  const cmp = (x: bigint, y: bigint) => (x < y ? -1 : x > y ? 1 : 0);
  assert.deepEqual(
    [...mir.held].sort(cmp),
    [...ah, ...bh, ...ch].filter((h) => m.holds(h)).sort(cmp),
    "the event mirror names exactly the held blocks",
  );
});

test("under memory pressure the newest running request is preempted and recomputed", () => {
  const m = new EngineModel(cfg({ numBlocks: 24 }));
  m.add(req("a", prompt(11, 150), 100));
  m.add(req("b", prompt(12, 150), 100));
  const r = drain(m);
  assert.ok(m.stats.preemptions > 0);
  assert.equal(r.out.filter((o) => o.done).length, 2);
  assert.equal(r.out.filter((o) => o.id === "a").length, 100);
  assert.equal(r.out.filter((o) => o.id === "b").length, 100);
});

test("KV events always match what the engine holds (shared prefixes, duplicates, eviction, aborts)", () => {
  const m = new EngineModel(cfg({ numBlocks: 300, maxNumBatchedTokens: 512 }));
  const mir = new Mirror();
  const docs = [0, 1, 2, 3, 4].map((d) => prompt(100 + d, 1200));
  let seed = 12345;
  const rnd = (n: number) => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  let id = 0;
  for (let round = 0; round < 60; round++) {
    for (let k = 0; k < 1 + rnd(4); k++) {
      const d = docs[rnd(docs.length)];
      const len = 200 + rnd(1000);
      m.add(req("q" + id++, prompt(1000 + id, len + 50, d.slice(0, len)), 1 + rnd(40)));
    }
    for (let s = 0; s < 1 + rnd(30); s++) {
      const p = m.schedule();
      mir.apply(m.drainEvents());
      if (!p) break;
      m.complete(p);
      mir.apply(m.drainEvents());
    }
    if (rnd(5) === 0) m.abort("q" + rnd(id));
    assert.equal(mir.held.size, m.cachedBlocks(), `round ${round}: mirror size == engine`);
    for (const h of mir.held) assert.ok(m.holds(h));
  }
  drain(m, mir);
  assert.equal(mir.held.size, m.cachedBlocks());
  assert.ok(m.stats.hits > 0, "shared documents produced cache hits");
  assert.equal(m.usage(), 0);
});

test("a prefix being computed is reused at once, as vLLM V1 caches blocks when it schedules them", () => {
  const m = new EngineModel(cfg());
  const mir = new Mirror();
  const doc = prompt(200, 4000);
  m.add(req("a", prompt(201, 4020, doc)));
  m.add(req("b", prompt(202, 4020, doc)));
  const p = m.schedule()!;
  assert.equal(m.drainEvents().length, 0, "events wait for the end of the step");
  // a computes the document; b, scheduled after it in the same step, only its own tail
  assert.equal(p.prefillTokens, 4020 + (4020 - 4000), `prefill tokens ${p.prefillTokens}`);
  const out = m.complete(p);
  mir.apply(m.drainEvents());
  assert.equal(mir.held.size, m.cachedBlocks(), "published once the step ended");
  const byId = new Map(out.map((o) => [o.id, o]));
  assert.equal(byId.get("a")!.cachedTokens, 0);
  assert.equal(byId.get("b")!.cachedTokens, 4000, "b's hit is the document a is computing");
  // a request that arrives while a long prompt is prefilled in chunks reuses the chunk
  // scheduled in the step it joins, not only the chunks already done
  const m2 = new EngineModel(cfg({ maxNumBatchedTokens: 2048 }));
  const long = prompt(300, 5000);
  m2.add(req("x", long.concat(prompt(301, 10)), 1));
  m2.complete(m2.schedule()!);
  m2.add(req("y", long.concat(prompt(302, 10)), 1));
  m2.complete(m2.schedule()!); // x's second chunk takes the whole budget
  const s3 = m2.schedule()!;
  const x3 = s3.items.find((i) => i.s.r.id === "x")!;
  const y3 = s3.items.find((i) => i.s.r.id === "y")!;
  assert.equal(x3.n, 5010 - 4096, "x's last chunk runs in this step");
  assert.equal(y3.s.computed, Math.floor(5000 / 16) * 16, "y's hit covers that chunk's shared blocks too");
  assert.equal(y3.n, 5010 - y3.s.computed);
});

test("clearing the cache mid-step forgets the step's blocks and its unpublished events", () => {
  const m = new EngineModel(cfg());
  const mir = new Mirror();
  m.add(req("a", prompt(210, 200), 1));
  const p = m.schedule()!;
  m.clearCache();
  m.complete(p);
  mir.apply(m.drainEvents());
  assert.equal(m.cachedBlocks(), 0);
  assert.equal(mir.held.size, 0);
});

test("LoRA: at most max-loras adapters per batch, a third waits; a cold adapter costs its load once, a resident one nothing", () => {
  const m = new EngineModel(cfg({ maxLoras: 2, loraLoadMs: 50 }));
  const r = (id: string, seed: number, lora: string) => ({ ...req(id, prompt(seed, 64), 3), lora });
  m.add(r("a", 1, "A"));
  m.add(r("b", 2, "B"));
  m.add(r("c", 3, "C"));
  m.add(r("a2", 4, "A"));
  const p1 = m.schedule()!;
  const ids = p1.items.map((x) => x.s.r.id).sort();
  assert.deepEqual(ids, ["a", "a2", "b"], "C does not fit; a later request of a running adapter goes first");
  assert.equal(p1.loraLoads, 2);
  assert.ok(p1.ms >= 100, `two loads priced: ${p1.ms}`);
  assert.deepEqual(m.loraInfo(), { running: ["A", "B"], waiting: ["C"] });
  m.complete(p1);
  const rest = drain(m);
  assert.equal(rest.out.filter((t) => t.done).length, 4);
  assert.equal(m.stats.loraLoads, 3, "C loaded once, into the slot of an idle adapter");
  m.add(r("d", 5, "C"));
  const p2 = m.schedule()!;
  assert.equal(p2.loraLoads, 0, "C is resident: no load");
  drain(m);
  const noLimit = new EngineModel(cfg());
  noLimit.add(r("x", 6, "A"));
  noLimit.add(r("y", 7, "B"));
  noLimit.add(r("z", 8, "C"));
  const p3 = noLimit.schedule()!;
  assert.equal(p3.items.length, 3, "max-loras 0: no limit");
  assert.equal(p3.loraLoads, 0);
});

test("--step-model roofline: a decode step carrying a short prefill costs about a decode step; a long prefill costs its tokens", () => {
  // Two streams decoding, then a third request arrives with n prompt tokens; the step that carries its prefill.
  const mixed = (model: "additive" | "roofline" | "knee", n: number) => {
    const m = new EngineModel(cfg({ stepModel: model }));
    m.add(req("a", prompt(1, 200), 50));
    m.add(req("b", prompt(2, 200), 50));
    let p = m.schedule()!;
    while (p.prefillTokens > 0) {
      m.complete(p);
      p = m.schedule()!;
    }
    const decodeOnly = p.ms;
    m.complete(p);
    m.add(req("c", prompt(3, n), 4));
    const q = m.schedule()!;
    assert.equal(q.prefillTokens, n);
    assert.equal(q.decodeSeqs, 2);
    return { decodeOnly, mixed: q.ms };
  };
  // 6.3 ms floor / 35 us per token: about 180 tokens fit under the floor.
  const add = mixed("additive", 120);
  const roof = mixed("roofline", 120);
  assert.ok(Math.abs(roof.decodeOnly - add.decodeOnly) < 1e-9, "a decode-only step is priced the same by both");
  assert.ok(add.mixed > add.decodeOnly + 4, `additive: 120 prefill tokens add ~4.2 ms (${add.mixed.toFixed(2)})`);
  assert.ok(roof.mixed < roof.decodeOnly + 0.5, `roofline: 120 prefill tokens ride along (${roof.mixed.toFixed(2)})`);
  const longRoof = mixed("roofline", 2000);
  assert.ok(
    longRoof.mixed > 2002 * 0.035,
    `roofline: a 2000-token chunk costs its tokens (${longRoof.mixed.toFixed(2)})`,
  );
});

test("--step-model knee (the default): a short prefill in a decode step costs part of its tokens, a long one all of them", () => {
  assert.equal(llama8bH100().stepModel, "knee");
  // Two streams decoding, then a third request whose whole prompt (n tokens) runs in the next step.
  const steps = (over: Partial<ModelConfig>, n: number) => {
    const m = new EngineModel(cfg(over));
    m.add(req("a", prompt(1, 200), 50));
    m.add(req("b", prompt(2, 200), 50));
    let p = m.schedule()!;
    while (p.prefillTokens > 0) {
      m.complete(p);
      p = m.schedule()!;
    }
    const decodeOnly = p.ms;
    m.complete(p);
    m.add(req("c", prompt(3, n), 4));
    const q = m.schedule()!;
    assert.equal(q.prefillTokens, n);
    return { decodeOnly, mixed: q.ms };
  };
  const knee = steps({}, 120);
  const add = steps({ stepModel: "additive" }, 120);
  const roof = steps({ stepModel: "roofline" }, 120);
  // 6.3 ms fixed, 35 us a token: 120 prefill tokens cost 4.2 ms added, 0 under the roofline; the knee in between.
  const kneeAdds = knee.mixed - knee.decodeOnly;
  assert.ok(kneeAdds > roof.mixed - roof.decodeOnly + 0.5, `knee: the chunk is not free (${kneeAdds.toFixed(2)} ms)`);
  assert.ok(
    kneeAdds < add.mixed - add.decodeOnly - 1,
    `knee: the chunk costs less than its tokens (${kneeAdds.toFixed(2)} ms)`,
  );
  assert.ok(Math.abs(knee.decodeOnly - add.decodeOnly) < 0.2, "a decode step of two streams is about the fixed cost");
  // p = 1 charges every token of the batch on top of the fixed cost; a large p is the roofline.
  const p1 = steps({ stepKneeExp: 1 }, 120);
  // (plus the chunk's attention and the decodes' one more KV token each: hundredths of a ms)
  assert.ok(Math.abs(p1.mixed - p1.decodeOnly - 120 * 0.035) < 0.05, "p = 1: every prefill token on top");
  const p50 = steps({ stepKneeExp: 50 }, 120);
  assert.ok(Math.abs(p50.mixed - roof.mixed) < 0.1, "large p: the roofline");
  // A long chunk is compute-bound under every model: its tokens dominate.
  // Additive charges the fixed cost on top of the tokens; the knee at most that, at least the tokens alone.
  const long = steps({}, 4000);
  const longAdd = steps({ stepModel: "additive" }, 4000);
  assert.ok(
    long.mixed <= longAdd.mixed + 1e-9 && long.mixed > longAdd.mixed - 6.3,
    `knee, 4000 tokens: ${long.mixed.toFixed(1)} ms, additive ${longAdd.mixed.toFixed(1)} ms`,
  );
});
