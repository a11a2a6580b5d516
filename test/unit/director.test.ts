// The request director's decision table (runtime/director.ts) on a real App:
// the real pipeline, real load ledger and admission queues, no transport.
// route -> fallbacks, subset, EPP saturation shed (429), objective shed (429
// with retry-after), admission wait (released by a first token, bounded by
// the max wait, cancelled by the stream's end).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { App } from "../../runtime/app";
import { parseArgs } from "../../runtime/config";
import { Decision, DEST_KEY, RouteInput, Routed } from "../../runtime/director";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const W = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"];

function app(workers: string[], extra: string[] = []): App {
  const a = new App(
    parseArgs(["--workers", workers.join(","), "--health-interval-ms", "0", ...extra], {}),
    () => undefined,
    noEvents,
  );
  a.setWorkers(a.opts.workers);
  return a;
}

/** A chat request; cold (well over --prefill-admission-warm-tokens uncached) unless short. */
function input(seed: string, opts: Partial<RouteInput> & { short?: boolean } = {}): RouteInput {
  const content = opts.short ? `hi ${seed}` : `${seed} `.repeat(900);
  return {
    endpoint: "chat",
    body: Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content }] })),
    headers: { ":path": "/v1/chat/completions", ...(opts.headers ?? {}) },
    subset: opts.subset ?? null,
    end: opts.end,
  };
}

function routed(d: Decision): Routed {
  assert.equal(d.kind, "route", JSON.stringify(d.kind === "refuse" ? d : d.destination));
  return d as Routed;
}

/** Whether the promise has settled after the pending callbacks ran. */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  void p.then(() => (done = true));
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
  return done;
}

test("route: the pick's headers, and fallbacks cheapest first without the loaded worker", async () => {
  const a = app(W, ["--epp-fallback-endpoints", "1"]);
  try {
    const first = routed(await a.director.decide(input("alpha")));
    assert.equal(first.headers[a.opts.upstreamHeader], first.pick.target.address);
    assert.equal(first.headers["x-infera-worker"], first.pick.target.id);
    assert.equal(first.outcome, "routed");
    assert.ok(a.router.activeBlocks(first.pick.target.id) > 0, "the routed pick holds load");
    // A second, unrelated prompt avoids the loaded worker; its one fallback is the idle one, not the loaded.
    const second = routed(await a.director.decide(input("bravo")));
    const dests = second.destination.split(",");
    assert.equal(dests.length, 2);
    assert.equal(dests[0], second.pick.target.address);
    assert.notEqual(second.pick.target.address, first.pick.target.address);
    assert.ok(!dests.includes(first.pick.target.address), `loaded worker is not the fallback: ${second.destination}`);
    assert.equal(second.headers[DEST_KEY], second.destination);
    assert.deepEqual(
      second.remove.filter((h) => h in second.headers),
      [],
      "nothing set is also removed",
    );
    first.reservation.finish();
    second.reservation.finish();
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("subset: only the gateway's endpoints are candidates; an empty subset is a 503", async () => {
  const a = app(W);
  try {
    const only = routed(await a.director.decide(input("charlie", { subset: [W[2]] })));
    assert.equal(only.pick.target.address, W[2]);
    only.reservation.finish();
    const none = await a.director.decide(input("charlie", { subset: [] }));
    assert.equal(none.kind, "refuse");
    assert.equal(none.kind === "refuse" && none.status, 503);
    assert.equal(none.outcome, "no_worker");
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("EPP saturation shed: a sheddable objective gets 429 once every candidate is loaded, and holds nothing", async () => {
  const a = app(W.slice(0, 2), [
    "--epp-shed-active-blocks",
    "1",
    "--epp-sheddable-objectives",
    "batch",
    "--prefill-admission-slots",
    "0",
  ]);
  try {
    const batch = { "x-gateway-inference-objective": "batch" };
    const held = [routed(await a.director.decide(input("delta"))), routed(await a.director.decide(input("echo")))];
    assert.notEqual(held[0].pick.target.id, held[1].pick.target.id, "one request on each worker");
    const guards = a.router.openGuards();
    const shed = await a.director.decide(input("foxtrot", { headers: batch }));
    assert.equal(shed.kind, "refuse");
    assert.equal(shed.kind === "refuse" && shed.status, 429);
    assert.equal(shed.outcome, "shed");
    assert.equal(a.router.openGuards(), guards, "the shed pick's load went back");
    // Not sheddable: routed on the same saturated fleet.
    routed(await a.director.decide(input("golf"))).reservation.finish();
    // One worker idle again: the sheddable request goes.
    held[0].reservation.finish();
    routed(await a.director.decide(input("hotel", { headers: batch }))).reservation.finish();
    held[1].reservation.finish();
  } finally {
    await a.close();
  }
});

test("objective shed: a sheddable cold prompt whose worker has no prefill slot gets 429 with retry-after", async () => {
  const a = app(W.slice(0, 1), ["--objectives", "batch=-10", "--objective-headers", "trust"]);
  try {
    const first = routed(await a.director.decide(input("india")));
    const d = await a.director.decide(input("juliet", { headers: { "x-gateway-inference-objective": "batch" } }));
    assert.equal(d.kind, "refuse");
    if (d.kind !== "refuse") return;
    assert.equal(d.status, 429);
    assert.equal(d.headers["retry-after"], "1");
    assert.match(await a.metrics.registry.metrics(), /infera_router_shed_total\{priority="-10"\} 1/);
    // A warm sheddable prompt takes no slot: not shed.
    const warm = routed(
      await a.director.decide(input("kilo", { short: true, headers: { "x-gateway-inference-objective": "batch" } })),
    );
    warm.reservation.finish();
    first.reservation.finish();
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("objective shed before tokenizing: every worker busy and the prompt cold on all of them: 429 without a pick; warm or with a free worker: served", async () => {
  const a = app(W.slice(0, 2), ["--objectives", "batch=-1", "--objective-headers", "trust"]);
  const batch = { "x-gateway-inference-objective": "batch" };
  const picks = async () =>
    Number(((await a.metrics.registry.metrics()).match(/infera_router_pick_latency_seconds_count (\S+)/) ?? [])[1]);
  const chat = (content: string): RouteInput => ({
    endpoint: "chat",
    body: Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content }] })),
    headers: { ":path": "/v1/chat/completions", ...batch },
    subset: null,
  });
  try {
    const h1 = routed(await a.director.decide(input("mike")));
    const h2 = routed(await a.director.decide(input("november")));
    assert.notEqual(h1.pick.target.id, h2.pick.target.id, "each worker holds a cold prefill");
    const before = await picks();
    const d = await a.director.decide(input("oscar", { headers: batch }));
    assert.equal(d.kind === "refuse" && d.status, 429);
    assert.equal(d.kind === "refuse" && d.headers["retry-after"], "1");
    assert.equal(await picks(), before, "refused before the pick: nothing was tokenized whole, hashed or scored");
    assert.match(await a.metrics.registry.metrics(), /infera_router_shed_total\{priority="-1"\} 1/);
    // Warm on a busy worker (h1's prompt is in flight there, this one adds a
    // short question to it): the early check cannot rule it out, the pick
    // finds it warm, and it is served.
    const warm = routed(await a.director.decide(chat(`${"mike ".repeat(900)}and one short question`)));
    assert.equal(warm.pick.target.id, h1.pick.target.id);
    assert.equal(await picks(), before + 1);
    warm.reservation.finish();
    // A worker with a free slot: the cold request goes there.
    h2.reservation.finish();
    const free = routed(await a.director.decide(input("papa", { headers: batch })));
    assert.equal(free.pick.target.id, h2.pick.target.id);
    free.reservation.finish();
    h1.reservation.finish();
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("objective shed before tokenizing: a sheddable request the early check lets through is parsed and rendered once", async () => {
  const a = app(W.slice(0, 2), ["--objectives", "batch=-1", "--objective-headers", "trust"]);
  const tok = a.tokenizer!;
  const render = tok.renderChat.bind(tok);
  let renders = 0;
  tok.renderChat = (c) => {
    renders++;
    return render(c);
  };
  try {
    const h1 = routed(await a.director.decide(input("quebec")));
    const h2 = routed(await a.director.decide(input("romeo")));
    assert.notEqual(h1.pick.target.id, h2.pick.target.id, "each worker holds a cold prefill");
    renders = 0;
    // Every worker busy, so the early check parses and renders it; warm on h1's worker, so it is let through.
    const warm = routed(
      await a.director.decide({
        endpoint: "chat",
        body: Buffer.from(
          JSON.stringify({
            model: "m",
            messages: [{ role: "user", content: `${"quebec ".repeat(900)}and a question` }],
          }),
        ),
        headers: { ":path": "/v1/chat/completions", "x-gateway-inference-objective": "batch" },
        subset: null,
      }),
    );
    assert.equal(warm.pick.target.id, h1.pick.target.id);
    assert.equal(renders, 1, "the pick reuses the early check's rendered prompt");
    // A request without the early check (priority 0) renders once too.
    renders = 0;
    routed(await a.director.decide(input("sierra", { short: true }))).reservation.finish();
    assert.equal(renders, 1);
    warm.reservation.finish();
    h1.reservation.finish();
    h2.reservation.finish();
  } finally {
    await a.close();
  }
});

test("admit-wait: a cold prompt waits for the slot, goes at the first token, and a stream end cancels it", async () => {
  const a = app(W.slice(0, 1));
  try {
    const first = routed(await a.director.decide(input("lima")));
    assert.equal(a.admission.busy(first.pick.target.id), 1, "the cold prompt holds the worker's slot");
    const second = a.director.decide(input("mike"));
    assert.equal(await settled(second), false, "the second cold prompt waits");
    assert.equal(a.admission.waiting(), 1);
    const end = { ended: false, onEnd: null as (() => void) | null };
    const third = a.director.decide(input("november", { end }));
    assert.equal(await settled(third), false);
    assert.equal(a.admission.waiting(), 2);
    // The stream of the third ends: 499, its load and its place in the queue go back.
    const guards = a.router.openGuards();
    // As the processor ends it (extproc/processor.ts gone()).
    end.ended = true;
    end.onEnd?.();
    const gone = await third;
    assert.equal(gone.kind === "refuse" && gone.status, 499);
    assert.equal(gone.outcome, "client_closed");
    assert.equal(a.admission.waiting(), 1);
    assert.ok(a.router.openGuards() < guards);
    // The first's first token frees the slot: the second goes.
    first.reservation.firstToken();
    const went = routed(await second);
    assert.equal(a.admission.busy(went.pick.target.id), 1, "the second now holds the slot");
    went.reservation.finish();
    first.reservation.finish();
    assert.equal(a.admission.busy(went.pick.target.id), 0);
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("admit-wait is bounded: with --queue-ttl-ms 0, past --prefill-admission-max-wait-ms the request goes anyway", async () => {
  const a = app(W.slice(0, 1), ["--prefill-admission-max-wait-ms", "50", "--queue-ttl-ms", "0"]);
  try {
    const first = routed(await a.director.decide(input("oscar")));
    const t0 = Date.now();
    // The wait's timer does not hold the process open (unref): this test's own timer does.
    const keep = setTimeout(() => undefined, 5000);
    const second = routed(await a.director.decide(input("papa")));
    clearTimeout(keep);
    assert.ok(Date.now() - t0 >= 40, "it waited");
    assert.match(await a.metrics.registry.metrics(), /infera_router_prefill_admission_forced_total 1/);
    second.reservation.finish();
    first.reservation.finish();
    assert.equal(a.admission.busy(first.pick.target.id), 0);
  } finally {
    await a.close();
  }
});

test("defaults: at the wait bound a standard request gets 503, a critical one is sent (never expired)", async () => {
  const a = app(W.slice(0, 1), [
    "--prefill-admission-max-wait-ms",
    "60",
    "--objectives",
    "critical=100,standard=0",
    "--objective-headers",
    "trust",
  ]);
  try {
    const first = routed(await a.director.decide(input("romeo")));
    const keep = setTimeout(() => undefined, 5000);
    const std = a.director.decide(input("sierra", { headers: { "x-gateway-inference-objective": "standard" } }));
    const crit = a.director.decide(input("tango", { headers: { "x-gateway-inference-objective": "critical" } }));
    const [s, c] = await Promise.all([std, crit]);
    clearTimeout(keep);
    assert.equal(s.kind, "refuse");
    assert.equal(s.kind === "refuse" && s.status, 503);
    assert.equal(s.kind === "refuse" && s.headers["x-llm-d-request-dropped-reason"], "rejected-ttl-expired");
    const sent = routed(c);
    const m = await a.metrics.registry.metrics();
    assert.match(m, /infera_router_flow_expired_total\{priority="0"\} 1/);
    assert.doesNotMatch(m, /infera_router_flow_expired_total\{priority="100"\}/);
    assert.match(m, /infera_router_prefill_admission_forced_total 1/);
    sent.reservation.finish();
    first.reservation.finish();
    assert.equal(a.admission.busy(first.pick.target.id), 0);
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("served elsewhere: the load moves to the known worker the gateway used; an unknown one only counts", async () => {
  const a = app(W.slice(0, 2));
  try {
    const d = routed(await a.director.decide(input("quebec")));
    const other = W.find((x) => x !== d.pick.target.address)!;
    const blocks = a.router.activeBlocks(d.pick.target.id);
    assert.equal(a.director.served(d, d.pick.target.address), null, "served where picked: nothing moves");
    assert.equal(a.director.served(d, "127.0.0.1:9"), null, "not a known worker");
    assert.equal(a.router.activeBlocks(d.pick.target.id), blocks);
    const moved = a.director.served(d, other);
    assert.ok(moved);
    assert.equal(a.router.activeBlocks(d.pick.target.id), 0);
    assert.equal(a.router.activeBlocks(other), blocks);
    assert.match(await a.metrics.registry.metrics(), /infera_router_epp_served_elsewhere_total\{known="false"\} 1/);
    d.reservation.finish();
    a.router.releaseGuard(moved!);
    assert.equal(a.router.activeBlocks(other), 0);
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("a trusted x-slo-ttft-ms reaches the pick (the slo-ttft scorer runs); an untrusted one does not", async () => {
  /** How many picks ran the slo-ttft scorer (its per-plugin latency histogram). */
  async function sloRuns(a: App): Promise<number> {
    const m = (await a.metrics.registry.getMetricsAsJSON()).find(
      (x) => x.name === "infera_router_plugin_duration_seconds",
    );
    const count = m?.values.find(
      (v) =>
        (v as { metricName?: string }).metricName === "infera_router_plugin_duration_seconds_count" &&
        v.labels.plugin === "slo-ttft",
    );
    return count ? Number(count.value) : 0;
  }
  for (const trust of ["trust", "ignore"]) {
    const a = app(W, ["--objective-headers", trust]);
    try {
      const before = await sloRuns(a);
      const d = routed(await a.director.decide(input(`slo-${trust}`, { headers: { "x-slo-ttft-ms": "500" } })));
      d.reservation.finish();
      const plain = routed(await a.director.decide(input(`plain-${trust}`)));
      plain.reservation.finish();
      assert.equal((await sloRuns(a)) - before, trust === "trust" ? 1 : 0, `--objective-headers ${trust}`);
    } finally {
      await a.close();
    }
  }
});

test("admit-wait and speed learning: the request the first token lets go is timed with nothing ahead of it", async () => {
  // One worker, prefill admission on (the default): the second cold prompt
  // waits for the first's first token. When it goes, the first's prefill is
  // done, so the speed model must not count it as queued ahead.
  const a = app(W.slice(0, 1));
  const seen: { tokens: number; queued: number }[] = [];
  const lm = a.router.latency!;
  const observe = lm.observe.bind(lm);
  lm.observe = (e, tokens, running, ms, attention, queued) => {
    seen.push({ tokens, queued: queued || 0 });
    observe(e, tokens, running, ms, attention, queued);
  };
  try {
    const first = routed(await a.director.decide(input("oscar")));
    const second = a.director.decide(input("papa"));
    assert.equal(await settled(second), false, "the second cold prompt waits");
    first.reservation.firstToken();
    const went = routed(await second);
    assert.equal(lm.inEngine(went.pick.target.epochKey) > 0, true, "the second is in the engine");
    went.reservation.firstToken();
    assert.equal(seen.length, 2);
    assert.equal(seen[1].queued, 0, `queued ahead of the second: ${seen[1].queued} tokens`);
    assert.equal(lm.inEngine(went.pick.target.epochKey), 0, "nothing left in the engine");
    went.reservation.finish();
    first.reservation.finish();
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});

test("late binding at entry: a cold prompt moved to a free slot as it arrives is timed and tracked on the worker it went to", async () => {
  // Two workers; w0 is prefilling a cold prompt (its slot held) and w1 runs
  // three prompts under the warm threshold (no slot, more load). A fourth,
  // cold prompt is picked for w0 (less load) but finds its slot busy: with
  // late binding it moves to w1's free slot inside admission's enter(). The
  // speed model and the scheduler replica must count it on w1, from its
  // dispatch; w0 must not keep a request that never went there.
  const a = app(W.slice(0, 2), ["--prefill-admission-warm-tokens", "3000"]);
  const sized = (seed: string, words: number): RouteInput => {
    const content = `${seed}: ` + "the quick brown fox jumps over the lazy dog. ".repeat(words / 10);
    return { ...input(seed), body: Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content }] })) };
  };
  const big = (seed: string) => sized(seed, 5000);
  const medium = (seed: string) => sized(seed, 2400);
  const lm = a.router.latency!;
  const twin = lm.twin!;
  const ek = (i: number) => a.router.workers().find((w) => w.address === W[i])!.epochKey;
  try {
    const x = routed(await a.director.decide({ ...big("quebec"), subset: [W[0]] }));
    assert.equal(x.pick.target.address, W[0]);
    assert.equal(a.admission.busy(x.pick.target.id), 1, "the cold prompt holds w0's slot");
    const loaders = [];
    for (const s of ["romeo", "sierra", "tango"])
      loaders.push(routed(await a.director.decide({ ...medium(s), subset: [W[1]] })));
    assert.equal(a.admission.busy(loaders[0].pick.target.id), 0, "warm by the threshold: no slot");
    assert.ok(a.router.activeBlocks(loaders[0].pick.target.id) > a.router.activeBlocks(x.pick.target.id));
    const before = [twin.view(ek(0)).waiting, twin.view(ek(1)).waiting];
    const inEngine = lm.inEngine(ek(1));
    const y = a.director.decide(big("uniform"));
    assert.equal(await settled(y), true, "it went at once, to the free slot");
    const went = routed(await y);
    assert.equal(went.pick.target.address, W[1], "moved to w1");
    assert.deepEqual(
      [twin.view(ek(0)).waiting, twin.view(ek(1)).waiting],
      [before[0], before[1] + 1],
      "the replica holds it on w1, and nothing more on w0",
    );
    assert.ok(lm.inEngine(ek(1)) > inEngine, "its prefill counts as in w1's engine");
    went.reservation.firstToken();
    assert.equal(twin.view(ek(1)).waiting, before[1], "its first token takes it out of w1's queue");
    for (const r of [went, x, ...loaders]) r.reservation.finish();
    assert.equal(a.router.openGuards(), 0);
  } finally {
    await a.close();
  }
});
