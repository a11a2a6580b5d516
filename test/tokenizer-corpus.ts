// Texts whose token ids must equal @huggingface/tokenizers' in every encoder we
// ship: the njs BPE (test/e2e/njs.test.ts) and, with more cases, the fast BPE
// (test/unit/fast-bpe.test.ts).
export const NJS_CORPUS: string[] = [
  "Hello wörld 你好 123 🎉",
  "<|im_start|>user\nWhat's up? I'm fine, they'll go, we'd've.<|im_end|>\n<|im_start|>assistant\n",
  "   leading spaces\n\n\ntabs\tand\r\nCRLF  trailing   ",
  "Ünïcödé façade naïve café — “quotes” 日本語のテキスト 한국어 текст по-русски ελληνικά عربى",
  "numbers 1234567 3.14159 x=y+z; fn(a,b) => {return a**b;} // code",
  '<think>\nreasoning here\n</think>\n\nanswer <tool_call>{"a":1}</tool_call>',
  "emoji 👩‍💻🚀🔥 mixed日本English123abc",
];

const CORPUS_POOL = [
  "a",
  "Z",
  "é",
  "ß",
  "日",
  "한",
  "ж",
  "😀",
  "👍🏽",
  "1",
  "٣",
  " ",
  "  ",
  "\n",
  "\r\n",
  "\t",
  "'s",
  "'LL",
  ".",
  ",",
  "!",
  "{",
  "}",
  "_",
  "-",
  "<|im_end|>",
  "<think>",
  "\u00a0",
  "\u0301",
  "$",
  "0",
];

/**
 * Seeded strings over a pool that mixes every character class the split regex
 * cares about: up to maxLen picks each, one in ten repeated up to maxRepeat times.
 */
export function randomCorpus(
  n: number,
  seed = 1234,
  pool: string[] = CORPUS_POOL,
  maxLen = 120,
  maxRepeat = 40,
): string[] {
  let s = seed >>> 0;
  const rnd = (k: number) => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return s % k;
  };
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    let t = "";
    const len = 1 + rnd(maxLen);
    for (let k = 0; k < len; k++) t += pool[rnd(pool.length)].repeat(1 + (rnd(10) === 0 ? rnd(maxRepeat) : 0));
    out.push(t);
  }
  return out;
}
