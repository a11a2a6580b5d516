// The njs BPE (core/bpe.ts, run here on Node) against @huggingface/tokenizers:
// long texts, which it pre-tokenizes chunk by chunk (one regex call over a
// whole prompt is quadratic on njs), give the same ids as short ones, and the
// chunked split equals one String#match for every byte-level split pattern
// family, cut at every chance.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { defaultTokenizerDir } from "../../runtime/tokenizer";
import { compact } from "../../scripts/compact-tokenizer";
import { compilePattern, createBpe, splitCutPattern, splitPieces, SPLIT_CHUNK } from "../../core/bpe";
import { NJS_CORPUS, randomCorpus } from "../tokenizer-corpus";

const PATTERNS: { [family: string]: string } = {
  gpt2: String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
  "cl100k/llama3": String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
  qwen2: String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
  o200k: String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};

/** Seeded strings over every character class the split patterns and the cut rule care about. */
const POOL = [
  "a",
  "Z",
  "é",
  "e\u0301",
  "\u0301",
  "ß",
  "日",
  "한",
  "ж",
  "𝐀",
  "Ⅻ",
  "²",
  "٣",
  "😀",
  "👍🏽",
  "1",
  "23",
  " ",
  "  ",
  "\n",
  "\r\n",
  "\t",
  "\u00a0",
  "\u3000",
  "\u200b",
  "'",
  "'s",
  "'LL",
  "’",
  ".",
  ",",
  "!",
  "/",
  "_",
  "-",
  "{",
  "$",
  "，",
  "。",
  "don't",
];
const randomTexts = (n: number, seed: number) => randomCorpus(n, seed, POOL, 150, 30);

test("the chunked pre-tokenizer split equals one String#match for every split pattern family, cut at every chance", () => {
  const cut = splitCutPattern();
  const texts = randomTexts(1500, 99);
  for (const family in PATTERNS) {
    const re = compilePattern(PATTERNS[family]);
    for (const text of texts)
      for (const chunk of [1, 3, 16])
        assert.deepEqual(
          splitPieces(text, re, cut, chunk),
          text.match(re) || [],
          `${family}, chunk ${chunk}: ${JSON.stringify(text)}`,
        );
  }
});

test("njs BPE ids equal @huggingface/tokenizers on texts long enough to be split in chunks, and on words named like Object.prototype members", () => {
  const dir = defaultTokenizerDir();
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const hf = new HfTokenizer(tj, JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")));
  const bpe = createBpe(compact(path.join(dir, "tokenizer.json")));
  // A piece that is exactly a prototype member's name (at the start of a line) once read Object.prototype's.
  const proto =
    "constructor\ntoString\nvalueOf hasOwnProperty\n__proto__\nisPrototypeOf\n__defineGetter__ propertyIsEnumerable";
  const random = randomTexts(600, 7);
  const long = [
    NJS_CORPUS.concat(NJS_CORPUS, NJS_CORPUS, NJS_CORPUS).join("\n"),
    random.join(""),
    random.join("\n\n"),
    proto + "\n" + random.slice(0, 100).join(" "),
  ];
  for (const text of [proto, ...NJS_CORPUS, ...random.slice(0, 200), ...long]) {
    const want = hf.encode(text, { add_special_tokens: false }).ids;
    assert.deepEqual(bpe.encode(text), want, JSON.stringify(text.slice(0, 80)));
  }
  assert.ok(
    long.every((t) => t.length > 2 * SPLIT_CHUNK),
    "the long texts go through the chunked split",
  );
});
