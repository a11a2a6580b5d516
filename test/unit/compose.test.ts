// docker-compose.yml cannot run here (no Docker engine); check it as far as
// this machine allows: the compose schema, and that every command, mount and
// in-place edit it relies on matches the repository.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as path from "path";
import { parse } from "yaml";
import { parseArgs } from "../../runtime/config";
import { parseCommand } from "../../runtime/args";
import { parseSimArgs } from "../../sim/engine";
import { needs } from "../tools";

const ROOT = path.resolve(__dirname, "../..");
const compose = parse(fs.readFileSync(path.join(ROOT, "docker-compose.yml"), "utf8"), { merge: true });
const dc = spawnSync(
  "sh",
  ["-c", "command -v docker-compose || (docker compose version >/dev/null 2>&1 && echo docker)"],
  { encoding: "utf8" },
).stdout.trim();

test(
  "compose file passes docker-compose's own schema check",
  { skip: needs(!dc && "docker-compose not installed") },
  () => {
    const r =
      dc === "docker"
        ? spawnSync("docker", ["compose", "-f", "docker-compose.yml", "config", "-q"], {
            cwd: ROOT,
            encoding: "utf8",
            env: { ...process.env, INFERA_PUSH_TOKEN: "schema-check" },
          })
        : spawnSync(dc, ["-f", "docker-compose.yml", "config", "-q"], {
            cwd: ROOT,
            encoding: "utf8",
            env: { ...process.env, INFERA_PUSH_TOKEN: "schema-check" },
          });
    assert.equal(r.status, 0, r.stderr);
  },
);

test("services reference existing services, files and valid flags", () => {
  type Svc = {
    command?: string | string[];
    depends_on?: Record<string, { condition: string }>;
    volumes?: string[];
    network_mode?: string;
    build?: string;
    restart?: string;
    ports?: string[];
    environment?: Record<string, string>;
  };
  const services = compose.services as Record<string, Svc>;
  for (const want of ["envoy", "nginx", "router", "etcd", "nats", "sim0", "sim1", "bridge"])
    assert.ok(services[want], `service ${want}`);
  for (const [name, s] of Object.entries(services)) {
    assert.ok(!Array.isArray(s.depends_on), `${name}: depends_on uses the long form with conditions`);
    for (const [d, c] of Object.entries(s.depends_on ?? {})) {
      assert.ok(services[d], `${name} depends on unknown ${d}`);
      assert.match(c.condition, /^service_(started|healthy|completed_successfully)$/);
    }
    if (s.network_mode?.startsWith("service:")) assert.ok(services[s.network_mode.slice(8)], `${name} network_mode`);
    for (const v of s.volumes ?? [])
      if (v.startsWith("./")) assert.ok(fs.existsSync(path.join(ROOT, v.split(":")[0])), `${name} mounts ${v}`);
    assert.ok(s.restart, `${name} has a restart policy`);
    if (!s.build || name === "njs-build") continue;
    // The image's entrypoint is infera-gate <command>; check each command's flags with its own parser.
    const cmd = s.command as string[];
    assert.ok(Array.isArray(cmd), `${name}: command is a list`);
    const env: Record<string, string> = { INFERA_PUSH_TOKEN: "x" };
    for (const [k, v] of Object.entries(s.environment ?? {})) if (k !== "INFERA_PUSH_TOKEN") env[k] = v;
    if (cmd[0] === "sim") assert.doesNotThrow(() => parseSimArgs(cmd.slice(1), env), name);
    else if (cmd[0] === "router" || cmd[0] === "bridge")
      assert.doesNotThrow(() => parseArgs(cmd.slice(1), env, cmd[0] as "router" | "bridge"), name);
    else assert.doesNotThrow(() => parseCommand(cmd[0] as "relay", cmd.slice(1), env), name);
  }
  assert.deepEqual(services["nginx"].depends_on, { "njs-build": { condition: "service_completed_successfully" } });
  assert.equal(
    services["envoy"].depends_on?.router.condition,
    "service_healthy",
    "Envoy waits for a router that answers",
  );
});

test("compose is v2, binds admin ports to loopback, and bakes in no secret", () => {
  const raw = fs.readFileSync(path.join(ROOT, "docker-compose.yml"), "utf8");
  assert.equal(compose.version, undefined, "no obsolete top-level version key");
  for (const [name, s] of Object.entries(compose.services as Record<string, { ports?: string[] }>))
    for (const p of s.ports ?? [])
      if (/:(9100|9101|9002|9901)$/.test(p))
        assert.match(p, /^127\.0\.0\.1:/, `${name} publishes ${p} beyond loopback`);
  assert.doesNotMatch(raw, /change-me|compose-token|--push-token/, "the push token comes from the environment");
  assert.match(raw, /INFERA_PUSH_TOKEN: \$\{INFERA_PUSH_TOKEN:\?/);
});

test("the Dockerfile is multi-stage, non-root, health-checked, and runs compiled JavaScript", () => {
  const df = fs.readFileSync(path.join(ROOT, "Dockerfile"), "utf8");
  const stages = df.split(/^FROM /m).slice(1);
  assert.ok(stages.length >= 2, "multi-stage");
  const last = stages[stages.length - 1];
  assert.match(last, /npm ci --omit=dev/);
  assert.doesNotMatch(last, /^COPY \. /m, "the runtime stage copies no sources or tests");
  assert.doesNotMatch(last, /tsx/);
  assert.match(last, /^USER (?!root)\w+/m);
  assert.match(last, /^HEALTHCHECK .*\n?.*\/livez/m);
  assert.match(last, /^ENTRYPOINT \["node", "dist\/cli\/main.js"\]/m);
  assert.match(last, /^CMD \["router"\]/m);
  assert.doesNotMatch(df, /--help/);
});

test("the in-place edits compose makes to envoy.yaml and nginx.conf still match those files", () => {
  const envoy = fs.readFileSync(path.join(ROOT, "envoy/envoy.yaml"), "utf8");
  const nginx = fs.readFileSync(path.join(ROOT, "nginx/nginx.conf"), "utf8");
  assert.ok(envoy.includes("address: 127.0.0.1, port_value: 10000"));
  assert.ok(envoy.includes("address: 127.0.0.1, port_value: 9002"), "ext_proc reached over the shared namespace");
  assert.ok(nginx.includes("listen 127.0.0.1:8080"));
  assert.ok(!nginx.includes("change-me"), "no push token literal");
  assert.match(nginx, /^env INFERA_PUSH_TOKEN;/m, "njs reads the token from nginx's environment");
  assert.ok(nginx.includes("/usr/lib/nginx/modules/ngx_http_js_module.so"));
  assert.ok(nginx.includes("/opt/infera-gate/njs/dist"), "the njs-dist volume mount point");
});

test("the Istio EnvoyFilter example carries the same ext_proc settings as envoy/envoy.yaml", () => {
  const ef = parse(fs.readFileSync(path.join(ROOT, "deploy/examples/istio/envoyfilter.yaml"), "utf8"));
  const envoy = parse(fs.readFileSync(path.join(ROOT, "envoy/envoy.yaml"), "utf8"));
  const hcm = envoy.static_resources.listeners[0].filter_chains[0].filters[0].typed_config;
  const ours = hcm.http_filters.find((f: { name: string }) => f.name === "envoy.filters.http.ext_proc").typed_config;
  type Patch = {
    applyTo: string;
    patch: { value: { name?: string; typed_config?: any; original_dst_lb_config?: unknown; match?: unknown } };
  };
  const patches: Patch[] = ef.spec.configPatches;
  const filter = (name: string) =>
    patches.find((p) => p.applyTo === "HTTP_FILTER" && p.patch.value.name === name)!.patch.value.typed_config;
  const theirs = filter("envoy.filters.http.ext_proc");
  assert.deepEqual(theirs.processing_mode, ours.processing_mode);
  assert.equal(theirs.failure_mode_allow, ours.failure_mode_allow);
  assert.deepEqual(theirs.metadata_options, ours.metadata_options);
  assert.equal(theirs.route_cache_action, ours.route_cache_action);
  const strip = (f: { name: string }) => f.name === "envoy.filters.http.header_mutation";
  assert.deepEqual(filter("envoy.filters.http.header_mutation"), hcm.http_filters.find(strip).typed_config);
  assert.ok(
    patches.findIndex((p) => p.patch.value.name === "envoy.filters.http.header_mutation") <
      patches.findIndex((p) => p.patch.value.name === "envoy.filters.http.ext_proc"),
    "headers stripped before ext_proc sees them",
  );
  const cluster = envoy.static_resources.clusters.find((c: { name: string }) => c.name === "workers");
  assert.deepEqual(
    patches.find((p) => p.applyTo === "CLUSTER")!.patch.value.original_dst_lb_config,
    cluster.original_dst_lb_config,
  );
  // The picked routes, streamed first, with the same matches and idle bounds.
  const picked = (routes: { match: { dynamic_metadata?: unknown }; route?: { idle_timeout?: string } }[]) =>
    routes.filter((r) => r.match.dynamic_metadata).map((r) => [r.match.dynamic_metadata, r.route?.idle_timeout]);
  const inserted = patches
    .filter((p) => p.applyTo === "HTTP_ROUTE" && (p.patch as { operation?: string }).operation === "INSERT_BEFORE")
    .map((p) => p.patch.value as never);
  assert.deepEqual(picked(inserted), picked(hcm.route_config.virtual_hosts[0].routes));
  const hcmPatch = patches.find((p) => p.applyTo === "NETWORK_FILTER")!.patch.value.typed_config;
  assert.equal(hcmPatch.request_headers_timeout, hcm.request_headers_timeout);
  assert.deepEqual(hcmPatch.common_http_protocol_options, hcm.common_http_protocol_options);
});
