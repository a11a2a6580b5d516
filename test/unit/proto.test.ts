// extproc/gen is generated from proto/ (Envoy's ext_proc API, same field
// numbers); regenerate into a temp dir and require byte-identical output.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

const ROOT = path.resolve(__dirname, "../..");
const buf = path.join(ROOT, "node_modules", ".bin", "buf");

function files(dir: string): string[] {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => (e.isDirectory() ? files(path.join(dir, e.name)).map((f) => path.join(e.name, f)) : [e.name]));
}

test("generated ext_proc code matches proto/", { skip: fs.existsSync(buf) ? false : "buf not installed" }, () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "infera-gen-"));
  const tpl = path.join(out, "buf.gen.yaml");
  fs.writeFileSync(
    tpl,
    fs
      .readFileSync(path.join(ROOT, "buf.gen.yaml"), "utf8")
      .replace("out: extproc/gen", `out: ${path.join(out, "gen")}`),
  );
  const r = spawnSync(buf, ["generate", "--template", tpl], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, PATH: `${path.join(ROOT, "node_modules", ".bin")}:${process.env.PATH}` },
  });
  assert.equal(r.status, 0, r.stderr);
  const want = files(path.join(ROOT, "extproc", "gen")).sort();
  assert.deepEqual(files(path.join(out, "gen")).sort(), want);
  for (const f of want)
    assert.equal(
      fs.readFileSync(path.join(out, "gen", f), "utf8"),
      fs.readFileSync(path.join(ROOT, "extproc", "gen", f), "utf8"),
      f,
    );
});

test("field numbers are Envoy's for the messages the server relies on", () => {
  const p = fs.readFileSync(path.join(ROOT, "proto/envoy/service/ext_proc/v3/external_processor.proto"), "utf8");
  for (const line of [
    "HttpHeaders request_headers = 2;",
    "HttpHeaders response_headers = 3;",
    "HttpBody request_body = 4;",
    "HttpBody response_body = 5;",
    "ImmediateResponse immediate_response = 7;",
    "HeaderMutation header_mutation = 2;",
    "bool clear_route_cache = 5;",
    "repeated config.core.v3.HeaderValueOption set_headers = 1;",
    "bool end_of_stream = 3;",
    // Endpoint Picker Protocol: subset hint / served endpoint in, pick out, body modes named
    "config.core.v3.Metadata metadata_context = 8;",
    "google.protobuf.Struct dynamic_metadata = 8;",
    "ProtocolConfiguration protocol_config = 11;",
    "StreamedBodyResponse streamed_response = 3;",
  ])
    assert.ok(p.includes(line), line);
});
