// A byte-level BPE for Node at tiktoken-class speed, equal by construction to
// @huggingface/tokenizers on the tokenizer.json shapes it accepts: it applies
// the file's own merge list (pair -> rank), so no "rank = token id" assumption
// is needed. Speed comes from caching whole pre-tokenized words (natural text
// repeats them) and from integer pair keys instead of string concatenation.
// Any feature it does not model makes fastBpeSupport() say why, and the
// caller keeps @huggingface/tokenizers for that tokenizer.
import { byteTable, compilePattern } from "../core/bpe";

interface AddedToken {
  id: number;
  content: string;
  lstrip?: boolean;
  rstrip?: boolean;
  single_word?: boolean;
  normalized?: boolean;
  special?: boolean;
}

export interface TokenizerJson {
  normalizer?: { type: string } | null;
  pre_tokenizer?: any;
  model?: any;
  added_tokens?: AddedToken[];
}

/** The Split regex of a byte-level pre-tokenizer this BPE reproduces, or a reason it cannot. */
function splitPattern(pt: any): { pattern: string } | { reason: string } {
  if (!pt) return { reason: "no pre-tokenizer" };
  const byteLevel = (p: any) => p && p.type === "ByteLevel" && !p.add_prefix_space;
  if (pt.type === "Sequence" && Array.isArray(pt.pretokenizers) && pt.pretokenizers.length === 2) {
    const [s, b] = pt.pretokenizers;
    if (
      s.type === "Split" &&
      s.pattern &&
      typeof s.pattern.Regex === "string" &&
      s.behavior === "Isolated" &&
      !s.invert &&
      byteLevel(b) &&
      b.use_regex === false
    )
      return { pattern: s.pattern.Regex };
  }
  return {
    reason: `pre-tokenizer ${JSON.stringify(pt).slice(0, 120)} is not Sequence[Split(regex, Isolated), ByteLevel(use_regex=false)]`,
  };
}

/** null when the fast path reproduces this tokenizer.json exactly, else the reason it does not. */
export function fastBpeSupport(tj: TokenizerJson): string | null {
  const m = tj.model;
  if (!m || m.type !== "BPE") return `model type ${m && m.type} is not BPE`;
  if (m.dropout) return "BPE dropout";
  if (m.byte_fallback) return "byte_fallback";
  if (m.continuing_subword_prefix || m.end_of_word_suffix) return "subword prefix/suffix";
  if (!Array.isArray(m.merges) || !m.vocab) return "no merges/vocab";
  if (normalizerOf(tj) === undefined) return `normalizer ${JSON.stringify(tj.normalizer).slice(0, 80)}`;
  const sp = splitPattern(tj.pre_tokenizer);
  if ("reason" in sp) return sp.reason;
  for (const a of tj.added_tokens || []) {
    if (a.lstrip || a.rstrip || a.single_word) return `added token ${a.content} strips or matches whole words`;
    if (a.normalized && a.content.normalize("NFC") !== a.content)
      return `added token ${a.content} changes under normalization`;
  }
  // Every byte must have its own token, or a word could fall outside the vocabulary.
  const bytes = byteTable();
  for (let b = 0; b < 256; b++) if (m.vocab[bytes[b]] === undefined) return `byte ${b} has no token`;
  return null;
}

/** "NFC", null (none), or undefined when the normalizer is something else. */
function normalizerOf(tj: TokenizerJson): "NFC" | null | undefined {
  const n: any = tj.normalizer;
  if (!n) return null;
  if (n.type === "NFC") return "NFC";
  if (n.type === "Sequence" && Array.isArray(n.normalizers)) {
    if (n.normalizers.length === 0) return null;
    if (n.normalizers.length === 1 && n.normalizers[0].type === "NFC") return "NFC";
  }
  return undefined;
}

// Token ids stay below 2^21, so (left id, right id) packs into one exact double.
const SHIFT = 2 ** 21;

/**
 * The ids add_special_tokens=true puts around a single sequence, read from the
 * post-processor (TemplateProcessing, ByteLevel, or a Sequence of them); null
 * for any other post-processor (the caller asks @huggingface/tokenizers).
 */
export function specialAffixes(tj: { post_processor?: any }): { prefix: number[]; suffix: number[] } | null {
  const out = { prefix: [] as number[], suffix: [] as number[] };
  const walk = (p: any): boolean => {
    if (!p || p.type === "ByteLevel") return true;
    if (p.type === "Sequence" && Array.isArray(p.processors)) return p.processors.every(walk);
    if (p.type !== "TemplateProcessing" || !Array.isArray(p.single)) return false;
    let seen = false;
    for (const item of p.single) {
      if (item.Sequence) {
        if (item.Sequence.id !== "A" || seen) return false;
        seen = true;
      } else if (item.SpecialToken) {
        const st = p.special_tokens && p.special_tokens[item.SpecialToken.id];
        if (!st || !Array.isArray(st.ids)) return false;
        (seen ? out.suffix : out.prefix).push(...st.ids);
      } else return false;
    }
    return seen;
  };
  return walk(tj.post_processor) ? out : null;
}

export interface FastBpe {
  /** Ids of text without added-token handling beyond splitting them out (like encode(t, {add_special_tokens:false})). */
  encode(text: string): number[];
  /** Words cached and their hit counters (diagnostics). */
  stats(): { words: number; hits: number; misses: number };
}

export function createFastBpe(tj: TokenizerJson, opts: { maxWords?: number } = {}): FastBpe {
  const why = fastBpeSupport(tj);
  if (why) throw new Error("fast BPE does not support this tokenizer: " + why);
  const m = tj.model;
  const vocab: { [k: string]: number } = m.vocab;
  const ignoreMerges = !!m.ignore_merges;
  const re = compilePattern((splitPattern(tj.pre_tokenizer) as { pattern: string }).pattern);
  const nfc = normalizerOf(tj) === "NFC";
  const bc = byteTable();
  const byteId = new Int32Array(256);
  for (let b = 0; b < 256; b++) byteId[b] = vocab[bc[b]];
  // pair -> rank * SHIFT + merged id, in an open-addressing table over
  // typed arrays: integer keys and no boxed doubles on the merge loop's path.
  const list = m.merges as (string | [string, string])[];
  let cap = 1;
  while (cap < list.length * 2) cap *= 2;
  const mask = cap - 1;
  const kA = new Int32Array(cap).fill(-1);
  const kB = new Int32Array(cap);
  const vRank = new Int32Array(cap);
  const vId = new Int32Array(cap);
  const slotOf = (a: number, b: number): number => {
    let h = (Math.imul(a, 0x9e3779b1) ^ Math.imul(b + 0x7f4a7c15, 0x85ebca77)) & mask;
    while (kA[h] !== -1) {
      if (kA[h] === a && kB[h] === b) return h;
      h = (h + 1) & mask;
    }
    return ~h;
  };
  const merges = {
    get(a: number, b: number): number | undefined {
      const h = slotOf(a, b);
      return h >= 0 ? vRank[h] * SHIFT + vId[h] : undefined;
    },
  };
  for (let r = 0; r < list.length; r++) {
    const e = list[r];
    let a: string, b: string;
    if (Array.isArray(e)) [a, b] = e;
    else {
      const sp = e.indexOf(" ", 1);
      a = e.slice(0, sp);
      b = e.slice(sp + 1);
    }
    const ia = vocab[a];
    const ib = vocab[b];
    const im = vocab[a + b];
    if (ia === undefined || ib === undefined || im === undefined) continue;
    const h = slotOf(ia, ib);
    if (h >= 0) continue; // the first (lowest-ranked) entry wins
    kA[~h] = ia;
    kB[~h] = ib;
    vRank[~h] = r;
    vId[~h] = im;
  }
  const added = tj.added_tokens || [];
  const addedIds = new Map<string, number>();
  for (const a of added) addedIds.set(a.content, a.id);
  const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const addedRe = added.length
    ? new RegExp(
        [...addedIds.keys()]
          .sort((x, y) => y.length - x.length)
          .map(esc)
          .join("|"),
        "g",
      )
    : null;

  const maxWords = opts.maxWords ?? 200000;
  let cache = new Map<string, number[]>();
  let old = new Map<string, number[]>();
  let hits = 0;
  let misses = 0;
  const enc = new TextEncoder();
  const buf = new Uint8Array(4096);
  let ids = new Int32Array(1024);

  // Merges the lowest-ranked adjacent pair, leftmost first, until none applies
  // (HF's order); quadratic in the word, fine for words up to a few hundred bytes.
  // pr[i]: the packed merge of (ids[i], ids[i+1]) or Infinity; only the two
  // pairs next to a merge change, so each step looks up two pairs, not all.
  let pr = new Float64Array(1024);
  const pairAt = (i: number, n: number): number => {
    if (i < 0 || i >= n - 1) return Infinity;
    const h = slotOf(ids[i], ids[i + 1]);
    return h >= 0 ? vRank[h] * SHIFT + vId[h] : Infinity;
  };
  function bpeSmall(n: number): number[] {
    if (pr.length < n) pr = new Float64Array(n * 2);
    for (let i = 0; i < n - 1; i++) pr[i] = pairAt(i, n);
    for (;;) {
      let best = -1;
      let bestV = Infinity;
      for (let i = 0; i < n - 1; i++)
        if (pr[i] < bestV) {
          bestV = pr[i];
          best = i;
        }
      if (best < 0) break;
      ids[best] = bestV % SHIFT;
      for (let i = best + 1; i < n - 1; i++) {
        ids[i] = ids[i + 1];
        pr[i] = pr[i + 1];
      }
      n--;
      pr[best] = pairAt(best, n);
      if (best > 0) pr[best - 1] = pairAt(best - 1, n);
    }
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) out[i] = ids[i];
    return out;
  }

  // The same order over a linked list and a binary heap keyed (rank, position):
  // O(n log n) for the long runs (whitespace, base64) an adversarial prompt holds.
  function bpeLarge(n: number): number[] {
    const tok = Int32Array.from(ids.subarray(0, n));
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    const alive = new Uint8Array(n).fill(1);
    // heap entries: [rank*SHIFT+merged, left position, left token, right token]
    const hv: number[] = [];
    const hp: number[] = [];
    const hl: number[] = [];
    const hr: number[] = [];
    const less = (a: number, b: number) => {
      const ra = Math.floor(hv[a] / SHIFT);
      const rb = Math.floor(hv[b] / SHIFT);
      return ra < rb || (ra === rb && hp[a] < hp[b]);
    };
    const swap = (a: number, b: number) => {
      let t = hv[a];
      hv[a] = hv[b];
      hv[b] = t;
      t = hp[a];
      hp[a] = hp[b];
      hp[b] = t;
      t = hl[a];
      hl[a] = hl[b];
      hl[b] = t;
      t = hr[a];
      hr[a] = hr[b];
      hr[b] = t;
    };
    const push = (pos: number) => {
      const q = next[pos];
      if (q < 0) return;
      const v = merges.get(tok[pos], tok[q]);
      if (v === undefined) return;
      hv.push(v);
      hp.push(pos);
      hl.push(tok[pos]);
      hr.push(tok[q]);
      let i = hv.length - 1;
      while (i > 0) {
        const p = (i - 1) >> 1;
        if (!less(i, p)) break;
        swap(i, p);
        i = p;
      }
    };
    const pop = () => {
      const last = hv.length - 1;
      swap(0, last);
      const v = hv.pop()!,
        p = hp.pop()!,
        l = hl.pop()!,
        r = hr.pop()!;
      let i = 0;
      for (;;) {
        const a = 2 * i + 1,
          b = a + 1;
        let s = i;
        if (a < hv.length && less(a, s)) s = a;
        if (b < hv.length && less(b, s)) s = b;
        if (s === i) break;
        swap(i, s);
        i = s;
      }
      return [v, p, l, r];
    };
    for (let i = 0; i < n - 1; i++) push(i);
    while (hv.length) {
      const [v, p, l, r] = pop();
      const q = next[p];
      // stale: either side changed since this pair was queued
      if (!alive[p] || q < 0 || tok[p] !== l || tok[q] !== r) continue;
      tok[p] = v % SHIFT;
      alive[q] = 0;
      next[p] = next[q];
      if (next[q] >= 0) prev[next[q]] = p;
      if (prev[p] >= 0) push(prev[p]);
      push(p);
    }
    const out: number[] = [];
    for (let i = 0; i >= 0 && i < n; i = next[i]) out.push(tok[i]);
    return out;
  }

  function word(w: string): number[] {
    let got = cache.get(w);
    if (got) {
      hits++;
      return got;
    }
    got = old.get(w);
    if (got) {
      hits++;
    } else {
      misses++;
      got = bpeWord(w);
    }
    // Two generations: a full one is dropped whole, so the cache stays bounded without per-hit LRU bookkeeping.
    if (cache.size >= maxWords) {
      old = cache;
      cache = new Map();
    }
    cache.set(w, got);
    return got;
  }

  function bpeWord(w: string): number[] {
    let b: Uint8Array;
    let ascii = w.length <= buf.length;
    // ASCII words (most of code and English) skip the encoder call.
    for (let i = 0; ascii && i < w.length; i++) {
      const c = w.charCodeAt(i);
      if (c >= 0x80) ascii = false;
      else buf[i] = c;
    }
    if (ascii) b = buf.subarray(0, w.length);
    else b = w.length * 3 <= buf.length ? buf.subarray(0, enc.encodeInto(w, buf).written) : enc.encode(w);
    const n = b.length;
    if (ignoreMerges) {
      let s = "";
      for (let i = 0; i < n; i++) s += bc[b[i]];
      const direct = vocab[s];
      if (direct !== undefined) return [direct];
    }
    if (n === 1) return [byteId[b[0]]];
    if (ids.length < n) ids = new Int32Array(n * 2);
    for (let i = 0; i < n; i++) ids[i] = byteId[b[i]];
    return n <= 256 ? bpeSmall(n) : bpeLarge(n);
  }

  function encodePlain(s: string, out: number[]): void {
    if (!s) return;
    const t = nfc ? s.normalize("NFC") : s;
    re.lastIndex = 0;
    let mt: RegExpExecArray | null;
    while ((mt = re.exec(t)) !== null) {
      const piece = mt[0];
      if (!piece) {
        re.lastIndex++;
        continue;
      }
      const got = word(piece);
      for (let i = 0; i < got.length; i++) out.push(got[i]);
    }
  }

  return {
    encode(text: string): number[] {
      const out: number[] = [];
      if (!addedRe) {
        encodePlain(text, out);
        return out;
      }
      addedRe.lastIndex = 0;
      let start = 0;
      let mt: RegExpExecArray | null;
      while ((mt = addedRe.exec(text)) !== null) {
        encodePlain(text.slice(start, mt.index), out);
        out.push(addedIds.get(mt[0])!);
        start = mt.index + mt[0].length;
      }
      encodePlain(text.slice(start), out);
      return out;
    },
    stats: () => ({ words: cache.size + old.size, hits, misses }),
  };
}
