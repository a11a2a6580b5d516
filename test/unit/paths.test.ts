// The path allowlist both gateways apply before a request can reach a worker (core/paths.ts).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { checkPath, pathRules, parseExtraPaths } from "../../core/paths";
import { parseCommand } from "../../runtime/args";
import { nginxFlag } from "../../core/flags";

const rules = pathRules("");

test("the inference endpoints pass with their routing, by method", () => {
  assert.deepEqual(checkPath(rules, "POST", "/v1/chat/completions"), { endpoint: "chat", error: null });
  assert.deepEqual(checkPath(rules, "POST", "/v1/completions?stream=1"), { endpoint: "completions", error: null });
  assert.deepEqual(checkPath(rules, "post", "/v1/messages/"), { endpoint: "messages", error: null });
  assert.deepEqual(checkPath(rules, "POST", "/v1/embeddings"), { endpoint: null, error: null });
  assert.deepEqual(checkPath(rules, "GET", "/v1/models"), { endpoint: null, error: null });
});

test("everything else is a 404, a known path with another method a 405", () => {
  for (const p of [
    "/sim/clear",
    "/reset_prefix_cache",
    "/sleep",
    "/v1/load_lora_adapter",
    "/metrics",
    "/",
    "",
    "/v1/chat/completions/../../sim/clear",
    "/v1/chat/completions%2F",
    "//v1/chat/completions",
    "/x/v1/chat/completions",
    "/v1/chat/completionsX",
    "/v1/models/m",
    "/V1/CHAT/COMPLETIONS",
  ]) {
    const v = checkPath(rules, "POST", p);
    assert.equal(v.error?.status, 404, p);
    assert.equal(v.endpoint, null);
  }
  const get = checkPath(rules, "GET", "/v1/chat/completions");
  assert.equal(get.error?.status, 405);
  assert.match(get.error!.message, /method GET is not allowed on \/v1\/chat\/completions/);
  assert.equal(checkPath(rules, "POST", "/v1/models").error?.status, 405);
});

test("the client's path is quoted short in the message", () => {
  const v = checkPath(rules, "POST", "/" + "a".repeat(5000));
  assert.ok(v.error && v.error.message.length < 300, v.error?.message);
});

test("--extra-paths adds load-routed paths and prefixes; built-ins keep their cache routing", () => {
  const r = pathRules("POST /v1/score, /v1/rerank ,GET /v1/models/*, POST /v1/chat/completions");
  assert.deepEqual(checkPath(r, "POST", "/v1/score"), { endpoint: null, error: null });
  assert.deepEqual(checkPath(r, "DELETE", "/v1/rerank"), { endpoint: null, error: null }, "no method: any method");
  assert.deepEqual(checkPath(r, "GET", "/v1/models/org/m"), { endpoint: null, error: null });
  assert.equal(checkPath(r, "POST", "/v1/models/x").error?.status, 405);
  assert.equal(checkPath(r, "GET", "/v1/score").error?.status, 405);
  assert.deepEqual(checkPath(r, "POST", "/v1/chat/completions"), { endpoint: "chat", error: null });
  assert.equal(checkPath(r, "POST", "/sim/clear").error?.status, 404);
});

test("bad --extra-paths entries are refused at start, naming the flag; nginx reads the same variable", () => {
  for (const bad of ["FETCH /x", "v1/score", "POST /a*b", "POST /x?y=1", "GET /a b"]) {
    assert.throws(() => parseExtraPaths(bad), /expected|unknown method/, bad);
    assert.throws(() => parseCommand("router", ["--extra-paths", bad], {}), /--extra-paths/, bad);
  }
  assert.equal(parseCommand("router", ["--extra-paths", "POST /v1/score"], {}).values["extra-paths"], "POST /v1/score");
  assert.equal(
    nginxFlag("extra-paths", (n) => (n === "infera_extra_paths" ? "GET /v1/models/*" : undefined)),
    "GET /v1/models/*",
  );
});
