// Parses OpenAI /v1/chat/completions, /v1/completions and Anthropic /v1/messages
// bodies into what routing needs. Every malformed input becomes a 400 httpError.
import { httpError, utf8, utf8Length } from "./util";
import { blockHashes, Hasher, jsHasher } from "./hash";
import { BlockHash, Features } from "./types";
import { ChatInput, chatInputOf, conversation } from "./chat";
import { parseJson } from "./json";

export type { Features } from "./types";

export type Endpoint = "chat" | "completions" | "messages";

export interface ParsedRequest {
  endpoint: Endpoint;
  model: string;
  /** Chat/messages requests: what reaches the chat template (see core/chat.ts). */
  chat: ChatInput | null;
  prompt: string | null;
  /** The request's add_special_tokens, or the engine default for its endpoint (chat: false, completions: true). */
  addSpecialTokens: boolean;
  promptTokens: number[] | null;
  /** Image/audio references: http(s) URL or the whole data: URI. */
  media: string[];
  n: number;
  stream: boolean;
  sessionId: string | null;
  /** bytes/4 of the text, skipping inline binary payloads. */
  estimatedTokens: number;
  /** vLLM's cache_salt request field: salts the block chain (KV events fold it the same way). */
  cacheSalt?: string | null;
}

export function endpointOf(path: string): Endpoint | null {
  const p = path.split("?")[0];
  if (/\/v1\/chat\/completions\/?$/.test(p)) return "chat";
  if (/\/v1\/completions\/?$/.test(p)) return "completions";
  if (/\/v1\/messages\/?$/.test(p)) return "messages";
  return null;
}

function isObj(v: unknown): v is { [k: string]: any } {
  return typeof v === "object" && v !== null && !(v instanceof Array);
}

// Bytes of text that reach the prompt; inline binaries (data: URLs, base64) are
// skipped. Iterative: a body's nesting must never decide our stack depth.
function textBytes(root: any, rootKey: string, byteLength: (s: string) => number): number {
  let t = 0;
  const stack: any[] = [root];
  const keys: string[] = [rootKey];
  while (stack.length) {
    const v = stack.pop();
    const key = keys.pop() as string;
    if (typeof v === "string") {
      // The prefix compared, not searched for: indexOf scans a whole long prompt that lacks it.
      if (key !== "data" && v.substring(0, 5) !== "data:") t += byteLength(v);
    } else if (v instanceof Array) {
      for (let i = v.length - 1; i >= 0; i--) {
        stack.push(v[i]);
        keys.push(key);
      }
    } else if (isObj(v))
      for (const k in v) {
        stack.push(v[k]);
        keys.push(k);
      }
  }
  return t;
}

/** How deep a parsed JSON value nests (iterative; stops counting past limit). */
function depthOver(root: unknown, limit: number): boolean {
  const stack: unknown[] = [root];
  const depth: number[] = [0];
  while (stack.length) {
    const v = stack.pop();
    const d = depth.pop() as number;
    if (d > limit) return true;
    if (v instanceof Array)
      for (let i = 0; i < v.length; i++) {
        stack.push(v[i]);
        depth.push(d + 1);
      }
    else if (isObj(v))
      for (const k in v) {
        stack.push(v[k]);
        depth.push(d + 1);
      }
  }
  return false;
}

/** Per-request bounds (flags): work per request stays linear and small. */
export const REQUEST_LIMITS = { maxMessages: 4096, maxMedia: 512, maxJsonDepth: 64 };

// Collects media references from one content part (OpenAI or Anthropic shape).
function mediaOf(part: { [k: string]: any }, out: string[]): void {
  const t = part.type;
  if (t === "image_url" || (t === undefined && part.image_url !== undefined)) {
    const iu = part.image_url;
    const url = typeof iu === "string" ? iu : isObj(iu) ? iu.url : undefined;
    if (typeof url !== "string" || !url) throw httpError(400, "image_url part needs a url");
    out.push(url);
  } else if (t === "image") {
    const src = part.source;
    if (isObj(src)) {
      if (src.type === "base64" && typeof src.data === "string")
        out.push("data:" + (src.media_type || "application/octet-stream") + ";base64," + src.data);
      else if (src.type === "url" && typeof src.url === "string") out.push(src.url);
      else throw httpError(400, "image source must be base64 data or a url");
    } else if (typeof part.image === "string") out.push(part.image);
    else if (typeof part.image_url === "string") out.push(part.image_url);
    else throw httpError(400, "image part has no source");
  } else if (t === "input_audio") {
    const a = part.input_audio;
    if (!isObj(a) || typeof a.data !== "string") throw httpError(400, "input_audio part needs data");
    out.push("data:audio/" + (a.format || "wav") + ";base64," + a.data);
  }
}

function contentText(c: any, media: string[], where: string): string {
  if (typeof c === "string") return c;
  if (c === null || c === undefined) return "";
  if (!(c instanceof Array)) throw httpError(400, where + ".content must be a string or an array of parts");
  let s = "";
  for (let i = 0; i < c.length; i++) {
    const p = c[i];
    if (typeof p === "string") {
      s += p;
      continue;
    }
    if (!isObj(p)) throw httpError(400, where + ".content[" + i + "] must be an object");
    if ((p.type === "text" || p.type === "input_text") && typeof p.text === "string") s += p.text;
    else mediaOf(p, media);
  }
  return s;
}

// Media references of every message, in order (hashing salts blocks with them).
function collectMedia(msgs: any[], media: string[]): void {
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    if (!isObj(m) || typeof m.role !== "string") throw httpError(400, "messages[" + i + "] needs a string 'role'");
    contentText(m.content, media, "messages[" + i + "]");
  }
}

export interface ParseOptions {
  maxBodyBytes: number;
  sessionHeader?: string | null;
  /** Messages per chat request (--max-messages). */
  maxMessages?: number;
  /** Images/audio per request (--max-images). */
  maxMedia?: number;
  /** JSON nesting depth (--max-json-depth). */
  maxJsonDepth?: number;
  /**
   * UTF-8 bytes of a string, where the runtime knows them without a scan
   * (njs keeps strings as UTF-8: Buffer.byteLength reads the size). The
   * default, utf8Length, walks UTF-16 code units as Node's strings have them;
   * njs's charCodeAt sees a character beyond U+FFFF as one unit, which it
   * would count as 3 bytes instead of 4.
   */
  byteLength?: (s: string) => number;
}

export function parseRequest(
  endpoint: Endpoint,
  body: string,
  bodyBytes: number,
  opts: ParseOptions,
  sessionHeader?: string | null,
): ParsedRequest {
  if (bodyBytes > opts.maxBodyBytes)
    throw httpError(
      413,
      "request body is " + bodyBytes + " bytes, over the " + opts.maxBodyBytes + "-byte limit",
      "request_too_large",
    );
  let j: any;
  try {
    j = parseJson(body);
  } catch (e) {
    throw httpError(400, "request body is not valid JSON");
  }
  if (!isObj(j)) throw httpError(400, "request body must be a JSON object");
  const maxDepth = opts.maxJsonDepth || REQUEST_LIMITS.maxJsonDepth;
  if (depthOver(j, maxDepth))
    throw httpError(400, "request body nests deeper than " + maxDepth + " levels (--max-json-depth)");
  if (typeof j.model !== "string" || !j.model) throw httpError(400, "'model' is required");
  const maxMessages = opts.maxMessages || REQUEST_LIMITS.maxMessages;
  if (j.messages instanceof Array && j.messages.length > maxMessages)
    throw httpError(
      400,
      "request has " + j.messages.length + " messages, over the limit of " + maxMessages + " (--max-messages)",
    );
  const media: string[] = [];
  let chat: ChatInput | null = null;
  let prompt: string | null = null;
  let promptTokens: number[] | null = null;
  if (endpoint === "chat" || endpoint === "messages") {
    if (j.messages === undefined) throw httpError(400, "'messages' is required");
    chat = chatInputOf(endpoint, j);
    collectMedia(chat.messages, media);
  } else {
    let p = j.prompt;
    if (p === undefined) throw httpError(400, "'prompt' is required");
    // A batch of prompts routes by its first one.
    if (p instanceof Array && p.length > 0 && (typeof p[0] === "string" || p[0] instanceof Array)) p = p[0];
    if (typeof p === "string") prompt = p;
    else if (p instanceof Array) {
      for (let i = 0; i < p.length; i++)
        if (typeof p[i] !== "number" || p[i] < 0 || p[i] % 1 !== 0)
          throw httpError(400, "'prompt' token ids must be non-negative integers");
        else if (p[i] > 4294967295) throw httpError(400, "'prompt' token id " + p[i] + " does not fit in 32 bits");
      promptTokens = p as number[];
    } else throw httpError(400, "'prompt' must be a string, token ids, or an array of them");
  }
  if (j.images !== undefined) {
    if (!(j.images instanceof Array)) throw httpError(400, "'images' must be an array");
    for (let i = 0; i < j.images.length; i++) {
      const im = j.images[i];
      if (typeof im === "string" && im) media.push(im);
      else if (isObj(im) && typeof im.url === "string") media.push(im.url);
      else throw httpError(400, "images[" + i + "] must be a string or {url}");
    }
  }
  const maxMedia = opts.maxMedia || REQUEST_LIMITS.maxMedia;
  if (media.length > maxMedia)
    throw httpError(
      400,
      "request has " + media.length + " images or audio parts, over the limit of " + maxMedia + " (--max-images)",
    );
  let n = 1;
  if (typeof j.n === "number" && j.n >= 1 && j.n % 1 === 0 && j.n <= 128) n = j.n;
  let sessionId: string | null = sessionHeader || null;
  if (!sessionId && typeof j.session_id === "string" && j.session_id) sessionId = j.session_id;
  const est = promptTokens
    ? promptTokens.length
    : Math.ceil(
        textBytes(endpoint === "completions" ? prompt : [j.system, j.messages], "", opts.byteLength || utf8Length) / 4,
      );
  let addSpecialTokens = endpoint === "completions";
  if (typeof j.add_special_tokens === "boolean") addSpecialTokens = j.add_special_tokens;
  return {
    endpoint,
    model: j.model,
    cacheSalt: typeof j.cache_salt === "string" && j.cache_salt ? j.cache_salt : null,
    chat,
    prompt,
    addSpecialTokens,
    promptTokens,
    media,
    n,
    stream: j.stream === true,
    sessionId,
    estimatedTokens: est,
  };
}

export interface Tokenizer {
  /** Token ids of text, without added special tokens (the engine's chat path). */
  encode(text: string): number[];
  /** Token ids with the special tokens the tokenizer adds (BOS ...), as add_special_tokens=true does. */
  encodeSpecial?(text: string): number[];
  /** Renders a chat request to the prompt text the engine sees (chat template). */
  renderChat(chat: ChatInput): string;
}

/**
 * Plain ChatML for plain text turns: only a fallback for a tokenizer without a
 * chat template (tools, reasoning and media are not rendered).
 */
export function renderChatML(chat: ChatInput): string {
  const conv = conversation(chat, { format: "string" });
  let s = "";
  for (let i = 0; i < conv.length; i++) s += "<|im_start|>" + conv[i].role + "\n" + conv[i].content + "<|im_end|>\n";
  return chat.addGenerationPrompt ? s + "<|im_start|>assistant\n" : s;
}

/** The prompt's token ids as the engine computes them, or null without a tokenizer. */
export function promptTokenIds(req: ParsedRequest, tok: Tokenizer | null): number[] | null {
  if (req.promptTokens) return req.promptTokens;
  if (!tok) return null;
  const text = req.chat ? tok.renderChat(req.chat) : (req.prompt as string);
  return req.addSpecialTokens && tok.encodeSpecial ? tok.encodeSpecial(text) : tok.encode(text);
}

/**
 * Tokenizes once and derives everything the picks share. Without a tokenizer
 * (or when it fails) the token count falls back to the bytes/4 estimate and
 * there are no blocks, so kv-aware degrades to load balance.
 */
export function computeFeatures(
  req: ParsedRequest,
  tok: Tokenizer | null,
  blockSize: number,
  hasher?: Hasher,
  root?: string | null,
): Features {
  const h = hasher || jsHasher;
  const ms = mediaSalt(req, h, root);
  const tokens = promptTokenIds(req, tok);
  if (!tokens)
    return {
      blocks: [],
      inputTokens: req.estimatedTokens,
      exact: false,
      mediaHashes: ms.mediaHashes,
      n: req.n,
      model: req.model,
    };
  return featuresOf(req, tokens.length, blockHashes(tokens, blockSize, h, ms.salt), ms.mediaHashes);
}

/**
 * The media hashes and the chain's seed. Media requests chain from a salt of
 * their images: same text + other images != text hit. root: LoRA adapter /
 * cache_salt chain root (core/kvevents.ts requestRoot).
 */
export function mediaSalt(
  req: ParsedRequest,
  h: Hasher,
  root?: string | null,
): { mediaHashes: string[]; salt: string | undefined } {
  const mediaHashes: string[] = [];
  for (let i = 0; i < req.media.length; i++) mediaHashes.push(h(utf8(req.media[i])));
  let salt: string | undefined = root || undefined;
  if (mediaHashes.length) salt = h(utf8((root ? root + "|" : "") + mediaHashes.join(",")));
  return { mediaHashes, salt };
}

/** Features from a token count and block hashes computed elsewhere (a tokenizer thread). */
export function featuresOf(req: ParsedRequest, tokens: number, blocks: BlockHash[], mediaHashes: string[]): Features {
  // Media expand into engine-side tokens the router never sees: the count is a lower bound.
  return { blocks, inputTokens: tokens, exact: mediaHashes.length === 0, mediaHashes, n: req.n, model: req.model };
}
