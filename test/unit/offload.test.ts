// The tokenizer helper's answer as njs reads it (njs/offload.ts readAnswer):
// the packed form this bundle asks for, and the JSON list a helper from before
// it answers, give the same hashes; anything else is a named fallback.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { readAnswer } from "../../njs/offload";
import { blockAt } from "../../core/state/marks";
import { blockHashes } from "../../core/hash";

const ids: number[] = [];
for (let i = 0; i < 16 * 300 + 5; i++) ids.push((i * 7919) % 50000);
const hashes = blockHashes(ids, 16) as string[];

test("a packed answer and the JSON list read as the same hashes, token count and media hashes", () => {
  const json = readAnswer(JSON.stringify({ t: ids.length, b: hashes, x: false, mh: ["m1"] }));
  const packed = readAnswer(
    JSON.stringify({ t: ids.length, n: hashes.length, x: false, mh: ["m1"] }) + "\n" + hashes.join(""),
  );
  assert.ok(typeof json !== "string" && typeof packed !== "string");
  assert.equal(packed.t, json.t);
  assert.deepEqual(packed.mh, json.mh);
  assert.equal(packed.b.length, json.b.length);
  for (let i = 0; i < hashes.length; i++) assert.equal(blockAt(packed.b, i), json.b[i]);
  const none = readAnswer(JSON.stringify({ t: 3, n: 0, x: true, mh: [] }) + "\n");
  assert.ok(typeof none !== "string" && none.b.length === 0);
});

test("a packed answer of the wrong length, without n, or not JSON is refused with its reason", () => {
  const head = (o: object) => JSON.stringify({ t: 10, x: true, mh: [], ...o });
  assert.match(String(readAnswer(head({ n: 2 }) + "\n" + hashes[0])), /16 characters for 2/);
  assert.match(String(readAnswer(head({}) + "\n" + hashes[0])), /no n field/);
  assert.match(String(readAnswer(head({ n: 1.5 }) + "\n" + hashes[0])), /no n field/);
  assert.equal(readAnswer("{nope"), "not JSON");
  assert.equal(readAnswer(JSON.stringify({ t: 1 })), "no t/b fields");
  assert.equal(readAnswer(JSON.stringify({ b: [] })), "no t/b fields");
});
