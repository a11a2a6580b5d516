// Texts whose token ids must equal @huggingface/tokenizers' in every encoder we
// ship: the njs BPE (test/e2e/njs.test.ts) and, with more cases, the fast BPE
// (test/unit/fast-bpe.test.ts).
export const NJS_CORPUS: string[] = [
  "Hello wörld 你好 123 🎉",
  "<|im_start|>user\nWhat's up? I'm fine, they'll go, we'd've.<|im_end|>\n<|im_start|>assistant\n",
  "   leading spaces\n\n\ntabs\tand\r\nCRLF  trailing   ",
  "Ünïcödé façade naïve café — “quotes” 日本語のテキスト 한국어 текст по-русски ελληνικά عربى",
  "numbers 1234567 3.14159 x=y+z; fn(a,b) => {return a**b;} // code",
  "<think>\nreasoning here\n</think>\n\nanswer <tool_call>{\"a\":1}</tool_call>",
  "emoji 👩‍💻🚀🔥 mixed日本English123abc",
];
