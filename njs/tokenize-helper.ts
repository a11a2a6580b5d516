// The tokenizer endpoint nginx calls for long prompts (POST /v1/tokenize on
// the bridge's admin port). njs runs inside the nginx worker's event loop:
// tokenizing and hashing a 100k-token prompt there holds every other
// connection of that worker for as long. Here the same work runs in Node, on
// a tokenizer thread with the router's fast BPE, its piece cache and its
// prefix-hash cache, so a conversation that grows by a turn re-encodes and
// re-hashes only the new turn. njs awaits the answer with ngx.fetch (the
// worker keeps serving meanwhile) and picks with the block hashes.
//
// Request: the client's body as sent (njs has already parsed and checked it),
// with the endpoint, block size, limits and the chain root (njs/offload.ts)
// in headers. Answer: {"t":tokens,"b":[block hashes],"x":exact,"mh":[media hashes]},
// the Features computeFeatures gives in the ext_proc router; to a caller that
// sends X-Infera-Answer: packed, the same with the hashes packed (answerPacked).
//
// --send-token-ids exact: asked with X-Infera-Ids: exact (and while some
// worker's render parity is exact), the packed answer also carries the
// request rewritten to carry the prompt's ids (runtime/token-ids.ts
// tokenIdRequest, the Envoy path's rules) after the hashes, so njs hands the
// engine a body it never builds or parses: a 100k-token prompt's ids body is
// several hundred KB of JSON, which the nginx worker's event loop would
// otherwise serialise itself.
import { spec } from "../runtime/metrics";
import * as http from "http";
import { Counter, Registry } from "prom-client";
import { computeFeatures, Endpoint, mediaSalt, parseRequest, ParsedRequest } from "../core/request";
import { asHttpError } from "../core/util";
import { loadTokenizer, LoadedTokenizer } from "../runtime/tokenizer";
import { nativeHasher } from "../runtime/hasher";
import { prefixHashes } from "../runtime/prefix-hashes";
import { defaultThreads, TokenizerPool } from "../runtime/tokenpool";
import { PACKED_WIDTH } from "../core/state/marks";
import { tokenIdRequest } from "../runtime/token-ids";

const ENDPOINTS: Endpoint[] = ["chat", "completions", "messages"];
/** Texts up to this many characters encode on the bridge's own loop (a thread hop costs more). */
const INLINE_CHARS = 16384;
/** Bodies larger than this are refused before reading (nginx's own limit is far below). */
const MAX_READ = 256 * 1024 * 1024;

/** Hashes that pack: every one PACKED_WIDTH characters of [0-9a-f] (so the packed string splits back exactly). */
function packable(blocks: string[]): boolean {
  for (const b of blocks) if (b.length !== PACKED_WIDTH || !/^[0-9a-f]+$/.test(b)) return false;
  return true;
}

export interface TokenizeHelper {
  handle(req: http.IncomingMessage, res: http.ServerResponse): void;
  stats: { requests: number; errors: number; threaded: number; idsBodies: number };
  /** The tokenizer it encodes with (the bridge's render probes use the same one). */
  tokenizer(): LoadedTokenizer | null;
  /** Loads the tokenizer and starts the threads now, not on nginx's first long prompt. */
  warm(): Promise<void>;
  close(): void;
}

export function tokenizeHelper(
  registry?: Registry,
  timeoutMs = 5000,
  /** --send-token-ids exact on the bridge: whether some worker's render parity is exact now. */
  anyExact: () => boolean = () => false,
): TokenizeHelper {
  const answered = new Counter({
    ...spec("infera_bridge_tokenize_requests_total"),
    registers: registry ? [registry] : [],
  });
  // The same tokenizer the njs bundle was built with (njs/build.ts reads the same variable).
  const key = process.env.INFERA_TOKENIZER_PATH || "";
  let tok: LoadedTokenizer | null | undefined;
  const tokenizer = () => (tok === undefined ? (tok = loadTokenizer(key || null)) : tok);
  const hashes = prefixHashes(nativeHasher);
  let pool: TokenizerPool | null = null;
  const stats = { requests: 0, errors: 0, threaded: 0, idsBodies: 0 };

  const threads = () =>
    pool || (pool = new TokenizerPool({ keys: [key], threads: defaultThreads(), queueMax: 256, timeoutMs: timeoutMs }));

  type Feats = { tokens: number; blocks: string[]; exact: boolean; media: string[]; ids?: ArrayLike<number> };
  /** wantIds: keep the prompt's ids (text prompts without media only: the ids path's own rule). */
  const features = async (
    req: ParsedRequest,
    blockSize: number,
    root: string | null,
    wantIds: boolean,
  ): Promise<Feats> => {
    const t = tokenizer();
    const ms = mediaSalt(req, nativeHasher, root);
    if (!t || req.promptTokens) {
      const f = computeFeatures(req, t, blockSize, nativeHasher, root);
      return { tokens: f.inputTokens, blocks: f.blocks as string[], exact: f.exact, media: f.mediaHashes };
    }
    const keep = wantIds && !req.media.length;
    const text = req.chat ? t.renderChat(req.chat) : (req.prompt as string);
    const special = !!(req.addSpecialTokens && t.encodeSpecial);
    if (text.length <= INLINE_CHARS) {
      const ids = special ? t.encodeSpecial!(text) : t.encode(text);
      const blocks = hashes.hash(ids, blockSize, ms.salt) as string[];
      const f: Feats = { tokens: ids.length, blocks, exact: ms.mediaHashes.length === 0, media: ms.mediaHashes };
      if (keep) f.ids = ids;
      return f;
    }
    stats.threaded++;
    const r = await threads().encode(key, text, special, blockSize, ms.salt ?? null, keep);
    const f: Feats = { tokens: r.tokens, blocks: r.blocks, exact: ms.mediaHashes.length === 0, media: ms.mediaHashes };
    if (keep && r.ids) f.ids = r.ids;
    return f;
  };

  const answer = (res: http.ServerResponse, status: number, body: unknown) => {
    answered.inc({ result: status === 200 ? "ok" : status === 503 ? "error" : "refused" });
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  };

  // The packed answer: the JSON line of the plain answer with n (the hash count)
  // in place of b, a newline, then the n hashes end to end, PACKED_WIDTH
  // characters each (core/state/marks.ts packedBlocks).
  // With an ids body (head.ib = 1) it follows the hashes to the end: the hashes
  // are ASCII, so njs finds its start by character count.
  const answerPacked = (res: http.ServerResponse, head: object, blocks: string[], idsBody?: Buffer) => {
    answered.inc({ result: "ok" });
    res.writeHead(200, { "content-type": "text/plain" });
    const front = JSON.stringify(head) + "\n" + blocks.join("");
    if (idsBody) res.end(Buffer.concat([Buffer.from(front, "utf8"), idsBody]));
    else res.end(front);
  };

  return {
    stats,
    tokenizer,
    async warm() {
      if (tokenizer()) await threads().ready();
    },
    handle(req, res) {
      stats.requests++;
      const h = (n: string) => String(req.headers[n] || "");
      const endpoint = h("x-infera-endpoint") as Endpoint;
      const blockSize = Number(h("x-infera-block-size"));
      // maxBodyBytes,maxMessages,maxMedia,maxJsonDepth as nginx's variables set them.
      const lim = h("x-infera-limits").split(",").map(Number);
      // The LoRA adapter / cache_salt chain root njs found (core/kvevents.ts requestRoot); empty: none.
      const root = h("x-infera-root") || null;
      // A bundle that reads packed hashes says so (njs/offload.ts); any other caller gets the JSON list.
      const packed = h("x-infera-answer") === "packed";
      // njs's $infera_send_token_ids exact: the ids body too, while some worker can take it.
      const wantIds = packed && h("x-infera-ids") === "exact" && anyExact();
      if (
        req.method !== "POST" ||
        ENDPOINTS.indexOf(endpoint) < 0 ||
        !(blockSize > 0) ||
        lim.length !== 4 ||
        lim.some((x) => !(x >= 0))
      ) {
        stats.errors++;
        return answer(res, 400, { error: "needs POST, x-infera-endpoint, x-infera-block-size, x-infera-limits" });
      }
      const parts: Buffer[] = [];
      let size = 0;
      req.on("data", (c: Buffer) => {
        size += c.length;
        if (size <= MAX_READ) parts.push(c);
      });
      req.on("error", () => undefined);
      req.on("end", () => {
        const body = Buffer.concat(parts);
        let parsed: ParsedRequest;
        try {
          parsed = parseRequest(endpoint, body.length <= lim[0] ? body.toString("utf8") : "", size, {
            maxBodyBytes: lim[0],
            maxMessages: lim[1],
            maxMedia: lim[2],
            maxJsonDepth: lim[3],
          });
        } catch (e) {
          // njs checked the same body with the same limits: reaching here means the two disagree.
          stats.errors++;
          return answer(res, 422, { error: asHttpError(e).message });
        }
        features(parsed, blockSize, root, wantIds).then(
          (f) => {
            if (!packed || !packable(f.blocks))
              return answer(res, 200, { t: f.tokens, b: f.blocks, x: f.exact, mh: f.media });
            const head: Record<string, unknown> = { t: f.tokens, n: f.blocks.length, x: f.exact, mh: f.media };
            if (!wantIds) return answerPacked(res, head, f.blocks);
            // The Envoy path's rules (runtime/token-ids.ts): ib 1 + the body after the hashes, or why text (it).
            const plan = f.ids
              ? tokenIdRequest(endpoint, body, f.ids)
              : { text: parsed.media.length ? "media" : "prompt" };
            if ("text" in plan) {
              head.it = plan.text;
              return answerPacked(res, head, f.blocks);
            }
            stats.idsBodies++;
            head.ib = 1;
            head.ip = plan.path || "";
            head.ic = plan.chat;
            answerPacked(res, head, f.blocks, plan.body);
          },
          (e) => {
            // A prompt the helper could not encode in time: nginx falls back (estimate), never fails the request.
            stats.errors++;
            answer(res, 503, { error: (e as Error).message });
          },
        );
      });
    },
    close() {
      if (pool) pool.close();
    },
  };
}
