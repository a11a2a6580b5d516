// PD disaggregation, multimodal affinity, decode input-demand, session affinity,
// and the exactly-once release rules (issue 4).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { mk, blocks, cache, feats } from "./helpers";
import { DemandDecision } from "../../core/router";

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "p1", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
  { id: "d1", role: "decode" as const },
];

test("PD: a request gets a prefill pick and a decode pick; per-role weights override the global one", () => {
  const { st, r } = mk(PD, { overlapWeight: 1, prefillOverlapWeight: 20, decodeOverlapWeight: 0 });
  const req = blocks("pp", 10);
  cache(st, r, "p1", req.slice(0, 5));
  cache(st, r, "d1", req.slice(0, 5));
  // load p1 a little (a prompt it caches): weight 20 still prefers p1's cache; weight 0 ignores d1's
  const ld = blocks("ld", 3);
  cache(st, r, "p1", ld);
  assert.equal(r.pick(feats(ld)).prefill!.id, "p1");
  const p = r.pick(feats(req));
  assert.equal(p.prefill!.id, "p1");
  const pc = Object.fromEntries(p.candidates.map((c) => [c.id, c.cost]));
  assert.equal(pc.p1, 20 * 5 + r.activeBlocks("p1") - 10, "cost used weight 20 before this pick held blocks");
  const dc = Object.fromEntries(p.decodeCandidates!.map((c) => [c.id, c]));
  assert.equal(dc.d1.cost, dc.d1.active, "decode weight 0: cost is load only");
  assert.equal(p.target.role, "decode");
  const unset = mk(PD, { overlapWeight: 3 });
  const p2 = unset.r.pick(feats(req));
  assert.equal(p2.candidates[0].cost, 3 * 10, "unset role weights fall back to --kv-overlap-weight");
});

test("PD guards: prefill load released at first token by default, at completion with --pd-prefill-guard-release completion", () => {
  for (const mode of ["first-token", "completion"] as const) {
    const { r } = mk(PD, { pdPrefillGuardRelease: mode });
    const p = r.pick(feats(blocks("g", 4)));
    assert.equal(r.activeBlocks(p.prefill!.id), 4);
    assert.equal(r.activeBlocks(p.target.id), 4);
    p.reservation.firstToken();
    assert.equal(r.activeBlocks(p.prefill!.id), mode === "first-token" ? 0 : 4, mode);
    assert.equal(r.activeBlocks(p.target.id), 4);
    p.reservation.firstToken();
    p.reservation.finish();
    p.reservation.finish();
    assert.equal(r.activeBlocks(p.prefill!.id), 0);
    assert.equal(r.activeBlocks(p.target.id), 0);
    assert.equal(r.openGuards(), 0);
  }
});

test("a worker leaving keeps live reservations; late completion never touches the recreated entry", () => {
  const { r } = mk([{ id: "a" }], { decodeInputDemand: "off" });
  const p = r.pick(feats(blocks("late", 6)));
  assert.equal(r.activeBlocks("a"), 6);
  r.removeWorker("a");
  r.addWorker({ id: "a", address: "127.0.0.1:8000", role: "mixed" });
  assert.equal(r.activeBlocks("a"), 0, "recreated entry starts clean");
  const q = r.pick(feats(blocks("new", 2)));
  assert.equal(r.activeBlocks("a"), 2);
  assert.doesNotThrow(() => p.reservation.finish());
  assert.equal(r.activeBlocks("a"), 2, "old completion did not subtract from the new entry");
  q.reservation.finish();
  assert.equal(r.activeBlocks("a"), 0);
  assert.equal(r.openGuards(), 0);
});

test("release never throws, even when the store fails", () => {
  const { st, r } = mk([{ id: "a" }]);
  const p = r.pick(feats(blocks("t", 2)));
  const orig = st.load.release;
  st.load.release = () => {
    throw new Error("store down");
  };
  assert.doesNotThrow(() => p.reservation.finish());
  st.load.release = orig;
});

test("fuzz: random pick / first-token / EOF / cancel / abandon / worker-leave sequences end with every counter at zero", () => {
  let seed = 12345;
  const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 4294967296;
  for (let round = 0; round < 30; round++) {
    const demand = (["off", "shadow", "on"] as const)[round % 3];
    const { r } = mk(PD, {
      decodeInputDemand: demand,
      decodeRequestWeight: 10,
      sessionAffinity: round % 2 ? "both" : "off",
      pdPrefillGuardRelease: round % 4 < 2 ? "first-token" : "completion",
    });
    const live: { finish(): void; firstToken(): void }[] = [];
    for (let step = 0; step < 300; step++) {
      const x = rnd();
      if (x < 0.4) {
        try {
          const bs = blocks("f" + Math.floor(rnd() * 5), 1 + Math.floor(rnd() * 6));
          live.push(
            r.pick(
              feats(bs, { inputTokens: 10 + Math.floor(rnd() * 100), n: rnd() < 0.2 ? -1 : 2 }),
              rnd() < 0.5 ? "s" + Math.floor(rnd() * 3) : null,
            ).reservation,
          );
        } catch (e) {
          assert.match((e as Error).message, /no workers available/);
        }
      } else if (x < 0.55 && live.length) live[Math.floor(rnd() * live.length)].firstToken();
      else if (x < 0.85 && live.length) {
        // EOF, cancel, failure and abandon all call finish; races call it twice
        const i = Math.floor(rnd() * live.length);
        live[i].finish();
        if (rnd() < 0.3) live[i].finish();
        live.splice(i, 1);
      } else if (x < 0.92) {
        const w = PD[Math.floor(rnd() * PD.length)];
        r.removeWorker(w.id);
      } else {
        const w = PD[Math.floor(rnd() * PD.length)];
        r.addWorker({ id: w.id, address: "127.0.0.1:1", role: w.role });
      }
    }
    for (const l of live) l.finish();
    for (const w of PD) r.addWorker({ id: w.id, address: "127.0.0.1:1", role: w.role });
    assert.equal(r.openGuards(), 0, `round ${round}`);
    for (const w of r.workers()) {
      assert.equal(r.activeBlocks(w.id), 0);
      assert.deepEqual(r.demand(w.id), { tokens: 0, requests: 0 });
    }
  }
});

test("multimodal: text overlap dropped, image affinity decides, unseen image -> load balance, exact pick log line", () => {
  const logs: string[] = [];
  const { st, r } = mk([{ id: "a" }, { id: "b" }], {}, logs);
  const text = blocks("tx", 8);
  cache(st, r, "a", text); // same text blocks cached on a: must not count for media requests
  const img1 = feats(text, { mediaHashes: ["1111111111111111"] });
  const first = r.pick(img1);
  const cost = Object.fromEntries(first.candidates.map((c) => [c.id, c.cost]));
  assert.equal(cost.a, cost.b, "cached text on a does not pull an image request");
  assert.equal(first.mmAffinityHits, 0);
  first.reservation.finish();
  const w = first.target.id;
  const again = r.pick(img1);
  assert.equal(again.target.id, w, `image affinity: ${w} served this image`);
  assert.equal(again.mmAffinityHits, 1);
  assert.ok(
    logs.includes(`pick policy=kv-aware role=prefill picked=${w} mm_images=1 mm_affinity_hits=1`),
    logs.join("\n"),
  );
  assert.ok(logs.includes(`pick policy=kv-aware role=prefill picked=${w} mm_images=1 mm_affinity_hits=0`));
  // unseen image: w is loaded (again still held), so load balance sends it to the other
  const other = r.pick(feats(text, { mediaHashes: ["2222222222222222"] }));
  assert.equal(other.target.id, w === "a" ? "b" : "a");
  assert.equal(other.mmAffinityHits, 0);
});

test("multimodal under PD: prefill pool by image affinity, decode by load", () => {
  const { r } = mk(PD);
  const f = (h: string) => feats(blocks("m" + h[0], 4), { mediaHashes: [h] });
  const A = "aaaaaaaaaaaaaaaa";
  const a = r.pick(f(A));
  a.reservation.finish();
  const b = r.pick(f(A));
  assert.equal(b.prefill!.id, a.prefill!.id, "same image -> same prefill worker");
  assert.equal(b.mmAffinityHits, 1);
  // b is still in flight on one decode worker: the next media request's decode goes to the other
  const next = r.pick(f(A));
  assert.notEqual(next.target.id, b.target.id);
  b.reservation.finish();
  next.reservation.finish();
});

test("image LRU is bounded: the oldest image stops being a hit", () => {
  const { st, r } = mk(
    [
      { id: "p", role: "prefill" },
      { id: "d", role: "decode" },
    ],
    { mmLruSize: 2 },
  );
  const hits = (h: string) => {
    const p = r.pick(feats([], { mediaHashes: [h] }));
    p.reservation.finish();
    return p.mmAffinityHits;
  };
  const [A, B, C] = ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc"];
  assert.deepEqual([hits(A), hits(A), hits(B), hits(C)], [0, 1, 0, 0]);
  assert.equal(st.images.list(r.worker("p")!.epochKey).join(","), [B, C].join(","), "most recent last, two kept");
  assert.equal(hits(A), 0, "A was evicted");
  assert.equal(hits(C), 1);
});

test("decode input-demand on: projected demand = in-flight input tokens + this request x n + W x held requests", () => {
  const { r, demand } = mk(PD, { decodeInputDemand: "on", decodeRequestWeight: 0 });
  const big = r.pick(feats(blocks("x", 1), { inputTokens: 1000 }));
  const d1 = big.target.id;
  assert.deepEqual(r.demand(d1), { tokens: 1000, requests: 1 });
  const small = r.pick(feats(blocks("y", 1), { inputTokens: 10, n: 3 }));
  assert.notEqual(small.target.id, d1, "demand steers away from the worker holding 1000 tokens");
  assert.deepEqual(r.demand(small.target.id), { tokens: 30, requests: 1 }, "input tokens x n");
  const dec = demand[1] as DemandDecision;
  assert.equal(dec.mode, "on");
  assert.equal(dec.input, "exact");
  const row = dec.candidates.find((c) => c.id === d1)!;
  assert.equal(row.demand, 1000 + 30);
  big.reservation.finish();
  small.reservation.finish();
  assert.deepEqual(r.demand(d1), { tokens: 0, requests: 0 });
  // invalid n counts as 1; estimate is reported as such
  const e = r.pick(feats([], { inputTokens: 7, n: 0, exact: false }));
  assert.equal(r.demand(e.target.id).tokens, 7);
  assert.equal((demand[2] as DemandDecision).input, "estimate");
});

test("decode-request-weight adds W x held requests; ties fall to original load, then candidate order", () => {
  const { r } = mk(PD, { decodeInputDemand: "on", decodeRequestWeight: 500 });
  const a = r.pick(feats([], { inputTokens: 100 }));
  const b = r.pick(feats([], { inputTokens: 100 }));
  assert.notEqual(a.target.id, b.target.id);
  // equal demand on both (100 + 500 each): tie -> original cost (equal: no blocks) -> candidate order
  const c = r.pick(feats([], { inputTokens: 1 }));
  assert.equal(c.target.id, "d0");
  const { r: r2 } = mk(PD, { decodeInputDemand: "on", decodeRequestWeight: 0 });
  const bs = blocks("tie", 3);
  const h = r2.pick(feats(bs, { inputTokens: 0 })); // holds 3 active blocks on one decode worker, 0 tokens
  const t = r2.pick(feats(blocks("o", 2), { inputTokens: 0 }));
  assert.notEqual(t.target.id, h.target.id, "equal demand: lower original load wins");
});

test("shadow keeps the original selection, books demand, reports agreement", () => {
  const { r, demand } = mk(PD, { decodeInputDemand: "shadow" });
  const on = mk(PD, { decodeInputDemand: "off" });
  const reqs = [1000, 10, 10, 500].map((n, i) => feats(blocks("s" + i, 2), { inputTokens: n }));
  const shadowTargets = reqs.map((f) => r.pick(f).target.id);
  const offTargets = reqs.map((f) => on.r.pick(f).target.id);
  assert.deepEqual(shadowTargets, offTargets, "shadow never changes the choice");
  assert.equal(demand.length, 4);
  for (const d of demand as DemandDecision[]) {
    assert.equal(d.mode, "shadow");
    assert.equal(d.actual, d.original);
    assert.equal(d.agrees, d.suggestion === d.original);
  }
  const total = r.workers().reduce((s, w) => s + r.demand(w.id).tokens, 0);
  assert.equal(total, 1520, "shadow books in-flight tokens");
  assert.deepEqual(on.r.demand("d0"), { tokens: 0, requests: 0 }, "off books nothing");
});

test("session affinity both: bound session keeps its decode target (still booked); demand only picks first target or a replacement", () => {
  const { r, demand } = mk(PD, { decodeInputDemand: "on", sessionAffinity: "both" });
  const first = r.pick(feats(blocks("a", 2), { inputTokens: 5000 }), "S");
  assert.equal(demand.length, 1);
  const second = r.pick(feats(blocks("b", 2), { inputTokens: 10 }), "S");
  assert.equal(second.target.id, first.target.id, "bound although demand would move it");
  assert.equal(second.prefill!.id, first.prefill!.id);
  assert.equal(demand.length, 1, "demand not consulted for a bound session");
  assert.equal(r.demand(first.target.id).tokens, 5010, "bound target still booked");
  r.removeWorker(first.target.id);
  const third = r.pick(feats(blocks("c", 2), { inputTokens: 10 }), "S");
  assert.notEqual(third.target.id, first.target.id);
  assert.equal(demand.length, 2, "replacement chosen by demand");
  const fourth = r.pick(feats(blocks("d", 2), { inputTokens: 10 }), "S");
  assert.equal(fourth.target.id, third.target.id);
  for (const p of [first, second, third, fourth]) p.reservation.finish();
  assert.equal(r.openGuards(), 0);
});

test("session affinity prefill: prefill bound, decode chosen fresh", () => {
  const { st, r } = mk(PD, { sessionAffinity: "prefill" });
  const a = r.pick(feats(blocks("q", 2)), "S");
  cache(st, r, a.prefill!.id === "p0" ? "p1" : "p0", blocks("z", 8)); // would pull a fresh pick away
  const b = r.pick(feats(blocks("z", 8)), "S");
  assert.equal(b.prefill!.id, a.prefill!.id);
  const { r: agg } = mk([{ id: "x" }, { id: "y" }], { sessionAffinity: "prefill" });
  const s1 = agg.pick(feats(blocks("k", 3)), "T");
  const s2 = agg.pick(feats(blocks("k2", 3)), "T");
  assert.equal(s2.target.id, s1.target.id, "aggregated: the single target is bound");
  const none = mk([{ id: "x" }, { id: "y" }]);
  const n1 = none.r.pick(feats(blocks("k", 3)), "T");
  assert.notEqual(none.r.pick(feats(blocks("k2", 3)), "T").target.id, n1.target.id, "off: load decides");
});

test("session table is bounded: past 100k sessions it starts over", () => {
  const { st, r } = mk([{ id: "x" }, { id: "y" }], { sessionAffinity: "prefill" });
  for (let i = 0; i < 100001; i++) r.pick(feats([]), "s" + i).reservation.finish();
  assert.ok(st.sessions.size() <= 100000);
  assert.ok(st.sessions.get("s100000") !== null, "the newest binding survives");
});

test("--pd-decider prefix: decode-first when the decode pick holds all but N prompt tokens or the prompt is short; else the prefill hop", () => {
  // The decode side routes on its cache here so the holder is the decode pick.
  const cfg = {
    pdDecider: "prefix" as const,
    pdDecodeFirstMaxUncachedTokens: 64,
    pdDecodeFirstMaxPromptTokens: 96,
    decodeOverlapWeight: 20,
  };
  const logs: string[] = [];
  const { st, r } = mk(PD, cfg, logs);
  const req = blocks("dfirst", 20); // 320 tokens
  cache(st, r, "d1", req.slice(0, 17)); // 48 uncached on d1
  const a = r.pick(feats(req));
  assert.equal(a.target.id, "d1");
  assert.equal(a.prefill, null, "no prefill hop: nobody named as prefill peer");
  assert.equal(a.pdPath, "decode-first");
  assert.equal(a.uncachedTokens, 48, "what the decode worker computes itself");
  assert.equal(r.activeBlocks("p0") + r.activeBlocks("p1"), 0, "no load held on the prefill pool");
  assert.equal(r.activeBlocks("d1"), 20);
  assert.match(logs.join("\n"), /pick policy=kv-aware role=prefill picked=d1 /);
  assert.match(logs.join("\n"), /pd-decider path=decode-first uncached=48 prompt=320/);
  a.reservation.firstToken();
  a.reservation.finish();
  a.reservation.finish();
  assert.equal(r.openGuards(), 0, "released once, nothing left");

  cache(st, r, "d0", req.slice(0, 10)); // best decode holder leaves 160 > 64 uncached
  const other = blocks("dcold", 20);
  const b = r.pick(feats(other));
  assert.equal(b.pdPath, "prefill");
  assert.ok(b.prefill && b.prefill.role === "prefill", "cold prompt takes the prefill hop");
  b.reservation.finish();
  const short = r.pick(feats(blocks("dshort", 6))); // 96 tokens, nothing cached
  assert.equal(short.pdPath, "decode-first", "short prompt: no hop");
  assert.equal(short.prefill, null);
  short.reservation.finish();
  assert.equal(r.openGuards(), 0);

  const off = mk(PD, { ...cfg, pdDecider: "off" });
  cache(off.st, off.r, "d1", req.slice(0, 17));
  const c = off.r.pick(feats(req));
  assert.equal(c.pdPath, null);
  assert.ok(c.prefill, "decider off: every PD request takes the hop");
});

test("--pd-decider prefix: of the decode workers that can take a request decode-first, the one with the fewest running streams does", () => {
  const cfg = { pdDecider: "prefix" as const, pdDecodeFirstMaxUncachedTokens: 64, decodeOverlapWeight: 20 };
  const { st, r } = mk(PD, cfg);
  const req = blocks("shared", 20); // 320 tokens
  cache(st, r, "d1", req.slice(0, 19)); // 16 uncached on d1
  cache(st, r, "d0", req.slice(0, 17)); // 48 uncached on d0: both can take it decode-first
  // Two streams running on d1 (their own prompts, cached only there).
  const busy = [0, 1].map((i) => {
    const b = blocks("busy" + i, 8); // 128 tokens: 16 uncached on d1, all on d0
    cache(st, r, "d1", b.slice(0, 7));
    const x = r.pick(feats(b));
    assert.equal(x.target.id, "d1");
    x.reservation.firstToken();
    return x;
  });
  const a = r.pick(feats(req));
  assert.equal(a.pdPath, "decode-first");
  assert.equal(a.target.id, "d0", "d1 holds more but runs two streams; d0 runs none and also qualifies");
  assert.equal(a.uncachedTokens, 48);
  a.reservation.finish();
  // Only d1 qualifies (d0 would compute 160 > 64): d1 despite its streams.
  const req2 = blocks("only-d1", 20);
  cache(st, r, "d1", req2.slice(0, 19));
  cache(st, r, "d0", req2.slice(0, 10));
  const b = r.pick(feats(req2));
  assert.equal(b.pdPath, "decode-first");
  assert.equal(b.target.id, "d1");
  b.reservation.finish();
  for (const x of busy) x.reservation.finish();
  assert.equal(r.openGuards(), 0);
});

test("--pd-decode-first-max-interference: decode-first only while uncached tokens x guards held on the decode pick fit the budget", () => {
  const cfg = {
    pdDecider: "prefix" as const,
    pdDecodeFirstMaxUncachedTokens: 64,
    decodeOverlapWeight: 20,
    pdDecodeFirstMaxInterference: 100, // 48 uncached: 2 held pass (96), 4 do not (192)
  };
  const logs: string[] = [];
  const { st, r } = mk(PD, cfg, logs);
  const req = blocks("guard", 20); // 320 tokens
  cache(st, r, "d1", req.slice(0, 17)); // 48 uncached on d1
  const first = r.pick(feats(req));
  assert.equal(first.target.id, "d1");
  assert.equal(first.pdPath, "decode-first", "idle decode worker: nobody to stall");
  // A decode-first request still prefilling on d1 holds two guards there (its stream and its queued prefill).
  const second = r.pick(feats(req));
  assert.equal(second.target.id, "d1");
  assert.equal(second.pdPath, "decode-first", "48 x 2 within 100");
  const third = r.pick(feats(req));
  assert.equal(third.target.id, "d1", "the decode pick is unchanged; only the path changes");
  assert.equal(third.pdPath, "prefill", "48 x 4 over 100: the prefill hop");
  assert.ok(third.prefill && third.prefill.role === "prefill");
  assert.match(logs.join("\n"), /pd-decider path=prefill uncached=48 prompt=320 running=4 guarded=1/);
  third.reservation.finish();
  first.reservation.firstToken();
  second.reservation.firstToken();
  const fourth = r.pick(feats(req));
  assert.equal(fourth.pdPath, "decode-first", "their prefills done, two streams decoding: 48 x 2 within 100 again");
  fourth.reservation.finish();
  first.reservation.finish();
  second.reservation.finish();
  assert.equal(r.openGuards(), 0, "released once on every path");

  // Without the guard the same third request goes decode-first.
  const un = mk(PD, { ...cfg, pdDecodeFirstMaxInterference: 0 });
  cache(un.st, un.r, "d1", req.slice(0, 17));
  const held = [0, 1].map(() => un.r.pick(feats(req)));
  const u = un.r.pick(feats(req));
  assert.equal(u.pdPath, "decode-first", "0 = no guard");
  u.reservation.finish();
  held.forEach((h) => h.reservation.finish());
});

test("--pd-decider prefix on a fleet that is not disaggregated changes nothing", () => {
  const { r } = mk([{ id: "a" }, { id: "b" }], { pdDecider: "prefix", pdDecodeFirstMaxPromptTokens: 1000 });
  const p = r.pick(feats(blocks("mixed", 4)));
  assert.equal(p.prefill, null);
  assert.equal(p.pdPath, null);
});

test("--kv-source-hint on: the holder is named only when the pick went elsewhere (holder loaded)", () => {
  const logs: string[] = [];
  const { st, r } = mk([{ id: "a" }, { id: "b" }], { kvSourceHint: "on", overlapWeight: 0.5 }, logs);
  const req = blocks("kvs", 40);
  cache(st, r, "a", req.slice(0, 30));
  const free = r.pick(feats(req));
  assert.equal(free.target.id, "a", "holder idle: picked");
  assert.equal(free.kvSource, null, "no hint when the holder is the target");
  free.reservation.finish();
  const busy = r.pick(feats(blocks("load", 200))); // lands on a or b; load a if needed
  if (busy.target.id !== "a") {
    busy.reservation.finish();
    r.holdOn("a", { blocks: blocks("load2", 200), tokens: 0, requests: 0 } as never);
  }
  const p = r.pick(feats(req));
  assert.equal(p.target.id, "b", "holder loaded: the other worker");
  assert.equal(p.kvSource?.id, "a", "the holder is named as KV source");
  assert.match(logs.join("\n"), /kv-source hint holder=a holder_hits=30 picked=b picked_hits=0/);
  const off = mk([{ id: "a" }, { id: "b" }], { overlapWeight: 0.5 });
  cache(off.st, off.r, "a", req.slice(0, 30));
  off.r.pick(feats(blocks("load", 200)));
  assert.equal(off.r.pick(feats(req)).kvSource, null, "off by default");
});

test("--kv-source-hint on: a holder keeps only the part of its prefix advantage a pull would not give back (kv-pull scorer)", () => {
  // Default overlap weight 8: 30 cached blocks are worth 240 to the holder when the others would compute them,
  // 72 when they can pull them (kv-pull gives back 0.7 of the weight). 100 blocks of load on the holder sit between.
  const pick = (cfg: Record<string, unknown>) => {
    const { st, r } = mk([{ id: "a" }, { id: "b" }], cfg);
    const req = blocks("pull", 40);
    cache(st, r, "a", req.slice(0, 30));
    r.holdOn("a", { blocks: blocks("hold", 100), tokens: 0, requests: 0 } as never);
    return r.pick(feats(req));
  };
  const off = pick({});
  assert.equal(off.target.id, "a", "hint off: recomputing 30 blocks elsewhere costs more than the holder's queue");
  const on = pick({ kvSourceHint: "on" });
  assert.equal(on.target.id, "b", "hint on: a pull is cheap, the idle worker takes it");
  assert.equal(on.kvSource?.id, "a");
  const noCredit = pick({ kvSourceHint: "on", scorerWeights: { "kv-pull": 0 } });
  assert.equal(noCredit.target.id, "a", "--scorer-weights kv-pull=0 restores the compute price");
});
