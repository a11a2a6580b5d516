// The tokenizer's piece cache: ids equal to encoding the whole prompt, and a
// conversation that grows by a turn encodes only its new pieces.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { defaultTokenizerDir, loadTokenizer, pieceCache } from "../../runtime/tokenizer";

test("piece cache: same ids as a whole-text encode on chat prompts with special tokens; growing turns hit the cache", () => {
  const dir = defaultTokenizerDir();
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const hf = new HfTokenizer(tj, JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")));
  const raw = (t: string) => hf.encode(t, { add_special_tokens: false }).ids;
  const pc = pieceCache(tj, raw)!;
  assert.ok(pc, "Qwen3's added tokens strip nothing: the cache is on");
  const tok = loadTokenizer(null)!;
  const msgs: { role: string; content: string }[] = [
    { role: "system", content: "You are terse. Ünïcödé, 日本語, emoji 🎉 and  double  spaces\n\n" },
  ];
  let prevMiss = 0;
  for (let turn = 0; turn < 6; turn++) {
    msgs.push({
      role: "user",
      content: `Question ${turn}: <tool_call>{"a":${turn}}</tool_call> what about   part ${turn * 7}?\n`,
    });
    const text = tok.renderChat({
      messages: msgs,
      tools: null,
      kwargs: {},
      addGenerationPrompt: true,
      continueFinal: false,
      documents: null,
    } as never);
    const before = pc.stats();
    assert.deepEqual(pc.encode(text), raw(text), `turn ${turn}`);
    const after = pc.stats();
    const miss = after.missTokens - before.missTokens;
    if (turn > 0)
      assert.ok(
        miss < after.hitTokens - before.hitTokens,
        `turn ${turn}: ${miss} tokens encoded afresh, ${after.hitTokens - before.hitTokens} from the cache`,
      );
    prevMiss = miss;
    msgs.push({ role: "assistant", content: `Answer ${turn} with <think>reasoning</think> and more text.` });
  }
  void prevMiss;
});

test("piece cache stays within its budget and is off when added tokens strip whitespace", () => {
  const pc = pieceCache(
    { added_tokens: [{ id: 9, content: "<s>" }] },
    (t) => Array.from(t, (c) => c.charCodeAt(0)),
    10,
  )!;
  for (let i = 0; i < 50; i++) pc.encode(`<s>piece${i}<s>`);
  assert.ok(pc.stats().chars <= 10);
  assert.deepEqual(pc.encode("ab<s>c"), [97, 98, 9, 99]);
  assert.equal(
    pieceCache({ added_tokens: [{ id: 1, content: "<mask>", lstrip: true }] }, () => []),
    null,
  );
});

// At its budget the cache evicted by walking a fresh iterator from the start
// of the Map, over every slot deleted since V8's last rehash: each insert
// slower than the last (test/unit/prefix-hashes.test.ts has the same for hashes).
test("piece cache: inserts at the budget cost what inserts below it cost", () => {
  const pc = pieceCache({ added_tokens: [{ id: 9, content: "<s>" }] }, (t) => [t.length], 1_000_000)!;
  const run = (from: number, n: number) => {
    const t = performance.now();
    for (let i = from; i < from + n; i++) pc.encode(`<s>p${String(i).padStart(10, "0")}`);
    return performance.now() - t;
  };
  const filling = run(0, 40000);
  run(40000, 80000); // past the budget (~90k pieces of 11 chars)
  const full = run(120000, 40000);
  assert.ok(pc.stats().chars <= 1_000_000);
  assert.ok(
    full < 4 * filling,
    `40k inserts at the budget took ${full.toFixed(0)} ms, below it ${filling.toFixed(0)} ms`,
  );
});
