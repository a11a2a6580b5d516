// The phases of a routed request after its pick, in a bundle of their own
// (infera-phases.js). The route ends in internalRedirect, after which nginx
// runs the proxy location's header filter and the access log's js_set in a
// second VM, and every VM runs its bundle's top level first
// (docs/benchmarks/2026-12-07-njs-floor.md). These two need only the shared
// dicts and the ledger's release, not the router, the request parser or the
// tokenizer, so nginx.conf imports this small bundle at http level and adds
// infera.js only in the locations that run js_content. infera.js exports the
// same two functions, so a config that imports infera.js alone still works.
import type { Guard } from "../core/router";
import type { Store } from "../core/store";
import { coldKey, coldLeave, guardKey, keyedState } from "../core/state/keyed";
import { reservations } from "../core/reservation";
import { logfmt, LogFields, LogLevel } from "../core/log";
import { chatEvents, ChatRewrite, chatRewrite, chatWhole } from "../core/token-ids";

export const STR_ZONE = "infera_str";
export const NUM_ZONE = "infera_num";

/** Why this nginx cannot route (no zones, or an njs without shared dicts), or null when both zones are there. */
export function zonesMissing(): string | null {
  const sh = typeof ngx !== "undefined" ? ngx.shared : undefined;
  if (sh && sh[STR_ZONE] && sh[NUM_ZONE]) return null;
  return (
    "infera-gate needs njs >= 0.8.0 with js_shared_dict_zone zones " +
    STR_ZONE +
    " (string) and " +
    NUM_ZONE +
    " (number); njs " +
    njs.version +
    " cannot keep router state between requests"
  );
}

export function sharedStore(s: NjsSharedDict, n: NjsSharedDict): Store {
  return {
    get: (k) => {
      const v = s.get(k);
      return v === undefined ? undefined : String(v);
    },
    set: (k, v) => {
      s.set(k, v);
    },
    add: (k, v) => s.add(k, v),
    del: (k) => {
      s.delete(k);
    },
    incr: (k, d) => n.incr(k, d, 0),
    num: (k) => Number(n.get(k) || 0),
    delNum: (k) => {
      n.delete(k);
    },
    keys: (p) => keysMany([p])[0],
    keysMany: keysMany,
  };
  // A shared dict lists every key it holds (a copy of each): one listing of
  // both dicts serves every prefix, where keys() per prefix lists them again.
  function keysMany(ps: string[]): string[][] {
    const out: string[][] = [];
    for (let j = 0; j < ps.length; j++) out.push([]);
    const all = s.keys(10000000).concat(n.keys(10000000));
    for (let i = 0; i < all.length; i++)
      for (let j = 0; j < ps.length; j++)
        if (all[i].indexOf(ps[j]) === 0) {
          out[j].push(all[i]);
          break;
        }
    return out;
  }
}

export function logHook(r: NjsRequest): (l: LogLevel, msg: string, f?: LogFields) => void {
  return function (l: LogLevel, msg: string, f?: LogFields) {
    if (l === "warn" || l === "error") r.warn("infera: " + logfmt(msg, f));
    else r.log("infera: " + logfmt(msg, f));
  };
}

// The shared-dict store for the request this VM serves (one request object per context).
let storeR: NjsRequest | null = null;
let storeOf: Store | null = null;
function store(r: NjsRequest): Store | null {
  if (storeR === r) return storeOf;
  storeR = r;
  const sh = typeof ngx !== "undefined" ? ngx.shared : undefined;
  storeOf = sh && sh[STR_ZONE] && sh[NUM_ZONE] ? sharedStore(sh[STR_ZONE], sh[NUM_ZONE]) : null;
  return storeOf;
}

/**
 * An enum flag's nginx variable, read as core/flags.ts nginxFlag reads it
 * (unset or empty: the default; else trimmed and one of the choices, or the
 * same error), without the flag table, which needs the router.
 * test/unit/cli.test.ts keeps the two equal for the flags read here.
 */
export function enumVar(raw: string | undefined, name: string, choices: string[], def: string): string {
  if (raw === undefined || raw === "") return def;
  const s = String(raw).trim();
  if (choices.indexOf(s) < 0) throw new Error("$" + name + ": '" + s + "' is not one of " + choices.join(", "));
  return s;
}

// $request_id does not survive the internal redirect to the proxy location;
// a js_var does, so the pick's id travels in $infera_rid.
function reqId(r: NjsRequest): string {
  return r.variables.infera_rid || "";
}

/**
 * Pops a saved guard and gives its load back. pop is atomic: whoever gets it
 * releases it, once. The release is the router's own (releaseGuard is
 * reservations(state).releaseCopy), on the shared-dict state, which needs no
 * router config: the phases after the pick build no router to release.
 */
function releaseKey(r: NjsRequest, key: string): boolean {
  const sh = (ngx.shared as { [z: string]: NjsSharedDict })[STR_ZONE];
  const raw = sh.pop(key);
  if (raw === undefined) return false;
  try {
    reservations(keyedState(store(r) as Store), logHook(r)).releaseCopy(JSON.parse(String(raw)) as Guard);
  } catch (e) {
    /* release never throws into nginx */
  }
  return true;
}

/** The cold prefill count a request took (shedding's slot), given back once: at first byte or log phase. */
function releaseCold(r: NjsRequest, rid: string): void {
  const sh = (ngx.shared as { [z: string]: NjsSharedDict })[STR_ZONE];
  const ek = sh.pop(coldKey(rid));
  const st = ek !== undefined ? store(r) : null;
  if (st) coldLeave(st, String(ek));
}

/**
 * js_header_filter in the proxy location: the response started = first token.
 * This VM builds no router: its top level and these few dict reads are all
 * the phase costs.
 */
export function firstByte(r: NjsRequest): void {
  // The picked worker's id, for clients only when asked ($infera_response_worker_header on).
  const wh = r.variables.infera_response_worker_header;
  if (wh && wh !== "off" && enumVar(wh, "infera_response_worker_header", ["on", "off"], "off") === "on")
    r.headersOut["x-infera-worker"] = r.variables.infera_worker;
  const id = reqId(r);
  if (!id || !store(r)) return;
  releaseKey(r, guardKey(id, "queued"));
  releaseCold(r, id);
  // Only a PD pick saves a prefill guard; only then is the flag read.
  const pre = guardKey(id, "prefill");
  const sh = (ngx.shared as { [z: string]: NjsSharedDict })[STR_ZONE];
  if (
    sh.has(pre) &&
    enumVar(
      r.variables.infera_pd_prefill_guard_release,
      "infera_pd_prefill_guard_release",
      ["first-token", "completion"],
      "first-token",
    ) === "first-token"
  )
    releaseKey(r, pre);
}

/**
 * js_header_filter of the ids proxy locations (--send-token-ids exact): the
 * first byte as above; an answer rewritten to the chat shape has another
 * length, so its Content-Length goes (nginx then sends it chunked).
 */
export function firstByteIds(r: NjsRequest): void {
  firstByte(r);
  if (r.variables.infera_to_chat === "1") delete r.headersOut["Content-Length"];
}

// The body filter's state for the request this VM serves: bytes not yet
// rewritten (a partial event, or a whole answer until its end) and the
// rewrite's own (core/token-ids.ts). Keyed on the request object, as store().
let chatR: NjsRequest | null = null;
// A streamed answer's unfinished event; a whole answer's chunks, joined once at its end.
let chatBuf: NjsBuffer | null = null;
let chatParts: NjsBuffer[] = [];
let chatState: ChatRewrite | null = null;

function concat(list: NjsBuffer[]): NjsBuffer {
  const B = (globalThis as unknown as { Buffer: { concat(list: NjsBuffer[]): NjsBuffer } }).Buffer;
  return B.concat(list);
}

/**
 * js_body_filter of the ids proxy locations (buffer_type=buffer): a chat
 * request sent to the engine's completions endpoint gets its answer back in
 * the chat shape, whole (sent at its end) or event by event. Chunks may cut an
 * event (or a UTF-8 sequence) anywhere: bytes are decoded only up to the last
 * blank line, the rest waits for the next chunk. A completions request passes
 * unchanged.
 */
export function toChat(r: NjsRequest, data: NjsBuffer, flags: { last: boolean }): void {
  if (r.variables.infera_to_chat !== "1") return r.sendBuffer(data, flags);
  if (chatR !== r) {
    chatR = r;
    chatBuf = null;
    chatParts = [];
    chatState = chatRewrite(r.variables.infera_stream === "1");
  }
  const s = chatState as ChatRewrite;
  if (!s.stream) {
    chatParts.push(data);
    if (!flags.last) return;
    const all = concat(chatParts);
    chatParts = [];
    return r.sendBuffer(chatWhole(all.toString("utf8")), { last: true });
  }
  const buf: NjsBuffer = chatBuf && chatBuf.length ? concat([chatBuf, data]) : data;
  const ev = chatEvents(s, buf);
  let out = ev.text;
  chatBuf = ev.rest < buf.length ? buf.slice(ev.rest) : null;
  if (flags.last && chatBuf) {
    out += chatBuf.toString("utf8");
    chatBuf = null;
  }
  if (out || flags.last) r.sendBuffer(out, { last: flags.last, flush: true });
}

/** js_set variable used in the access log: runs once per request at log phase (EOF, abort, error). */
export function release(r: NjsRequest): string {
  const id = reqId(r);
  if (!id || !store(r)) return "-";
  const q = releaseKey(r, guardKey(id, "queued"));
  releaseCold(r, id);
  const a = releaseKey(r, guardKey(id, "prefill"));
  const b = releaseKey(r, guardKey(id, "main"));
  return a || b || q ? "1" : "0";
}

export default { firstByte: firstByte, firstByteIds: firstByteIds, toChat: toChat, release: release };
