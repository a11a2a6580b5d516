// Writes the compact tokenizer njs preloads (js_preload_object) from a
// tokenizer.json: vocab, merge ranks, added tokens and the split pattern.
import * as fs from "fs";
import * as path from "path";
import { defaultTokenizerDir } from "../runtime/tokenizer";
import { CompactTokenizer } from "../core/bpe";

export function compact(tokenizerJson: string): CompactTokenizer {
  const t = JSON.parse(fs.readFileSync(tokenizerJson, "utf8"));
  if (t.model?.type !== "BPE")
    throw new Error(`${tokenizerJson}: only BPE models are supported in njs (got ${t.model?.type})`);
  const merges: Record<string, number> = {};
  (t.model.merges as (string | [string, string])[]).forEach((m, i) => {
    merges[Array.isArray(m) ? m.join(" ") : m] = i;
  });
  const findSplit = (p: { type: string; pattern?: { Regex?: string }; pretokenizers?: unknown[] }): string | null => {
    if (p.type === "Split" && p.pattern?.Regex) return p.pattern.Regex;
    for (const c of (p.pretokenizers ?? []) as (typeof p)[]) {
      const r = findSplit(c);
      if (r) return r;
    }
    return null;
  };
  const pattern = findSplit(t.pre_tokenizer);
  if (!pattern) throw new Error(`${tokenizerJson}: no Split pre-tokenizer regex found`);
  return {
    vocab: t.model.vocab,
    merges,
    added: t.added_tokens.map((a: { content: string; id: number }) => [a.content, a.id]),
    pattern,
  };
}

if (require.main === module) {
  const src = process.argv[2] || path.join(defaultTokenizerDir(), "tokenizer.json");
  const out = process.argv[3] || path.join(__dirname, "..", "njs", "dist", "tokenizer.json");
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, JSON.stringify(compact(src)));
  process.stderr.write(`wrote ${out}\n`);
}
