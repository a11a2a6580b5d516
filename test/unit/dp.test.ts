// Data-parallel ranks are route targets; replay endpoints and ranks survive a
// fleet re-list without a new epoch (no mirror churn).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { parseWorkers, parseArgs } from "../../runtime/config";
import { specsFromEtcd } from "../../runtime/etcd";
import { expandDp, offsetPort } from "../../core/fleet";
import { App } from "../../runtime/app";
import { isRoutingHeader } from "../../extproc/server";

const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };

test("--workers: /dp=N expands to N targets with events and replay on port + rank; /tagged keeps one socket", () => {
  const w = parseWorkers(
    "decode=127.0.0.1:8000/dp=2@tcp://127.0.0.1:5557+tcp://127.0.0.1:5600,127.0.0.1:9000/dp=3/tagged@tcp://127.0.0.1:7000,127.0.0.1:9100@tcp://h:1+tcp://h:2",
  );
  assert.deepEqual(w.slice(0, 2), [
    {
      id: "127.0.0.1:8000/dp0",
      address: "127.0.0.1:8000",
      role: "decode",
      dpRank: 0,
      dpEvents: "port",
      events: "tcp://127.0.0.1:5557",
      replay: "tcp://127.0.0.1:5600",
    },
    {
      id: "127.0.0.1:8000/dp1",
      address: "127.0.0.1:8000",
      role: "decode",
      dpRank: 1,
      dpEvents: "port",
      events: "tcp://127.0.0.1:5558",
      replay: "tcp://127.0.0.1:5601",
    },
  ]);
  assert.deepEqual(
    w.slice(2, 5).map((x) => [x.id, x.events, x.dpRank, x.dpEvents]),
    [
      ["127.0.0.1:9000/dp0", "tcp://127.0.0.1:7000", 0, "tagged"],
      ["127.0.0.1:9000/dp1", "tcp://127.0.0.1:7000", 1, "tagged"],
      ["127.0.0.1:9000/dp2", "tcp://127.0.0.1:7000", 2, "tagged"],
    ],
  );
  assert.deepEqual(w[5], {
    id: "127.0.0.1:9100",
    address: "127.0.0.1:9100",
    role: "mixed",
    events: "tcp://h:1",
    replay: "tcp://h:2",
  });
  assert.throws(() => parseWorkers("127.0.0.1:1/dp=x"), /not \[role=\]host:port/);
  assert.equal(offsetPort("nats-subject", 3), "nats-subject");
  assert.deepEqual(expandDp({ id: "a", address: "a:1", role: "mixed" }, 1, "port"), [
    { id: "a", address: "a:1", role: "mixed" },
  ]);
});

test("etcd: dp_size / dp_events / kv_replay in a registration", () => {
  const s = specsFromEtcd(
    "w0",
    JSON.stringify({
      address: "10.0.0.5:8000",
      kv_events: "tcp://10.0.0.5:5557",
      kv_replay: "tcp://10.0.0.5:5700",
      dp_size: 2,
    }),
  );
  assert.deepEqual(
    s.map((x) => [x.id, x.events, x.replay, x.dpRank]),
    [
      ["w0/dp0", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5700", 0],
      ["w0/dp1", "tcp://10.0.0.5:5558", "tcp://10.0.0.5:5701", 1],
    ],
  );
  assert.equal(specsFromEtcd("w1", JSON.stringify({ address: "h:1" })).length, 1);
});

test("each rank is its own target (mirror, load); re-listing the same fleet keeps every epoch", async () => {
  const app = new App(
    parseArgs(
      ["--workers", "127.0.0.1:8000/dp=2@tcp://127.0.0.1:5557+tcp://127.0.0.1:5600", "--health-interval-ms", "0"],
      {},
    ),
    () => undefined,
    noEvents,
  );
  app.setWorkers(app.opts.workers);
  const before = app.router.workers().map((w) => w.epochKey);
  app.setWorkers(parseArgs(["--workers", "127.0.0.1:8000/dp=2@tcp://127.0.0.1:5557+tcp://127.0.0.1:5600"], {}).workers);
  assert.deepEqual(
    app.router.workers().map((w) => w.epochKey),
    before,
    "no re-add: replay and rank are kept on the worker",
  );
  assert.deepEqual(
    app.router.workers().map((w) => [w.id, w.dpRank, w.replay]),
    [
      ["127.0.0.1:8000/dp0", 0, "tcp://127.0.0.1:5600"],
      ["127.0.0.1:8000/dp1", 1, "tcp://127.0.0.1:5601"],
    ],
  );
  const body = Buffer.from(JSON.stringify({ model: "m", prompt: "hello ".repeat(200) }));
  const p1 = app.route("completions", body, null);
  const p2 = app.route("completions", Buffer.from(JSON.stringify({ model: "m", prompt: "other ".repeat(200) })), null);
  assert.notEqual(p1.target.id, p2.target.id, "load spreads over the two ranks");
  assert.equal(app.router.activeBlocks(p1.target.id) > 0 && app.router.activeBlocks(p2.target.id) > 0, true);
  p1.reservation.finish();
  p2.reservation.finish();
  // a client cannot pick the rank itself
  assert.equal(
    isRoutingHeader("X-Data-Parallel-Rank", { upstreamHeader: "x-infera-upstream", prefillHeader: "x-infera-prefill" }),
    true,
  );
  await app.close();
});

test("--kv-replay-endpoint sets replay endpoints by worker address (DP ranks offset), unknown addresses refused", () => {
  const o = parseArgs(
    [
      "--workers",
      "127.0.0.1:8000/dp=2@tcp://127.0.0.1:5557,127.0.0.1:8001@tcp://127.0.0.1:6000",
      "--kv-replay-endpoint",
      "127.0.0.1:8000=tcp://127.0.0.1:5600,127.0.0.1:8001=tcp://127.0.0.1:6001",
    ],
    {},
  );
  assert.deepEqual(
    o.workers.map((w) => w.replay),
    ["tcp://127.0.0.1:5600", "tcp://127.0.0.1:5601", "tcp://127.0.0.1:6001"],
  );
  assert.throws(
    () => parseArgs(["--workers", "127.0.0.1:1", "--kv-replay-endpoint", "127.0.0.1:2=tcp://x:1"], {}),
    /no worker 127.0.0.1:2/,
  );
});
