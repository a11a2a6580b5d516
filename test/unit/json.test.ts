// core/json.ts: the depth-tolerant fallback parses what JSON.parse parses,
// refuses what it refuses, and reads nesting past njs's 32-level limit.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { execFileSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { parseDeep, parseJson } from "../../core/json";
import { njsClis } from "../harness";

const deep = (n: number) => "[".repeat(n) + "1" + "]".repeat(n);
const deepObj = (n: number) => '{"a":'.repeat(n) + '"x"' + "}".repeat(n);

const VALID = [
  "0",
  "-0",
  "1.5e-3",
  "-12E+2",
  '"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00 \u00e9"',
  "true",
  "false",
  "null",
  " [ ] ",
  "{}",
  '{"a":[1,{"b":null}],"c":"d","a2":{}}',
  '{"dup":1,"dup":2}',
  '{"__proto__":{"x":1},"y":2}',
  '[1,"2",[3,[4,{"5":[]}]]]',
  '\t\r\n{ "k" : [ true , false ] }\n',
  deep(40),
  deepObj(40),
  deep(300),
];
const INVALID = [
  "",
  " ",
  "[",
  "]",
  "{",
  "[1,]",
  '{"a":1,}',
  "{a:1}",
  "01",
  "1.",
  ".5",
  "+1",
  "1e",
  "-",
  "tru",
  "nul",
  "[1 2]",
  '{"a" 1}',
  '{"a":1 "b":2}',
  '"\\x"',
  '"\\u12g4"',
  '"a\nb"',
  '"open',
  "[1]]",
  "{}{}",
  "[1]x",
  "NaN",
  "'a'",
  deep(40).slice(0, -1),
];

test("parseDeep agrees with JSON.parse on valid and invalid text", () => {
  for (const t of VALID) {
    const d = parseDeep(t);
    assert.ok(d.ok, `valid: ${t.slice(0, 60)}`);
    assert.deepEqual(d.value, JSON.parse(t), t.slice(0, 60));
    assert.equal(JSON.stringify(d.value), JSON.stringify(JSON.parse(t)), "same key order");
  }
  for (const t of INVALID) {
    assert.throws(() => JSON.parse(t));
    assert.equal(parseDeep(t).ok, false, `invalid: ${JSON.stringify(t.slice(0, 60))}`);
    assert.throws(() => parseJson(t), SyntaxError);
  }
  // __proto__ is an own member, not the prototype
  const p = parseDeep('{"__proto__":{"x":1}}').value;
  assert.equal(Object.getPrototypeOf(p), Object.prototype);
  assert.deepEqual(Object.keys(p), ["__proto__"]);
});

test("njs: JSON.parse refuses 32+ levels; parseJson reads a 40-deep tool schema like Node", () => {
  const clis = njsClis();
  if (!clis.length) return;
  const body = JSON.stringify({
    model: "m",
    messages: [{ role: "user", content: "hi" }],
    tools: [{ type: "function", function: { name: "f", parameters: JSON.parse(deepObj(40)) } }],
  });
  const bundle = path.join(os.tmpdir(), `infera-json-${process.pid}.js`);
  // The module as njs runs it: esbuild lowers core/json.ts to one script.
  execFileSync(process.execPath, [
    "-e",
    `require("esbuild").buildSync({entryPoints:["core/json.ts"],bundle:true,format:"iife",globalName:"J",target:"es5",outfile:${JSON.stringify(bundle)},supported:{"const-and-let":true,"arrow":true,"template-literal":true}})`,
  ]);
  const script =
    fs.readFileSync(bundle, "utf8") +
    `\nvar b = ${JSON.stringify(body)};\nvar native = "ok"; try { JSON.parse(b); } catch (e) { native = "refused"; }\n` +
    `var v = J.parseJson(b); var d = 0; var o = v.tools[0].function.parameters; while (o && o.a !== undefined) { o = o.a; d++; }\n` +
    `console.log(native + " " + d + " " + o);\n`;
  const file = bundle.replace(/\.js$/, "-run.js");
  fs.writeFileSync(file, script);
  try {
    for (const [label, bin] of clis) assert.equal(execFileSync(bin, [file]).toString().trim(), "refused 40 x", label);
  } finally {
    fs.rmSync(bundle, { force: true });
    fs.rmSync(file, { force: true });
  }
});
