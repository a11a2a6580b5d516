// Prompts tokenized and hashed outside the nginx worker. njs runs on the
// worker's event loop, so every millisecond spent encoding a prompt there is a
// millisecond every other connection of that worker waits, and njs encodes
// every prompt in full (a fresh VM per request: no piece or prefix cache
// survives). From $infera_tokenizer_min_tokens (estimated, bytes/4; 0 by
// default: every prompt) on, the body goes to the tokenizer helper
// ($infera_tokenizer_url: the bridge's POST /v1/tokenize,
// njs/tokenize-helper.ts) with ngx.fetch; the worker serves other requests
// until the block hashes come back, then picks with them.
//
// The helper down, slow (js_fetch_timeout) or answering nonsense never fails a
// request: prompts up to $infera_njs_tokenize_max_tokens are tokenized here as
// before, longer ones route on the estimated token count (load only). Each
// cause is logged once (a number-dict flag shared by every worker) and once
// more when the helper answers again. A helper that timed out is not asked
// again for HOLD_MS by prompts njs can tokenize itself (one request past the
// hold asks it again), so a hanging helper costs the fetch timeout once per
// hold, not on every request.
import { computeFeatures, Features, featuresOf, ParsedRequest, Tokenizer } from "../core/request";
import { BlockHash } from "../core/types";
import { PACKED_WIDTH, packedBlocks } from "../core/state/marks";

export interface OffloadVars {
  /** The helper's URL; empty = every prompt is tokenized in njs. */
  url: string;
  /** Estimated tokens (bytes/4) from which a prompt goes to the helper. */
  minTokens: number;
  /** Helper unavailable: estimated tokens up to which njs tokenizes itself (longer: estimate only). */
  njsMaxTokens: number;
}

export const OFFLOAD_DEFAULTS = { minTokens: 0, njsMaxTokens: 8192 };

function intVar(v: string | undefined, dflt: number): number {
  const n = Number(v);
  return v !== undefined && v !== "" && n >= 0 && Math.floor(n) === n ? n : dflt;
}

export function offloadVars(get: (name: string) => string | undefined): OffloadVars {
  return {
    url: get("infera_tokenizer_url") || "",
    minTokens: intVar(get("infera_tokenizer_min_tokens"), OFFLOAD_DEFAULTS.minTokens),
    njsMaxTokens: intVar(get("infera_njs_tokenize_max_tokens"), OFFLOAD_DEFAULTS.njsMaxTokens),
  };
}

// The causes a fallback is logged under (one dict flag each).
const CAUSES = ["unreachable", "timeout", "status", "answer"];
const DOWN = "TKDOWN";
/** Until when (ms since the epoch) prompts njs can tokenize skip a helper that timed out. */
const HOLD = "TKHOLD";
const HOLD_MS = 5000;

/**
 * Whether the helper tokenizes this request (token ids in the body need no
 * tokenizer at all). After a timeout, a prompt njs may tokenize itself skips
 * the helper until the hold ends; the first request after it asks the helper
 * again (and moves the hold on, so the others keep skipping meanwhile).
 */
export function useHelper(v: OffloadVars, req: ParsedRequest): boolean {
  if (v.url === "" || req.promptTokens || req.estimatedTokens < v.minTokens) return false;
  if (req.estimatedTokens > v.njsMaxTokens) return true;
  const num = typeof ngx !== "undefined" && ngx.shared ? ngx.shared.infera_num : undefined;
  if (!num) return true;
  try {
    const until = Number(num.get(HOLD) || 0);
    if (!until) return true;
    const now = Date.now();
    if (now < until) return false;
    num.set(HOLD, now + HOLD_MS);
  } catch (e) {
    /* a full number zone: ask the helper */
  }
  return true;
}

function noteFailure(
  r: NjsRequest,
  num: NjsSharedDict | undefined,
  url: string,
  cause: string,
  detail: string,
  fb: string,
): void {
  let first = true;
  try {
    if (num) {
      first = num.incr("TKF:" + cause, 1, 0) === 1;
      num.set(DOWN, 1);
      if (cause === "timeout") num.set(HOLD, Date.now() + HOLD_MS);
    }
  } catch (e) {
    /* a full number zone: log anyway */
  }
  if (first)
    r.warn(
      "infera: tokenizer helper " +
        url +
        " " +
        cause +
        " (" +
        detail +
        "): long prompts route by fallback (" +
        fb +
        ") until it is back; logged once per cause",
    );
}

function noteRecovery(r: NjsRequest, num: NjsSharedDict | undefined, url: string): void {
  if (!num || !num.get(DOWN)) return;
  num.delete(HOLD);
  // pop is atomic: one request logs the recovery.
  if (num.pop(DOWN) === undefined) return;
  for (let i = 0; i < CAUSES.length; i++) num.delete("TKF:" + CAUSES[i]);
  r.warn("infera: tokenizer helper " + url + " answers again: long prompts route on exact block hashes");
}

/**
 * --send-token-ids: the request as the engine gets it with ids (built by the
 * helper, njs/tokenize-helper.ts), its path (empty: the client's) and whether
 * the answer goes back to the chat shape; or, text: why it goes as text.
 */
export interface IdsBody {
  body: string;
  path: string;
  chat: boolean;
}

/**
 * The helper's answer: the JSON object, or (asked with X-Infera-Answer:
 * packed) its first line with n in place of b, then the n hashes packed
 * (core/state/marks.ts packedBlocks), then (ib: 1) the ids body to the end.
 * A string: why it is neither.
 */
export function readAnswer(
  text: string,
): { t: number; b: BlockHash[]; mh: string[]; ids: IdsBody | null; why: string } | string {
  const nl = text.indexOf("\n");
  let a: {
    t?: unknown;
    b?: unknown;
    n?: unknown;
    mh?: unknown;
    ib?: unknown;
    ip?: unknown;
    ic?: unknown;
    it?: unknown;
  };
  try {
    a = JSON.parse(nl < 0 ? text : text.substring(0, nl));
  } catch (e) {
    return "not JSON";
  }
  const mh = Array.isArray(a.mh) ? (a.mh as string[]) : [];
  if (typeof a.t !== "number") return "no t/b fields";
  const why = typeof a.it === "string" ? a.it : "helper";
  if (nl < 0)
    return Array.isArray(a.b) ? { t: a.t, b: a.b as BlockHash[], mh: mh, ids: null, why: why } : "no t/b fields";
  const n = a.n;
  if (typeof n !== "number" || !(n >= 0) || Math.floor(n) !== n) return "no n field before the packed hashes";
  const end = nl + 1 + n * PACKED_WIDTH;
  const packed = a.ib === 1 ? text.substring(nl + 1, end) : text.substring(nl + 1);
  if (packed.length !== n * PACKED_WIDTH) return "packed hashes of " + packed.length + " characters for " + n;
  let ids: IdsBody | null = null;
  if (a.ib === 1) {
    const body = text.substring(end);
    if (!body) return "an empty ids body";
    ids = { body: body, path: typeof a.ip === "string" ? a.ip : "", chat: a.ic === true };
  }
  return { t: a.t, b: packedBlocks(packed, n) as BlockHash[], mh: mh, ids: ids, why: why };
}

/**
 * Features of req from the helper, or by the fallback; done runs exactly once,
 * after the answer (or the failure) arrives, with the ids body when wantIds
 * and the helper built one (else null and why: the fallback's cause, or the
 * helper's reason). done must not throw.
 */
export function helperFeatures(
  r: NjsRequest,
  v: OffloadVars,
  req: ParsedRequest,
  body: string,
  blockSize: number,
  limits: number[],
  root: string | null,
  tok: () => Tokenizer | null,
  wantIds: boolean,
  done: (f: Features, ids: IdsBody | null, why: string) => void,
): void {
  const num = typeof ngx !== "undefined" && ngx.shared ? ngx.shared.infera_num : undefined;
  let called = false;
  const finish = (f: Features, ids: IdsBody | null, why: string) => {
    if (called) return;
    called = true;
    done(f, ids, why);
  };
  const fallback = (cause: string, detail: string) => {
    const inNjs = req.estimatedTokens <= v.njsMaxTokens;
    noteFailure(r, num, v.url, cause, detail, inNjs ? "tokenized in njs" : "estimated tokens, load only");
    let f: Features;
    try {
      f = computeFeatures(req, inNjs ? tok() : null, blockSize, undefined, root);
    } catch (e) {
      f = computeFeatures(req, null, blockSize, undefined, root);
    }
    finish(f, null, "helper " + cause);
  };
  const headers: { [name: string]: string } = {
    "Content-Type": "application/json",
    "X-Infera-Endpoint": req.endpoint,
    "X-Infera-Block-Size": String(blockSize),
    "X-Infera-Limits": limits.join(","),
    "X-Infera-Root": root || "",
    // The hashes as one packed string (readAnswer); a helper from before it answers the JSON list.
    "X-Infera-Answer": "packed",
  };
  if (wantIds) headers["X-Infera-Ids"] = "exact";
  ngx
    .fetch(v.url, {
      method: "POST",
      body: body,
      headers: headers,
    })
    .then(
      function (res) {
        return res.text().then(function (text) {
          if (res.status !== 200) return fallback("status", "HTTP " + res.status + ": " + text.slice(0, 200));
          const a = readAnswer(text);
          if (typeof a === "string") return fallback("answer", a);
          try {
            noteRecovery(r, num, v.url);
          } catch (e) {
            /* logging only */
          }
          finish(featuresOf(req, a.t, a.b, a.mh), a.ids, a.why);
        });
      },
      function (e) {
        const m = String(e && (e as Error).message ? (e as Error).message : e);
        fallback(/timed? ?out/i.test(m) ? "timeout" : "unreachable", m);
      },
    )
    .then(
      function () {
        return undefined;
      },
      function (e) {
        // Reading the answer failed midway (connection reset): fall back.
        fallback("unreachable", String(e));
      },
    );
}
