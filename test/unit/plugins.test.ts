// Table-driven tests of each scheduling plugin on its own: given a fleet and
// state, the terms a scorer returns, the workers a filter keeps, the row a
// picker chooses.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { memoryState } from "../../core/state/memory";
import { defaultConfig } from "../../core/router";
import { PickContext, Row, runProfile, ProfileName, policyNames, scorerNames } from "../../core/scheduling/framework";
import { createRouter } from "../../core/router";
import { parseCommand } from "../../runtime/args";
import { produce } from "../../core/scheduling/data";
import { usableFilter } from "../../core/scheduling/plugins/filter/usable";
import { rolePoolFilter } from "../../core/scheduling/plugins/filter/role-pool";
import { prefixOverlapScorer } from "../../core/scheduling/plugins/scorer/prefix-overlap";
import { imageAffinityScorer } from "../../core/scheduling/plugins/scorer/image-affinity";
import { activeBlocksScorer } from "../../core/scheduling/plugins/scorer/active-blocks";
import { queuedPrefillScorer } from "../../core/scheduling/plugins/scorer/queued-prefill";
import { queuedSharedScorer } from "../../core/scheduling/plugins/scorer/queued-shared";
import { kvCapacityScorer } from "../../core/scheduling/plugins/scorer/kv-capacity";
import { engineReadings } from "../../core/engine-readings";
import { lowestCostPicker } from "../../core/scheduling/plugins/picker/lowest-cost";
import { roundRobinPicker } from "../../core/scheduling/plugins/picker/round-robin";
import { randomPicker } from "../../core/scheduling/plugins/picker/random";
import { decideDemand } from "../../core/scheduling/decode-demand";
import { BlockHash, Features, Role, RouterConfig, Worker } from "../../core/types";
import "../../core/scheduling/plugins";
import { memoryLoraTable } from "../../core/lora";
import { loraSlotsFilter } from "../../core/scheduling/plugins/filter/lora-slots";
import { loraAffinityScorer } from "../../core/scheduling/plugins/scorer/lora-affinity";

const B = (n: number, p = "b") => Array.from({ length: n }, (_, i) => `${p}${i}` as BlockHash);

function setup(
  roles: Role[],
  opts: { config?: Partial<RouterConfig>; features?: Partial<Features>; profile?: ProfileName; pd?: boolean } = {},
) {
  const state = memoryState();
  const fleet: Worker[] = roles.map((role, i) =>
    state.workers.add({ id: `w${i}`, address: `127.0.0.1:${9000 + i}`, role }),
  );
  const ctx: PickContext = {
    features: { blocks: B(4), inputTokens: 64, exact: true, mediaHashes: [], n: 1, ...opts.features },
    // Weight 1 keeps the expected costs readable; weight resolution has its own table.
    config: { ...defaultConfig(), overlapWeight: 1, ...opts.config },
    state,
    fleet,
    profile: opts.profile ?? "prefill",
    pd: opts.pd ?? false,
    sessionId: null,
    session: null,
    previous: null,
    random: () => 0.5,
    cycle: {},
    latency: null,
    now: Date.now,
  };
  // Rows as the data stage produces them for the whole fleet (the filters have their own cases).
  const rows = (): Row[] => produce(ctx, fleet);
  return { state, fleet, ctx, rows };
}

test("filter usable: block size, exclusion and health", () => {
  const cases: { name: string; prep: (s: ReturnType<typeof setup>) => void; keep: string[] }[] = [
    { name: "all fine", prep: () => undefined, keep: ["w0", "w1", "w2"] },
    { name: "excluded", prep: (s) => s.state.workers.exclude(s.fleet[1].epochKey, "x"), keep: ["w0", "w2"] },
    { name: "unhealthy", prep: (s) => s.state.workers.setHealthy(s.fleet[0].epochKey, false), keep: ["w1", "w2"] },
    { name: "block size", prep: (s) => (s.fleet[2].blockSize = 32), keep: ["w0", "w1"] },
  ];
  for (const c of cases) {
    const s = setup(["mixed", "mixed", "mixed"]);
    c.prep(s);
    assert.deepEqual(
      usableFilter.filter(s.ctx, s.fleet).map((w) => w.id),
      c.keep,
      c.name,
    );
  }
});

test("filter role-pool: PD pools put dedicated workers first, then mixed", () => {
  const roles: Role[] = ["mixed", "decode", "prefill", "decode"];
  const cases: { profile: ProfileName; pd: boolean; keep: string[] }[] = [
    { profile: "prefill", pd: true, keep: ["w2", "w0"] },
    { profile: "decode", pd: true, keep: ["w1", "w3", "w0"] },
    { profile: "prefill", pd: false, keep: ["w0", "w1", "w2", "w3"] },
    { profile: "decode", pd: false, keep: [] },
  ];
  for (const c of cases) {
    const s = setup(roles, { profile: c.profile, pd: c.pd });
    assert.deepEqual(
      rolePoolFilter.filter(s.ctx, s.fleet).map((w) => w.id),
      c.keep,
      `${c.profile} pd=${c.pd}`,
    );
  }
});

test("scorer prefix-overlap: request blocks minus the longest cached prefix; weight per role", () => {
  const cases: { cached: number[]; want: number[] }[] = [
    { cached: [0, 0], want: [4, 4] },
    { cached: [4, 1], want: [0, 3] },
    { cached: [2, 3], want: [2, 1] },
  ];
  for (const c of cases) {
    const s = setup(["mixed", "mixed"]);
    c.cached.forEach((n, i) => B(n).forEach((h) => s.state.mirror.store(s.fleet[i].epochKey, "e" + h, h)));
    const rows = s.rows();
    assert.deepEqual(prefixOverlapScorer.score(s.ctx, rows), c.want);
    assert.deepEqual(
      rows.map((r) => r.hits),
      c.cached,
    );
  }
  const weights: { config: Partial<RouterConfig>; profile: ProfileName; pd: boolean; media?: boolean; want: number }[] =
    [
      { config: {}, profile: "prefill", pd: false, want: 1 },
      { config: { overlapWeight: 0 }, profile: "prefill", pd: false, want: 0 },
      { config: { prefillOverlapWeight: 20 }, profile: "prefill", pd: true, want: 20 },
      { config: { prefillOverlapWeight: 20 }, profile: "prefill", pd: false, want: 1 },
      { config: { decodeOverlapWeight: 2 }, profile: "decode", pd: true, want: 2 },
      { config: {}, profile: "prefill", pd: false, media: true, want: 0 },
      { config: { policy: "round-robin" }, profile: "prefill", pd: false, media: true, want: 1 },
    ];
  for (const w of weights) {
    const s = setup(["mixed"], {
      config: w.config,
      profile: w.profile,
      pd: w.pd,
      features: w.media ? { mediaHashes: ["img"] } : {},
    });
    assert.equal(prefixOverlapScorer.weight(s.ctx), w.want, JSON.stringify(w));
  }
});

test("scorer image-affinity: (images - hits) x max(1, blocks/images), prefill only", () => {
  const cases: { seen: string[][]; blocks: number; want: number[] }[] = [
    { seen: [[], []], blocks: 4, want: [4, 4] },
    { seen: [["i0", "i1"], ["i0"]], blocks: 4, want: [0, 2] },
    { seen: [[], ["i1"]], blocks: 1, want: [2, 1] },
  ];
  for (const c of cases) {
    const s = setup(["mixed", "mixed"], { features: { blocks: B(c.blocks), mediaHashes: ["i0", "i1"] } });
    c.seen.forEach((h, i) => s.state.images.touch(s.fleet[i].epochKey, h, 8));
    assert.equal(imageAffinityScorer.weight(s.ctx), 1);
    assert.deepEqual(imageAffinityScorer.score(s.ctx, s.rows()), c.want);
  }
  assert.equal(imageAffinityScorer.weight(setup(["mixed"], { features: { mediaHashes: [] } }).ctx), 0);
});

test("scorer active-blocks: distinct in-flight blocks the request does not share (prefill); all of them (decode)", () => {
  const cases: { profile: ProfileName; want: number[] }[] = [
    { profile: "prefill", want: [1, 0, 1] },
    { profile: "decode", want: [5, 0, 1] },
  ];
  for (const c of cases) {
    const s = setup(["mixed", "mixed", "mixed"], { profile: c.profile, pd: c.profile === "decode" });
    s.state.load.hold(s.fleet[0].epochKey, B(3), 0, 0);
    s.state.load.hold(s.fleet[0].epochKey, B(5), 0, 0); // request blocks b0..b3 are among these
    s.state.load.hold(s.fleet[2].epochKey, B(1, "z"), 0, 0);
    const rows = s.rows();
    assert.deepEqual(activeBlocksScorer.score(s.ctx, rows), c.want, c.profile);
    assert.deepEqual(
      rows.map((r) => r.active),
      [5, 0, 1],
    );
  }
});

test("scorer queued-prefill: queued blocks at half the overlap weight, the ones the request shares at full", () => {
  const s = setup(["mixed", "mixed", "mixed"], {
    config: { overlapWeight: 4 },
    features: { blocks: ["d0", "d1", "d2", "q7"] as BlockHash[] },
  });
  const g = s.state.load.hold(s.fleet[1].epochKey, [], 0, 0, 40);
  // Waiting behind another request's queued block costs half of prefilling one of the request's own.
  assert.equal(queuedPrefillScorer.weight(s.ctx), 2);
  assert.equal(queuedPrefillScorer.weight(setup(["mixed", "mixed"], { config: { overlapWeight: 0 } }).ctx), 0);
  assert.deepEqual(queuedPrefillScorer.score(s.ctx, s.rows()), [0, 40, 0]);
  s.state.load.release(g);
  s.ctx.cycle = {};
  assert.deepEqual(queuedPrefillScorer.score(s.ctx, s.rows()), [0, 0, 0]);
  // w0 is computing the document for an earlier question: its 3 shared blocks count twice, q1 once.
  const doc = ["d0", "d1", "d2", "q1"] as BlockHash[];
  s.state.load.hold(s.fleet[0].epochKey, doc, 0, 0);
  s.state.load.hold(s.fleet[0].epochKey, doc, 0, 0, doc.length);
  s.ctx.cycle = {};
  assert.deepEqual(queuedPrefillScorer.score(s.ctx, s.rows()), [7, 0, 0]);
  // With w1 and w2 idle the burst spreads: w0 costs 4 x 1 (q7) + 2 x 7 + 1 (q1 in flight) = 19, a copy 4 x 4 = 16.
  const rows = runProfile(s.ctx);
  assert.deepEqual(
    rows.map((r) => r.cost),
    [19, 16, 16],
  );
});

test("scorer queued-shared: credits queued blocks the request shares, only while no worker is idle", () => {
  const s = setup(["mixed", "mixed", "mixed"], {
    config: { overlapWeight: 3 },
    features: { blocks: ["d0", "d1", "d2", "q7"] as BlockHash[] },
  });
  const doc = ["d0", "d1", "d2", "q1"] as BlockHash[];
  // w0 is computing the document for an earlier question; w1 is busy with something else.
  s.state.load.hold(s.fleet[0].epochKey, doc, 0, 0);
  s.state.load.hold(s.fleet[0].epochKey, doc, 0, 0, doc.length);
  s.state.load.hold(s.fleet[1].epochKey, B(2, "x"), 0, 0);
  s.state.load.hold(s.fleet[1].epochKey, B(2, "x"), 0, 0, 2);
  assert.equal(queuedSharedScorer.weight(s.ctx), 3);
  assert.deepEqual(queuedSharedScorer.score(s.ctx, s.rows()), [0, 0, 0], "w2 is idle: a copy there delays nobody");
  s.state.load.hold(s.fleet[2].epochKey, B(1, "y"), 0, 0);
  s.ctx.cycle = {};
  assert.deepEqual(queuedSharedScorer.score(s.ctx, s.rows()), [-3, 0, 0]);
  // In the whole pipeline the credit cancels the wait for the shared part only: w0 pays half a block for q1.
  s.ctx.cycle = {};
  const rows = runProfile(s.ctx);
  assert.deepEqual(
    rows.map((r) => 1.5 * r.terms["queued-prefill"] + 3 * (r.terms["queued-shared"] || 0)),
    [1.5, 3, 0],
  );
  assert.equal(lowestCostPicker.pick(s.ctx, rows), 0, "the worker computing the document");
  assert.equal(queuedSharedScorer.weight(setup(["mixed"], { config: { overlapWeight: 0 } }).ctx), 0);
});

test("scorer kv-capacity: blocks the worker would need past its capacity; 0 when it is unknown", () => {
  // Request: 10 blocks; every worker has capacity 40 (w3: unknown).
  // w0 caches 6 of them (no running request holds them) and runs 32 other blocks:
  //    the cached 6 still need room, 32 + 10 - 40 = 2 over.
  // w1 runs 35 other blocks: 35 + 10 - 40 = 5 over.
  // w2's engine reports 95% usage (38 blocks, more than its ledger's 2): 38 + 10 - 40 = 8 over.
  // w4 runs the request's first 6 blocks and 28 others: 34 + 4 - 40, fits.
  const s = setup(["mixed", "mixed", "mixed", "mixed", "mixed"], { features: { blocks: B(10, "q") } });
  s.state.engine = engineReadings();
  const cap = (i: number, capacityBlocks: number | null, kvUsage: number | null) =>
    s.state.engine!.set(s.fleet[i].epochKey, {
      capacityBlocks,
      kvUsage,
      waitingRequests: 0,
      runningRequests: 0,
      at: 1,
    });
  cap(0, 40, 0.1);
  cap(1, 40, null);
  cap(2, 40, 0.95);
  cap(3, null, 0.99);
  cap(4, 40, 0.5);
  B(6, "q").forEach((h) => s.state.mirror.store(s.fleet[0].epochKey, h, h));
  s.state.load.hold(s.fleet[0].epochKey, B(32, "a"), 0, 0);
  s.state.load.hold(s.fleet[1].epochKey, B(35, "b"), 0, 0);
  s.state.load.hold(s.fleet[2].epochKey, B(2, "c"), 0, 0);
  s.state.load.hold(s.fleet[3].epochKey, B(50, "d"), 0, 0);
  s.state.load.hold(s.fleet[4].epochKey, B(6, "q").concat(B(28, "e")), 0, 0);
  const rows = s.rows();
  assert.deepEqual(
    rows.map((r) => [r.data.capacityBlocks, r.data.kvUsage, r.data.hits, r.data.inflight]),
    [
      [40, 0.1, 6, 0],
      [40, null, 0, 0],
      [40, 0.95, 0, 0],
      [null, 0.99, 0, 0],
      [40, 0.5, 6, 6],
    ],
  );
  assert.deepEqual(kvCapacityScorer.score(s.ctx, rows), [2, 5, 8, 0, 0]);
  // Off by default; named in --scorer-weights it runs (at that weight), not for empty prompts.
  assert.equal(kvCapacityScorer.weight(s.ctx), 0);
  const on = { ...s.ctx, config: { ...s.ctx.config, scorerWeights: { "kv-capacity": 8 } } };
  assert.equal(kvCapacityScorer.weight(on), s.ctx.config.overlapWeight);
  assert.equal(kvCapacityScorer.weight({ ...on, features: { ...s.ctx.features, blocks: [] } }), 0);
  assert.deepEqual(
    runProfile(on).map((r) => r.terms["kv-capacity"]),
    [2, 5, 8, 0, 0],
  );
  assert.deepEqual(
    runProfile(s.ctx).map((r) => r.terms["kv-capacity"]),
    [undefined, undefined, undefined, undefined, undefined],
  );
  // Without readings (no engine table) the data stage leaves them null and the term is 0.
  const bare = setup(["mixed"], { features: { blocks: B(10, "q") } });
  bare.state.load.hold(bare.fleet[0].epochKey, B(99, "x"), 0, 0);
  assert.deepEqual(kvCapacityScorer.score(bare.ctx, bare.rows()), [0]);
});

test("pickers: lowest cost with tie-breaks, round-robin, random", () => {
  const cases: { rows: [number, number, number][]; want: number }[] = [
    {
      rows: [
        [5, 0, 0],
        [3, 0, 0],
        [4, 0, 0],
      ],
      want: 1,
    },
    {
      rows: [
        [3, 2, 0],
        [3, 1, 0],
        [3, 1, 0],
      ],
      want: 1,
    },
    {
      rows: [
        [3, 1, 9],
        [3, 1, 2],
        [3, 1, 5],
      ],
      // Cached blocks break no tie: the same pick as with nothing cached (-1).
      want: -1,
    },
    {
      rows: [
        [1, 0, 0],
        [1, 0, 0],
        [1, 0, 0],
      ],
      want: -1,
    },
  ];
  const bare = setup(["mixed", "mixed", "mixed"]);
  const tieWithNothingCached = lowestCostPicker.pick(
    bare.ctx,
    bare.rows().map((r) => ({ ...r, cost: 1, active: 0 })),
  );
  for (const c of cases) {
    const s = setup(["mixed", "mixed", "mixed"]);
    c.rows.forEach(([, , cached], i) =>
      B(cached, "c" + i).forEach((h) => s.state.mirror.store(s.fleet[i].epochKey, h, h)),
    );
    const rows = s.rows().map((r, i) => ({ ...r, cost: c.rows[i][0], active: c.rows[i][1] }));
    const want = c.want < 0 ? tieWithNothingCached : c.want;
    assert.equal(lowestCostPicker.pick(s.ctx, rows), want, JSON.stringify(c.rows));
  }
  // Workers still tied split cold prompts by their first block, whatever they
  // hold: the empty one (a restarted or dead worker's cleared mirror) gets its
  // share, not every pick.
  const spread = [0, 0, 0];
  for (let i = 0; i < 30; i++) {
    const t = setup(["mixed", "mixed", "mixed"], { features: { blocks: B(4, "cold" + i) } });
    B(9, "c0").forEach((h) => t.state.mirror.store(t.fleet[0].epochKey, h, h));
    B(5, "c2").forEach((h) => t.state.mirror.store(t.fleet[2].epochKey, h, h));
    spread[
      lowestCostPicker.pick(
        t.ctx,
        t.rows().map((r) => ({ ...r, cost: 3, active: 1 })),
      )
    ]++;
    // A tie between fewer than all rows picks among those rows only.
    const part = lowestCostPicker.pick(
      t.ctx,
      t.rows().map((r, j) => ({ ...r, cost: j === 1 ? 9 : 3, active: 1 })),
    );
    assert.notEqual(part, 1);
  }
  for (const n of spread) assert.ok(n >= 5, JSON.stringify(spread));
  // A request without blocks (under one block) takes turns among the tied rows.
  const nb = setup(["mixed", "mixed", "mixed"], { features: { blocks: [] } });
  assert.deepEqual(
    [0, 1, 2, 3, 4, 5].map(() =>
      lowestCostPicker.pick(
        nb.ctx,
        nb.rows().map((r) => ({ ...r, cost: 3, active: 1 })),
      ),
    ),
    [0, 1, 2, 0, 1, 2],
  );
  const s = setup(["mixed", "mixed", "mixed"]);
  assert.deepEqual(
    [0, 1, 2, 3].map(() => roundRobinPicker.pick(s.ctx, s.rows())),
    [0, 1, 2, 0],
  );
  assert.equal(randomPicker.pick(s.ctx, s.rows()), 1, "random 0.5 of 3 rows");
});

test("decode-demand: in-flight tokens + this request x n + W x requests; ties by original cost", () => {
  const cases: {
    held: [number, number][];
    cost: number[];
    w: number;
    n: number;
    mode: "shadow" | "on";
    want: string;
    agrees: boolean;
  }[] = [
    {
      held: [
        [0, 0],
        [0, 0],
      ],
      cost: [2, 1],
      w: 0,
      n: 1,
      mode: "on",
      want: "w1",
      agrees: false,
    },
    {
      held: [
        [500, 1],
        [100, 1],
      ],
      cost: [0, 5],
      w: 0,
      n: 2,
      mode: "on",
      want: "w1",
      agrees: false,
    },
    {
      held: [
        [500, 1],
        [100, 1],
      ],
      cost: [0, 5],
      w: 0,
      n: 2,
      mode: "shadow",
      want: "w0",
      agrees: false,
    },
    {
      held: [
        [100, 0],
        [0, 10],
      ],
      cost: [0, 0],
      w: 20,
      n: 1,
      mode: "on",
      want: "w0",
      agrees: true,
    },
  ];
  for (const c of cases) {
    const s = setup(["decode", "decode"], {
      profile: "decode",
      pd: true,
      config: { decodeInputDemand: c.mode, decodeRequestWeight: c.w },
      features: { n: c.n },
    });
    c.held.forEach(([t, r], i) => s.state.load.hold(s.fleet[i].epochKey, [], t, r));
    const rows = s.rows().map((r, i) => ({ ...r, cost: c.cost[i] }));
    const d = decideDemand(s.ctx, rows, 0);
    assert.equal(d.decision.actual, c.want, JSON.stringify(c));
    assert.equal(d.decision.agrees, c.agrees);
    assert.equal(d.decision.candidates[0].demand, c.held[0][0] + 64 * c.n + c.w * c.held[0][1]);
  }
});

test("runProfile: cost is the weighted sum of the scorers' terms (seed's worked example)", () => {
  const s = setup(["mixed", "mixed"], { features: { blocks: B(10, "q") } });
  B(8, "q").forEach((h) => s.state.mirror.store(s.fleet[0].epochKey, h, h));
  s.state.load.hold(s.fleet[0].epochKey, B(6, "l"), 0, 0);
  s.state.load.hold(s.fleet[1].epochKey, B(1, "m"), 0, 0);
  const rows = runProfile(s.ctx);
  assert.deepEqual(
    rows.map((r) => [r.cost, r.terms["prefix-overlap"], r.terms["active-blocks"]]),
    [
      [8, 2, 6],
      [11, 10, 1],
    ],
  );
});

test("policies and scorers come from the registry: unknown names fail at start, naming the valid ones", () => {
  assert.deepEqual(policyNames().sort(), ["kv-aware", "random", "round-robin"]);
  assert.deepEqual(scorerNames().sort(), [
    "active-blocks",
    "image-affinity",
    "kv-capacity",
    "kv-pull",
    "lora-affinity",
    "prefix-overlap",
    "queued-prefill",
    "queued-shared",
    "slo-ttft",
  ]);
  assert.throws(
    () => parseCommand("router", ["--scorer-weights", "prefix-overlp=0"], {}),
    /--scorer-weights.*unknown scorer prefix-overlp \(known: .*prefix-overlap.*\)/,
  );
  assert.throws(
    () => parseCommand("router", ["--router-policy", "least-load"], {}),
    /--router-policy.*kv-aware, round-robin, random/,
  );
  // nginx reads the same names from its variables; createRouter refuses them too.
  assert.throws(
    () => createRouter(memoryState(), { ...defaultConfig(), scorerWeights: { nope: 1 } }),
    /unknown scorer nope \(known: /,
  );
  assert.throws(
    () => createRouter(memoryState(), { ...defaultConfig(), policy: "least-load" as never }),
    /unknown policy least-load \(known: kv-aware, round-robin, random\)/,
  );
});

test("round-robin and random run no scorers; the data stage still fills every row", () => {
  for (const policy of ["round-robin", "random"] as const) {
    const s = setup(["mixed", "mixed"], { config: { policy } });
    B(3).forEach((h) => s.state.mirror.store(s.fleet[1].epochKey, h, h));
    s.state.load.hold(s.fleet[0].epochKey, B(2, "z"), 0, 0);
    const rows = runProfile(s.ctx);
    assert.deepEqual(
      rows.map((r) => [r.cost, Object.keys(r.terms).length]),
      [
        [0, 0],
        [0, 0],
      ],
      policy,
    );
    assert.deepEqual(
      rows.map((r) => [r.data.hits, r.data.active, r.data.held]),
      [
        [0, 2, 1],
        [3, 0, 0],
      ],
      policy,
    );
  }
});

test("filter lora-slots and scorer lora-affinity: full workers out while another has room; loaded < recent < cold < evicting", () => {
  const s = setup(["mixed", "mixed", "mixed", "mixed"], { features: { model: "A" } });
  const t = memoryLoraTable();
  s.state.lora = t;
  const now = 1000;
  s.ctx.now = () => now;
  t.set("w0", { maxLora: 1, running: ["B"], waiting: [] }); // full of B
  t.set("w1", { maxLora: 2, running: ["A"], waiting: [] }); // A loaded
  t.set("w2", { maxLora: 2, running: [], waiting: [] }); // free slot
  t.set("w3", { maxLora: 2, running: [], waiting: [] });
  t.note("w3", "C", now - 10);
  t.note("w3", "D", now - 5);
  t.set("w3", { maxLora: 2, running: [], waiting: [] }); // C and D probably resident: A evicts one
  assert.deepEqual(
    loraSlotsFilter.filter(s.ctx, s.fleet).map((w) => w.id),
    ["w1", "w2", "w3"],
  );
  assert.deepEqual(loraAffinityScorer.score(s.ctx, s.rows()), [512, 0, 256, 384]);
  assert.equal(loraAffinityScorer.weight(s.ctx), 1);
  // Every worker full: the filter keeps them all.
  for (const id of ["w1", "w2", "w3"]) t.set(id, { maxLora: 1, running: ["B"], waiting: [] });
  assert.equal(loraSlotsFilter.filter(s.ctx, s.fleet).length, 4);
  // A base-model request (not an adapter): both inert.
  s.ctx.features.model = "base";
  assert.equal(loraAffinityScorer.weight(s.ctx), 0);
  assert.equal(loraSlotsFilter.filter(s.ctx, s.fleet.slice(1)).length, 3);
});
