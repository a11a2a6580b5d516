import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { checkNjsSyntax } from "../../njs/build";

test("the njs syntax check refuses what njs cannot run", () => {
  const bad = [
    "class A {}",
    "var m = new Map();",
    "var s = new Set([1]);",
    "var x = a?.b;",
    "f(...args);",
    "for (const x of xs) {}",
    "var big = 10n;",
    "const { a, b } = o;",
    "let [x, y] = p;",
    "function* gen() {}",
    "var r = /\\p{L}/u.test(s);",
  ];
  for (const b of bad) assert.throws(() => checkNjsSyntax(b, "t.js"), /njs cannot run/, b);
});

test("the check ignores strings and comments, and passes ES5 code", () => {
  assert.doesNotThrow(() =>
    checkNjsSyntax(
      'var s = "class A {} new Map() a?.b ...x"; // for (const x of y)\n/* class B {} */ var f = function (a) { return a + 1; };',
      "t.js",
    ),
  );
});

test(
  "the built bundle passes the check (when built)",
  { skip: !fs.existsSync(path.join(__dirname, "../../njs/dist/infera.js")) && "run npm run build:njs" },
  () => {
    const code = fs.readFileSync(path.join(__dirname, "../../njs/dist/infera.js"), "utf8");
    assert.doesNotThrow(() => checkNjsSyntax(code, "infera.js"));
    assert.ok(code.trimEnd().endsWith("export default __infera.default;"));
  },
);
