// Byte-level BPE (GPT-2 / Qwen style) in plain ES5-compatible TypeScript, so
// njs tokenizes exactly like @huggingface/tokenizers on the same tokenizer.json.
// The vocabulary comes in a compact form (see scripts/compact-tokenizer.ts):
//   { vocab: {token: id}, merges: {"a b": rank}, added: [[content, id]], pattern }

import { utf8 } from "./util";
import { ChatInput, chatRenderer, ContentFormat } from "./chat";
import { renderChatML, Tokenizer } from "./request";

export interface CompactTokenizer {
  vocab: { [tok: string]: number };
  merges: { [pair: string]: number };
  added: [string, number][];
  pattern: string;
  /** The model's chat template, parsed at build time (runtime/jinja.ts templateAst). */
  chat?: { ast: any; special: { [k: string]: string }; format: ContentFormat; readsContent: boolean };
  /** Ids add_special_tokens=true puts around a prompt (e.g. Llama's BOS). */
  specialPrefix?: number[];
  specialSuffix?: number[];
}

/** The router Tokenizer over a compact vocabulary: what njs uses. */
export function compactTokenizer(t: CompactTokenizer): Tokenizer {
  const bpe = createBpe(t);
  const chat = t.chat;
  const render = chat ? chatRenderer(chat.ast, chat.special, chat.format, chat.readsContent) : renderChatML;
  return {
    encode: bpe.encode,
    encodeSpecial: function (text: string): number[] {
      const out: number[] = [];
      const pre = t.specialPrefix || [];
      const suf = t.specialSuffix || [];
      for (let i = 0; i < pre.length; i++) out.push(pre[i]);
      const ids = bpe.encode(text);
      for (let i = 0; i < ids.length; i++) out.push(ids[i]);
      for (let i = 0; i < suf.length; i++) out.push(suf[i]);
      return out;
    },
    renderChat: function (c: ChatInput): string {
      return render(c);
    },
  };
}

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to U+0100+.
export function byteTable(): string[] {
  const t: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    t.push(String.fromCharCode(printable ? b : 256 + n++));
  }
  return t;
}

/**
 * JS has neither (?i:...) groups nor \p{..} without the u flag; njs (PCRE) has
 * \p{..} but no u flag. Rewrite the inline-case group and pick flags by engine.
 */
export function compilePattern(src: string): RegExp {
  const s = src.replace(/\(\?i:([^)]*)\)/g, function (_m: string, body: string) {
    return "(?:" + body.replace(/[a-z]/g, function (c: string) {
      return "[" + c + c.toUpperCase() + "]";
    }) + ")";
  });
  let flags = "g";
  try {
    new RegExp("\\p{L}", "u");
    flags = "gu";
  } catch (e) {
    flags = "g";
  }
  return new RegExp(s, flags);
}

export interface Bpe {
  encode(text: string): number[];
}

export function createBpe(t: CompactTokenizer): Bpe {
  const bytes = byteTable();
  const re = compilePattern(t.pattern);
  // Longest added tokens first so "<|im_start|>" wins over any prefix of it.
  // Copied by index: njs preloaded objects are read-only and lack some Array methods.
  const added: [string, number][] = [];
  for (let i = 0; i < t.added.length; i++) added.push([t.added[i][0], t.added[i][1]]);
  added.sort(function (a, b) {
    return b[0].length - a[0].length;
  });
  const cache: { [w: string]: number[] } = {};
  let cached = 0;

  function bpeWord(word: string): number[] {
    const hit = cache[word];
    if (hit) return hit;
    const direct = t.vocab[word];
    let parts: string[];
    if (direct !== undefined && word.length === 1) parts = [word];
    else {
      parts = [];
      for (let i = 0; i < word.length; i++) parts.push(word.charAt(i));
      while (parts.length > 1) {
        let best = -1;
        let bestRank = Infinity;
        for (let i = 0; i < parts.length - 1; i++) {
          const r = t.merges[parts[i] + " " + parts[i + 1]];
          if (r !== undefined && r < bestRank) {
            bestRank = r;
            best = i;
          }
        }
        if (best < 0) break;
        // Merge every occurrence of the best pair, left to right (HF semantics).
        const a = parts[best];
        const b = parts[best + 1];
        const next: string[] = [];
        for (let i = 0; i < parts.length; i++) {
          if (i < parts.length - 1 && parts[i] === a && parts[i + 1] === b) {
            next.push(a + b);
            i++;
          } else next.push(parts[i]);
        }
        parts = next;
      }
    }
    const ids: number[] = [];
    for (let i = 0; i < parts.length; i++) {
      const id = t.vocab[parts[i]];
      if (id !== undefined) ids.push(id);
    }
    if (cached < 50000) {
      cache[word] = ids;
      cached++;
    }
    return ids;
  }

  function encodePlain(s: string, out: number[]): void {
    if (!s) return;
    const norm = typeof s.normalize === "function" ? s.normalize("NFC") : s;
    // String#match, not an exec loop: njs's exec fails ("bad offset value")
    // once lastIndex reaches the end of a string holding astral characters.
    const pieces = norm.match(re);
    if (!pieces) return;
    for (let p = 0; p < pieces.length; p++) {
      const b = utf8(pieces[p]);
      let w = "";
      for (let i = 0; i < b.length; i++) w += bytes[b[i]];
      const ids = bpeWord(w);
      for (let i = 0; i < ids.length; i++) out.push(ids[i]);
    }
  }

  return {
    encode(text: string): number[] {
      const out: number[] = [];
      let start = 0;
      let i = 0;
      while (i < text.length) {
        let matched = -1;
        if (text.charAt(i) === "<") {
          for (let k = 0; k < added.length; k++) {
            const a = added[k][0];
            if (text.substr(i, a.length) === a) {
              matched = k;
              break;
            }
          }
        }
        if (matched >= 0) {
          encodePlain(text.substring(start, i), out);
          out.push(added[matched][1]);
          i += added[matched][0].length;
          start = i;
        } else i++;
      }
      encodePlain(text.substring(start), out);
      return out;
    },
  };
}
