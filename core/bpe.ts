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
    return (
      "(?:" +
      body.replace(/[a-z]/g, function (c: string) {
        return "[" + c + c.toUpperCase() + "]";
      }) +
      ")"
    );
  });
  return new RegExp(s, "g" + unicodeFlag());
}

/**
 * The flags compilePattern picks: "u" where the engine wants it for \p{..}, none
 * on njs. Probed once per VM (on njs the probe is a thrown SyntaxError).
 */
let uflag: string | null = null;
function unicodeFlag(): string {
  if (uflag !== null) return uflag;
  try {
    new RegExp("\\p{L}", "u");
    uflag = "u";
  } catch (e) {
    uflag = "";
  }
  return uflag;
}

// Characters per regex call when pre-tokenizing a long text. Every regex call
// on njs (0.7 and 0.8 alike) costs time in proportion to the whole subject
// string, for each match it returns, so one String#match over a prompt of n
// characters with ~n/4 pieces is quadratic. Splitting the text into chunks of
// about this size bounds each call's subject and keeps the whole pass linear.
export const SPLIT_CHUNK = 512;

/**
 * Where a long text may be cut between two regex calls without changing the
 * pieces: after a letter or digit that is followed by anything but a letter,
 * digit, combining mark or apostrophe, or after a symbol followed by a plain
 * space. In every byte-level BPE split pattern (GPT-2, cl100k, o200k, Qwen2,
 * Llama 3), a letter or digit run stops there and no alternative consumes it
 * together with what follows (o200k counts marks into words and lets an
 * apostrophe start a contraction suffix, hence both excluded), and a symbol run
 * stops at a space. A pattern that does not honour this is caught
 * by the probe in createBpe and then split in one call.
 */
export function splitCutPattern(): RegExp {
  // the match is the character before the cut (two UTF-16 units when astral)
  return new RegExp("[\\p{L}\\p{N}](?=[^\\p{L}\\p{N}\\p{M}'])|[^\\s\\p{L}\\p{N}](?= )", unicodeFlag());
}

/**
 * The pieces `re` (global) finds in s, as s.match(re) returns them, computed
 * chunk by chunk: each chunk ends at a cut (splitCutPattern) found at or after
 * `chunk` characters, so every regex call sees a bounded subject. The search for
 * a cut widens geometrically, so a text without one costs linear time to scan
 * and is then split in one call.
 */
export function splitPieces(s: string, re: RegExp, cut: RegExp, chunk: number): string[] {
  const out: string[] = [];
  let start = 0;
  while (start < s.length) {
    let end = s.length;
    if (s.length - start > 2 * chunk) {
      let from = start + chunk;
      let span = 64;
      while (from < s.length - 1) {
        // windows overlap by one character, so a pair across their border is seen
        let to = Math.min(s.length, from + span + 1);
        // UTF-16 engines: never end a window between the halves of a surrogate
        // pair, where the lone high half would read as a cut after a letter.
        const c = s.charCodeAt(to - 1);
        if (to < s.length && c >= 0xd800 && c <= 0xdbff) to++;
        const m = cut.exec(s.substring(from, to));
        if (m) {
          end = from + m.index + m[0].length;
          break;
        }
        from += span;
        span *= 2;
      }
    }
    const m = s.substring(start, end).match(re);
    if (m) for (let i = 0; i < m.length; i++) out.push(m[i]);
    start = end;
  }
  return out;
}

/** Texts whose chunked split must equal the one-call split, with cuts forced into every context. */
const SPLIT_PROBE =
  "it's I'M we'Ve x'y don't 12345 678 9\n\n  \nnext   word\t\tTab !!! ... ?? (a) [b] {c} a.b,c;d:e " +
  "http://a.b/c?d=1&e=2 naïve café Ünïcödé 中文，测试。日本語のテキスト 😀 😀😀 x😀y " +
  "e\u0301 x\u0301! cafe\u0301s Ame\u0301lie\u0301. ab\r\ncd  \r\n\r\n ef-gh_ij 3.14 1,000,000 $5 #tag @user <tag> </tag> a  b   c    \n\t \n";

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
  // Ids per pre-tokenized piece, keyed by the piece as it stands in the text,
  // so a repeated piece skips its UTF-8 bytes and merges. No prototype: a piece
  // such as "constructor" or "toString" must not find Object.prototype's member.
  const cache: { [piece: string]: number[] } = Object.create(null);
  let cached = 0;
  // Compiled by the first text long enough to be cut (a short prompt's request never needs it).
  let cut: RegExp | null = null;
  // -1 not yet probed, 0 the pattern needs one call, 1 chunking keeps the pieces.
  let chunkable = -1;

  function pieces(s: string): string[] | null {
    if (s.length <= 2 * SPLIT_CHUNK) return s.match(re);
    if (cut === null) cut = splitCutPattern();
    if (chunkable < 0) {
      // Cut the probe at every chance (chunk 1): it must split exactly as one call does.
      const whole = SPLIT_PROBE.match(re) || [];
      const parts = splitPieces(SPLIT_PROBE, re, cut, 1);
      chunkable = whole.length === parts.length ? 1 : 0;
      for (let i = 0; i < whole.length && chunkable; i++) if (whole[i] !== parts[i]) chunkable = 0;
    }
    return chunkable ? splitPieces(s, re, cut, SPLIT_CHUNK) : s.match(re);
  }

  function bpeWord(word: string): number[] {
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
      // own ids only: the vocabulary is a plain object from JSON.parse
      const id = t.vocab[parts[i]];
      if (typeof id === "number") ids.push(id);
    }
    return ids;
  }

  function encodePlain(s: string, out: number[]): void {
    if (!s) return;
    const norm = typeof s.normalize === "function" ? s.normalize("NFC") : s;
    // String#match, not an exec loop: njs's exec fails ("bad offset value")
    // once lastIndex reaches the end of a string holding astral characters.
    const ps = pieces(norm);
    if (!ps) return;
    for (let p = 0; p < ps.length; p++) {
      let ids = cache[ps[p]];
      if (ids === undefined) {
        const b = utf8(ps[p]);
        let w = "";
        for (let i = 0; i < b.length; i++) w += bytes[b[i]];
        ids = bpeWord(w);
        if (cached < 50000) {
          cache[ps[p]] = ids;
          cached++;
        }
      }
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
