// NGINX njs entry: the same core as the ext_proc server, with its state in
// js_shared_dict_zone (each request gets a fresh VM, so nothing may live in
// globals across requests). Requires njs >= 0.8.0; see docs/gateways/nginx.md.
import { createRouter, Guard, Router, RouterConfig, Worker } from "../core/router";
import { Store } from "../core/store";
import {
  acceptPushSeq,
  coldEnter,
  coldInFlight,
  countShed,
  shedCounts,
  countDecision,
  countHitBlocks,
  decisionCounts,
  guardKey,
  hitBlockCounts,
  keyedState,
  nextRequestId,
  saveGuard,
  storeModelTable,
} from "../core/state/keyed";
import { computeFeatures, parseRequest, Tokenizer } from "../core/request";
import { checkPath, pathRules, PathRule } from "../core/paths";
import { defaultTierWeights, parseTierWeights, requestRoot } from "../core/kvevents";
import { compactTokenizer } from "../core/bpe";
import { asHttpError, promLabel } from "../core/util";
import { checkSessionId } from "../core/limits";
import { unknownWorker, workerRow } from "../core/views";
import { withModels } from "../core/models";
import { storeLoraTable, withLora } from "../core/lora";
import { storeEngineReadings } from "../core/engine-readings";
import { FlagValue, nginxFlag, nginxFlagVars, routerConfigFromVars } from "../core/flags";
import { metricHeader, metricSpec } from "../core/metric-table";
import { errorJson } from "../core/errors";
import { parseSessionHeaders, sessionFromHeaders } from "../core/session-headers";
import { dpBodyFields, withBodyFields } from "../core/dprank";
import { objectiveOf, parseObjectives } from "../core/objectives";
import { shedsAtOnce } from "../core/admission";
import { moveGuard, nextBest } from "../core/failover";
import { Endpoint } from "../core/request";
import { Pick } from "../core/router";
import { helperFeatures, IdsBody, offloadVars, useHelper } from "./offload";
import {
  firstByte,
  firstByteIds,
  logHook,
  NUM_ZONE,
  release,
  sharedStore,
  STR_ZONE,
  toChat,
  zonesMissing,
} from "./phases";
import { applyPush, pushGate, zoneWarning } from "./push";
import { engineIdOf } from "../core/fleet";

function json(r: NjsRequest, status: number, body: unknown): void {
  r.headersOut["Content-Type"] = "application/json";
  r.return(status, JSON.stringify(body));
}

function fail(r: NjsRequest, status: number, message: string, type: string, param?: string): void {
  r.headersOut["Content-Type"] = "application/json";
  r.return(status, errorJson(r.uri, status, message, type, param));
}

// What one request has read and built, kept for the phases that run in the
// same VM. nginx njs clones a VM per request context and runs a location's
// content handler, header filter and log-phase js_set in it; an internal
// redirect (route -> proxy location, or error_page -> @infera_retry) resets
// the context, so the next location's phases get a VM of their own. Keyed on
// the request object (one per context), so a context reused for another
// request (QuickJS js_context_reuse) starts afresh rather than see this one.
interface Memo {
  r: NjsRequest | null;
  /** The flag variables read so far (nginx's values; null for an unset one). */
  vars: { [name: string]: string | null };
  /** nginxFlag values parsed so far. */
  flags: { [name: string]: FlagValue };
  st: Store | null;
  ctx: Ctx | string | null;
  /** The flags' parsed values from the config cache (configCached), or null. */
  cached: { [name: string]: FlagValue } | null;
}
const memo: Memo = { r: null, vars: {}, flags: {}, st: null, ctx: null, cached: null };

function memoFor(r: NjsRequest): Memo {
  if (memo.r !== r) {
    memo.r = r;
    memo.vars = {};
    memo.flags = {};
    memo.st = null;
    memo.ctx = null;
    memo.cached = null;
  }
  return memo;
}

/**
 * The flag variables' reader (they are set once per server, so one read per
 * VM is enough). Variables the handlers write ($infera_rid, $infera_worker,
 * ...) are read from r.variables directly, never through this.
 */
function getVar(r: NjsRequest): (name: string) => string | undefined {
  const m = memoFor(r);
  return function (name: string) {
    const seen = m.vars[name];
    if (seen !== undefined) return seen === null ? undefined : seen;
    const v = r.variables[name];
    m.vars[name] = v === undefined ? null : v;
    return v;
  };
}

/** nginxFlag for this request, parsed once per VM. */
function flag(r: NjsRequest, name: string): FlagValue {
  const m = memoFor(r);
  if (!(name in m.flags)) m.flags[name] = m.cached && name in m.cached ? m.cached[name] : nginxFlag(name, getVar(r));
  return m.flags[name];
}

// Router flags come from nginx variables ($infera_policy, ...): core/flags.ts
// maps each CLI flag to its variable; a bad value is a 500 naming the variable.
//
// What the variables parse to is kept in the string zone, keyed on the
// bundle and every flag variable's raw value: the flag specs, their checks
// and the parsing then run once per distinct configuration, not in every
// request's VM. A value that does not parse is never kept (it throws as it
// always did), and a change of value or bundle is another key.
function config(r: NjsRequest): RouterConfig {
  const key = configKey(r);
  const sh = typeof ngx !== "undefined" && ngx.shared ? ngx.shared[STR_ZONE] : undefined;
  if (key && sh) {
    const raw = sh.get(key);
    if (raw !== undefined) {
      const p = JSON.parse(String(raw)) as { c: RouterConfig; f: { [name: string]: FlagValue } };
      memoFor(r).cached = p.f;
      return p.c;
    }
  }
  const c = configFromVars(r);
  if (key && sh) {
    // Every flag njs may read, parsed now; one that does not parse stays out (flag() throws for it as before).
    const f: { [name: string]: FlagValue } = {};
    const vs = nginxFlagVars();
    for (let i = 0; i < vs.length; i++) {
      try {
        f[vs[i].name] = flag(r, vs[i].name);
      } catch (e) {
        /* read, and refused, when a handler asks for it */
      }
    }
    // At most CONFIGS_KEPT configurations per bundle: variables set from the
    // request (a map on a header) would otherwise add a key per distinct value.
    const num = ngx.shared ? ngx.shared[NUM_ZONE] : undefined;
    if (plainJson(c) && plainJson(f) && num)
      try {
        if (num.incr("CFGN:" + INFERA_BUILD, 1, 0) <= CONFIGS_KEPT) sh.set(key, JSON.stringify({ c: c, f: f }));
      } catch (e) {
        /* a full zone parses again next time */
      }
  }
  return c;
}

const CONFIGS_KEPT = 32;

/** The config cache's key: the bundle, then each flag variable's value (length-prefixed), or null in a bundle built without them. */
function configKey(r: NjsRequest): string | null {
  if (typeof INFERA_BUILD !== "string" || typeof INFERA_CONFIG_VARS === "undefined") return null;
  const get = getVar(r);
  const parts = ["CFG:", INFERA_BUILD];
  const vars = INFERA_CONFIG_VARS.concat(["infera_kv_tier_weights"]);
  for (let i = 0; i < vars.length; i++) {
    const v = get(vars[i]);
    parts.push(v === undefined ? ";-" : ";" + v.length + ":" + v);
  }
  return parts.join("");
}

/** Whether JSON gives v back as it is: no undefined, function, NaN or infinity anywhere in it. */
function plainJson(v: unknown): boolean {
  if (v === null || typeof v === "string" || typeof v === "boolean") return true;
  if (typeof v === "number") return isFinite(v);
  if (v instanceof Array) {
    for (let i = 0; i < v.length; i++) if (!plainJson(v[i])) return false;
    return true;
  }
  if (typeof v !== "object") return false;
  const o = v as { [k: string]: unknown };
  for (const k in o) if (!plainJson(o[k])) return false;
  return true;
}

function configFromVars(r: NjsRequest): RouterConfig {
  const c = routerConfigFromVars(getVar(r));
  const tv = getVar(r)("infera_kv_tier_weights");
  if (tv) {
    const tw = defaultTierWeights();
    const given = parseTierWeights(tv);
    for (const k in given) tw[k] = given[k];
    c.kvTierWeights = tw;
  }
  return c;
}

interface Ctx {
  st: Store;
  router: Router;
  cfg: RouterConfig;
}

/** The shared-dict store alone (no router, no flags), or null without the zones. */
function store(r: NjsRequest): Store | null {
  const m = memoFor(r);
  if (m.st) return m.st;
  const sh = typeof ngx !== "undefined" ? ngx.shared : undefined;
  if (!sh || !sh[STR_ZONE] || !sh[NUM_ZONE]) return null;
  m.st = sharedStore(sh[STR_ZONE], sh[NUM_ZONE]);
  return m.st;
}

// Shared dicts + router for this request, or why there are none: built once
// per VM (memo above), however many phases of the request ask.
function build(r: NjsRequest): Ctx | string {
  const m = memoFor(r);
  if (m.ctx === null) m.ctx = buildNew(r);
  return m.ctx;
}

function buildNew(r: NjsRequest): Ctx | string {
  const missing = zonesMissing();
  if (missing) return missing;
  const st = store(r) as Store;
  const cfg = config(r);
  try {
    const hooks = {
      log: logHook(r),
      // Decision counters live in the number dict so /metrics sees every VM's.
      onDemand: (d: { mode: string; input: string; agrees: boolean }) => countDecision(st, d.mode, d.input, d.agrees),
      // Same counter as the ext_proc server's: how many request blocks the pick found cached.
      onPick: (role: string, p: { worker: string; hits: number }) => {
        if (p.hits > 0) countHitBlocks(st, p.worker, role, p.hits);
      },
    };
    const state = withLora(withModels(keyedState(st), storeModelTable(st)), storeLoraTable(st));
    // The bridge's scrapes (type "engine" pushes), shared by every worker process.
    state.engine = storeEngineReadings(st);
    return { st: st, cfg: cfg, router: createRouter(state, cfg, hooks) };
  } catch (e) {
    return "infera-gate config: " + (e as Error).message;
  }
}

/** For handlers that answer: a failure becomes a logged 500. */
function ctx(r: NjsRequest): Ctx | null {
  const c = build(r);
  if (typeof c !== "string") return c;
  r.error(c);
  fail(r, 500, c, "server_misconfigured");
  return null;
}

/** For filters and the log phase, which cannot answer. */
function ctx0(r: NjsRequest): Ctx | null {
  const c = build(r);
  return typeof c === "string" ? null : c;
}

let bpeTok: Tokenizer | null = null;
function tokenizer(): Tokenizer | null {
  if (bpeTok) return bpeTok;
  if (typeof infera_vocab === "undefined") return null;
  bpeTok = compactTokenizer(infera_vocab);
  return bpeTok;
}

// $request_id does not survive the internal redirect to the proxy location;
// a js_var does, so the pick's id travels in $infera_rid.
function reqId(r: NjsRequest): string {
  return r.variables.infera_rid || "";
}

// The rules for the last $infera_extra_paths seen (a VM serves one config; its value rarely changes).
let rulesSpec: string | null = null;
let rules: PathRule[] = [];
function rulesFor(spec: string): PathRule[] {
  if (spec !== rulesSpec) {
    rules = pathRules(spec);
    rulesSpec = spec;
  }
  return rules;
}

/**
 * A string's UTF-8 bytes as njs knows them: njs keeps strings as UTF-8, and
 * Buffer.byteLength reads that size instead of scanning the text (a long
 * prompt's estimate, core/request.ts). undefined where there is no Buffer.
 */
function byteLength(): ((s: string) => number) | undefined {
  const b = (globalThis as unknown as { Buffer?: { byteLength?: (s: string) => number } }).Buffer;
  if (!b || typeof b.byteLength !== "function") return undefined;
  const buf = b as { byteLength: (s: string) => number };
  return function (s: string) {
    return buf.byteLength(s);
  };
}

/** js_content for /v1/...: pick, remember the guards, hand over to the proxy location. */
function route(r: NjsRequest): void {
  const c = ctx(r);
  if (!c) return;
  // Only allowed paths reach a worker (core/paths.ts); r.uri is nginx's normalised path.
  const verdict = checkPath(rulesFor(flag(r, "extra-paths") as string), r.method, r.uri);
  if (verdict.error) return fail(r, verdict.error.status, verdict.error.message, verdict.error.type);
  const ep = verdict.endpoint;
  let pick;
  let stream = false;
  let idsPlan: IdsPlan | null = null;
  try {
    if (ep) {
      const body = r.requestText || "";
      const bytes = r.requestBuffer ? r.requestBuffer.length : body.length;
      const maxBody = flag(r, "max-body-bytes") as number;
      const lim = {
        maxBodyBytes: maxBody,
        maxMessages: flag(r, "max-messages") as number,
        maxMedia: flag(r, "max-images") as number,
        maxJsonDepth: flag(r, "max-json-depth") as number,
        byteLength: byteLength(),
      };
      const req = parseRequest(
        ep,
        body,
        bytes,
        lim,
        sessionFromHeaders(
          (n) => r.headersIn[n],
          flag(r, "session-header") as string,
          parseSessionHeaders(flag(r, "session-headers") as string),
        ),
      );
      checkSessionId(req.sessionId, flag(r, "max-session-id-bytes") as number);
      stream = req.stream;
      const root = requestRoot(c.router.state.mirror, req.model, req.cacheSalt);
      const ov = offloadVars(getVar(r));
      // --send-token-ids exact: ids come only from the helper, which builds the engine's body (njs/tokenize-helper.ts).
      const wantIds = (ep === "chat" || ep === "completions") && flag(r, "send-token-ids") === "exact";
      if (useHelper(ov, req)) {
        // A long prompt: tokenized and hashed by the helper while this worker serves others (njs/offload.ts).
        const sid = req.sessionId;
        const streamed = stream;
        const limits = [lim.maxBodyBytes, lim.maxMessages, lim.maxMedia, lim.maxJsonDepth];
        return helperFeatures(
          r,
          ov,
          req,
          body,
          c.cfg.blockSize,
          limits,
          root,
          tokenizer,
          wantIds,
          function (f, ids, why) {
            let p: Pick;
            try {
              p = c.router.pick(f, sid);
            } catch (e) {
              return refuse(r, c, e);
            }
            send(r, c, ep, p, streamed, wantIds ? { ids: ids, why: why } : null);
          },
        );
      }
      if (wantIds) idsPlan = { ids: null, why: "tokenized in njs" };
      const f = computeFeatures(req, tokenizer(), c.cfg.blockSize, undefined, root);
      pick = c.router.pick(f, req.sessionId);
    } else pick = c.router.pick({ blocks: [], inputTokens: 0, exact: false, mediaHashes: [], n: 1 });
  } catch (e) {
    return refuse(r, c, e);
  }
  send(r, c, ep, pick, stream, idsPlan);
}

/** --send-token-ids exact: the helper's ids body, or null and why the request goes as text. */
interface IdsPlan {
  ids: IdsBody | null;
  why: string;
}

/** The worker's render parity as the bridge pushed it is exact (a DP rank is probed as its engine). */
function parityExact(st: Store, id: string): boolean {
  const v = st.get(PARITY + id);
  if (v !== undefined) return v === "exact";
  const engine = engineIdOf(id);
  return engine !== id && st.get(PARITY + engine) === "exact";
}

/** Counts a token-id outcome beside the Envoy path's (infera_router_token_id_requests_total). */
function countIds(st: Store, outcome: string): void {
  try {
    st.incr("TI:" + outcome, 1);
  } catch (e) {
    /* a full zone loses the count, not the request */
  }
}

function refuse(r: NjsRequest, c: Ctx, e: unknown): void {
  // Ours carry an HTTP status; anything else is the state failing under us
  // (a full shared-dict zone): route by load-free choice rather than fail.
  if (!(e instanceof Error && typeof (e as { status?: unknown }).status === "number") && degrade(r, c, e)) return;
  const err = asHttpError(e);
  return fail(r, err.status, err.message, err.type, err.param);
}

/** Sheds a sheddable cold request, else remembers the pick's guards and hands the request to the proxy location. */
function send(
  r: NjsRequest,
  c: Ctx,
  ep: Endpoint | null | undefined,
  pick: Pick,
  stream: boolean,
  ids: IdsPlan | null,
): void {
  // Priority shedding, the Envoy path's rule without its queue (core/admission.ts
  // shedsAtOnce): a sheddable cold request whose worker has no free prefill slot.
  const adm = {
    slots: c.cfg.policy === "kv-aware" ? (flag(r, "prefill-admission-slots") as number) : 0,
    warmTokens: flag(r, "prefill-admission-warm-tokens") as number,
  };
  const coldEk =
    ep && adm.slots > 0 && pick.uncachedTokens > adm.warmTokens ? (pick.prefill || pick.target).epochKey : "";
  if (coldEk) {
    const obj = objectiveOf(
      function (n: string) {
        return r.headersIn[n];
      },
      parseObjectives(flag(r, "objectives") as string),
      flag(r, "objective-headers") === "trust",
    );
    if (shedsAtOnce(obj.priority, pick.uncachedTokens, adm, coldInFlight(c.st, coldEk))) {
      pick.reservation.finish();
      countShed(c.st, obj.priority);
      r.headersOut["Retry-After"] = "1";
      return fail(r, 429, "the workers are saturated; sheddable request refused, retry later", "rate_limited");
    }
  }
  const g = pick.reservation.guards();
  let id = "";
  try {
    id = nextRequestId(c.st);
    if (g.prefill) saveGuard(c.st, id, "prefill", g.prefill);
    if (g.queued) saveGuard(c.st, id, "queued", g.queued);
    saveGuard(c.st, id, "main", g.main);
    if (coldEk) coldEnter(c.st, id, coldEk);
  } catch (e) {
    // No room to remember the guards: give the load back now, keep routing.
    pick.reservation.finish();
    id = "";
    zoneWarning(r, "guards");
  }
  r.variables.infera_rid = id;
  r.variables.infera_upstream = pick.target.address;
  r.variables.infera_dp_rank = pick.target.dpRank === undefined ? "" : String(pick.target.dpRank);
  r.variables.infera_worker = pick.target.id;
  // The second choice, should the worker refuse the connection (retry below).
  r.variables.infera_next = nextBest(pick) || "";
  r.variables.infera_stream = stream ? "1" : "";
  r.variables.infera_prefill = pick.prefill ? pick.prefill.address : "";
  r.variables.infera_kv_source = pick.kvSource ? pick.kvSource.address : "";
  // The prefill target's rank, when the prefill engine has DP ranks (beside X-Infera-Prefill).
  r.variables.infera_prefill_dp_rank =
    pick.prefill && pick.prefill.dpRank !== undefined ? String(pick.prefill.dpRank) : "";
  // SGLang reads the ranks from the body: the proxy location that sends $infera_body instead.
  const fields = ep ? dpBodyFields(ep, pick.target, pick.prefill) : null;
  // --send-token-ids exact: the helper's ids body to a worker whose parity is exact, as the
  // Envoy path decides (runtime/director.ts tokenIds); not under P/D, not with ranks in the body.
  if (ids) {
    // why: the reason it goes as text (the helper's, or ours), as the Envoy path's debug log names it.
    // Counted in the Envoy path's order: P/D first, then the worker's parity, then the request.
    let why = "";
    if (pick.prefill) why = "prefill/decode";
    else if (!parityExact(c.st, pick.target.id)) why = "not exact";
    else if (!ids.ids) why = ids.why;
    else if (fields) why = "ranks in the body";
    if (why) countIds(c.st, why === "not exact" ? "text_not_exact" : "text_ineligible");
    else {
      countIds(c.st, "ids");
      const b = ids.ids as IdsBody;
      r.variables.infera_body = b.body;
      r.variables.infera_ids_path = b.path || r.uri;
      r.variables.infera_to_chat = b.chat ? "1" : "";
      r.internalRedirect(idsLocation(stream));
      return;
    }
  }
  const rewritten = fields ? withBodyFields(r.requestText || "", fields) : null;
  if (rewritten !== null) {
    r.variables.infera_body = rewritten;
    r.internalRedirect(upstreamLocation(true, stream));
    return;
  }
  r.internalRedirect(upstreamLocation(false, stream));
}

/** The proxy location that sends $infera_body (the ids) to $infera_ids_path and rewrites the answer back. */
function idsLocation(stream: boolean): string {
  return "@infera_upstream_ids" + (stream ? "_stream" : "");
}

/**
 * The proxy location: streamed answers get the short idle timeout (a worker
 * silent for long mid-stream is wedged), whole answers the long one (nothing
 * comes until the answer is done); $infera_body for ranks in the body.
 */
function upstreamLocation(body: boolean, stream: boolean): string {
  return "@infera_upstream" + (body ? "_body" : "") + (stream ? "_stream" : "");
}

/**
 * error_page 502/504 of the proxy locations. When nothing reached the worker
 * (connection refused or connect timeout: $upstream_bytes_sent is 0), the
 * request goes once to the pick's second choice ($infera_next) with its load
 * moved there: each guard is popped from the dict (atomic), held on the new
 * worker and saved back under the same request id, so the log phase releases
 * it once, where it now is. A request the worker may have started (bytes sent,
 * then reset, timeout or silence) is not retried: it is answered 502/504.
 */
function retry(r: NjsRequest): void {
  // $status is not the error's here (error_page "=" leaves it to this location): the attempt's is.
  const status = lastOf(r.variables.upstream_status) === "504" ? 504 : 502;
  const sent = lastOf(r.variables.upstream_bytes_sent);
  const from = r.variables.infera_worker || "";
  const to = r.variables.infera_next || "";
  const c = ctx0(r);
  const id = reqId(r);
  if (c && id && to && (sent === "0" || sent === "") && to !== from) {
    const moved = moveAll(c, id, from, to);
    const w = moved ? c.router.worker(to) : null;
    if (w) {
      try {
        c.st.incr("FO", 1);
      } catch (e) {
        /* a full zone loses the count, not the retry */
      }
      r.warn("infera: worker " + from + " unreachable, request " + id + " retried on " + to);
      r.variables.infera_next = "";
      r.variables.infera_worker = w.id;
      r.variables.infera_upstream = w.address;
      r.variables.infera_dp_rank = w.dpRank === undefined ? "" : String(w.dpRank);
      let body = false;
      const idsPath = r.variables.infera_ids_path || "";
      if (idsPath) {
        // Sent as ids: the next worker gets them too if its parity is exact (no ranks in the body), else the text.
        r.variables.infera_ids_path = "";
        const verdict = checkPath(rulesFor(flag(r, "extra-paths") as string), r.method, r.uri);
        const fields = verdict.endpoint ? dpBodyFields(verdict.endpoint, w, null) : null;
        if (!fields && parityExact(c.st, w.id)) {
          r.variables.infera_ids_path = idsPath;
          return r.internalRedirect(idsLocation(r.variables.infera_stream === "1"));
        }
        r.variables.infera_to_chat = "";
        r.variables.infera_body = "";
        const again = fields ? withBodyFields(r.requestText || "", fields) : null;
        if (again !== null) {
          r.variables.infera_body = again;
          body = true;
        }
      } else if (r.variables.infera_body) {
        const verdict = checkPath(rulesFor(flag(r, "extra-paths") as string), r.method, r.uri);
        const pf = r.variables.infera_prefill ? workerAt(c, r.variables.infera_prefill) : null;
        const fields = verdict.endpoint ? dpBodyFields(verdict.endpoint, w, pf) : null;
        const again = fields ? withBodyFields(r.requestText || "", fields) : null;
        if (again !== null) {
          r.variables.infera_body = again;
          body = true;
        }
      }
      return r.internalRedirect(upstreamLocation(body, r.variables.infera_stream === "1"));
    }
  }
  if (status === 502) r.headersOut["Retry-After"] = "1";
  fail(
    r,
    status,
    status === 504 ? "worker timed out" : "worker unreachable",
    status === 504 ? "upstream_timeout" : "upstream_error",
  );
}

/** nginx joins the attempts' values with ", " (and " : " across internal redirects); the last one is this attempt's. */
function lastOf(v: string | undefined): string {
  const parts = String(v || "").split(/[,:]/);
  return parts[parts.length - 1].trim();
}

function workerAt(c: Ctx, address: string): Worker | null {
  const ws = c.router.workers();
  for (let i = 0; i < ws.length; i++) if (ws[i].address === address) return ws[i];
  return null;
}

/**
 * Moves every guard of request id that sits on the failed target: main, and
 * queued prefill unless it is on a PD prefill worker (which did not fail;
 * the prefill guard stays too).
 */
function moveAll(c: Ctx, id: string, from: string, to: string): boolean {
  const sh = (ngx.shared as { [z: string]: NjsSharedDict })[STR_ZONE];
  const failed = c.router.worker(from);
  if (!failed) return false;
  const slots: ("queued" | "main")[] = ["queued", "main"];
  let ok = true;
  for (let i = 0; i < slots.length; i++) {
    const key = guardKey(id, slots[i]);
    const raw = sh.pop(key);
    if (raw === undefined) continue;
    const g = JSON.parse(String(raw)) as Guard;
    if (g.epochKey !== failed.epochKey) {
      saveGuard(c.st, id, slots[i], g);
      continue;
    }
    const again = moveGuard(c.router, g, to);
    // Not movable: put it back as it was, the log phase releases it.
    saveGuard(c.st, id, slots[i], again || g);
    if (!again) ok = false;
  }
  return ok;
}

/** Routing when the pick throws (the state cannot be written, or a fault): a usable worker chosen at random, no load held. */
function degrade(r: NjsRequest, c: Ctx, e: unknown): boolean {
  const ws = c.router.workers();
  const ok: Worker[] = [];
  for (let i = 0; i < ws.length; i++) if (c.router.healthy(ws[i].id) && !c.router.excluded(ws[i].id)) ok.push(ws[i]);
  if (!ok.length) return false;
  const w = ok[Math.floor(Math.random() * ok.length)];
  // njs's own errors are a fault in our code (a stack overflow, a type error),
  // not a full zone: say so, with the error, rather than blame the zone size.
  const name = e instanceof Error ? e.name : "";
  if (name === "RangeError" || name === "TypeError" || name === "ReferenceError" || name === "SyntaxError")
    r.error("infera: pick failed (" + String(e) + "): routed to a random usable worker without load or affinity");
  else zoneWarning(r, "pick: " + String(e));
  r.variables.infera_rid = "";
  r.variables.infera_upstream = w.address;
  r.variables.infera_worker = w.id;
  r.variables.infera_dp_rank = w.dpRank === undefined ? "" : String(w.dpRank);
  r.variables.infera_prefill = "";
  r.variables.infera_prefill_dp_rank = "";
  r.variables.infera_kv_source = "";
  r.internalRedirect("@infera_upstream");
  return true;
}

/** A fleet push: every worker, with the bridge's health-check verdict (healthy absent = healthy). */
interface PushBody {
  type: "workers";
  pseq: number;
  workers?: {
    id: string;
    address: string;
    role: "prefill" | "decode" | "mixed";
    blockSize?: number;
    models?: string[] | null;
    /** Of models, the LoRA adapters (their /v1/models entries have a parent). */
    adapters?: string[];
    healthy?: boolean;
    /** The bridge's render-parity probe (exact | diverged | unchecked), with --send-token-ids exact. */
    parity?: string;
  }[];
}

/** Per worker: its render parity as pushed (string dict). */
const PARITY = "TP:";

/**
 * js_content for the fleet pushes (@infera_push_all, after njs/push.ts) and,
 * in a config that sends every push here, for all of them. The bridge
 * (njs/bridge.ts) sends the fleet, the engine scrapes and KV event batches. Refused: wrong token (403), a push
 * sequence not newer than the last accepted one for that stream (409, stale).
 */
function push(r: NjsRequest): void {
  const g = pushGate(r);
  if (!g) return;
  // Engine and KV-event pushes as the push bundle applies them (njs/push.ts);
  // a config whose push location imports this bundle gets the same.
  if (g.type !== "workers") return applyPush(r, g);
  const b = g as unknown as PushBody;
  const c = ctx(r);
  if (!c) return;
  const seqOk = acceptPushSeq(c.st, "workers", b.pseq);
  if (!seqOk.ok) return fail(r, 409, "stale push: pseq " + b.pseq + " <= " + seqOk.last, "stale");
  const ws = b.workers || [];
  c.router.setWorkers(ws);
  const mt = storeModelTable(c.st);
  const lt = c.router.state.lora!;
  for (let i = 0; i < ws.length; i++) {
    mt.set(ws[i].id, ws[i].models || null);
    c.router.setHealthy(ws[i].id, ws[i].healthy !== false);
    const ad = ws[i].adapters || [];
    for (let k = 0; k < ad.length; k++) lt.markAdapter(ad[k]);
    // --send-token-ids exact on the bridge: each worker's render parity (absent: the bridge does not probe).
    const par = ws[i].parity;
    if (par) c.st.set(PARITY + ws[i].id, par);
    else c.st.del(PARITY + ws[i].id);
  }
  // parts: this bundle checks the parts of a batch the bridge cut (njs/push.ts applyPush).
  json(r, 200, { workers: c.router.workers().length, parts: true });
}

/** GET /v1/admin/cache-view/<worker> and /v1/admin/workers. */
function admin(r: NjsRequest): void {
  const c = ctx(r);
  if (!c) return;
  const m = /^\/v1\/admin\/cache-view\/(.+)$/.exec(r.uri);
  if (m) {
    const id = decodeURIComponent(m[1]);
    const v = c.router.cacheView(id);
    return v ? json(r, 200, v) : fail(r, 404, unknownWorker(c.router, id), "not_found");
  }
  if (r.uri === "/v1/admin/workers") {
    const ws = c.router.workers();
    const out: unknown[] = [];
    for (let i = 0; i < ws.length; i++) {
      const row = workerRow(c.router, ws[i]) as unknown as { [k: string]: unknown };
      // --send-token-ids exact: the parity the bridge pushed, as the router's /v1/admin/workers shows it.
      const par = c.st.get(PARITY + ws[i].id);
      if (par !== undefined) row.render_parity = { status: par };
      out.push(row);
    }
    return json(r, 200, out);
  }
  if (r.uri === "/v1/admin/reservations") return json(r, 200, { open_guards: c.router.openGuards() });
  fail(r, 404, "not found", "not_found");
}

/** GET /metrics: Prometheus text for the njs router (shared-dict state). */
function metrics(r: NjsRequest): void {
  const c = ctx(r);
  if (!c) return;
  const ws = c.router.workers();
  const lines: string[] = [];
  // Names, help, types and labels come from core/metric-table.ts, as for the Node router.
  const header = (name: string) => {
    const h = metricHeader(name);
    lines.push(h[0], h[1]);
  };
  const gauge = (name: string, value: (id: string) => number, decodeOnly: boolean) => {
    header(name);
    const label = metricSpec(name).labels[0];
    for (let i = 0; i < ws.length; i++)
      if (!decodeOnly || ws[i].role !== "prefill")
        lines.push(name + "{" + label + '="' + promLabel(ws[i].id) + '"} ' + value(ws[i].id));
  };
  gauge("infera_router_decode_demand_tokens", (id) => c.router.demand(id).tokens, true);
  gauge("infera_router_decode_demand_requests", (id) => c.router.demand(id).requests, true);
  gauge("infera_router_active_blocks", (id) => c.router.activeBlocks(id), false);
  gauge(
    "infera_router_mirror_blocks",
    (id) => {
      const v = c.router.cacheView(id);
      return v ? v.block_count : 0;
    },
    false,
  );
  header("infera_router_decode_demand_decisions_total");
  const counts = decisionCounts(c.st);
  for (let i = 0; i < counts.length; i++) {
    const d = counts[i];
    lines.push(
      'infera_router_decode_demand_decisions_total{mode="' +
        d.mode +
        '",input="' +
        d.input +
        '",agrees="' +
        d.agrees +
        '"} ' +
        d.count,
    );
  }
  header("infera_router_cache_hit_blocks_total");
  const hb = hitBlockCounts(c.st);
  for (let i = 0; i < hb.length; i++)
    lines.push(
      'infera_router_cache_hit_blocks_total{worker="' +
        promLabel(hb[i].worker) +
        '",role="' +
        hb[i].role +
        '"} ' +
        hb[i].count,
    );
  header("infera_router_shed_total");
  const sc = shedCounts(c.st);
  for (let i = 0; i < sc.length; i++)
    lines.push('infera_router_shed_total{priority="' + sc[i].priority + '"} ' + sc[i].count);
  header("infera_router_token_id_requests_total");
  const outcomes = ["ids", "text_not_exact", "text_ineligible"];
  for (let i = 0; i < outcomes.length; i++)
    lines.push('infera_router_token_id_requests_total{outcome="' + outcomes[i] + '"} ' + c.st.num("TI:" + outcomes[i]));
  header("infera_router_failovers_total");
  lines.push("infera_router_failovers_total " + c.st.num("FO"));
  header("infera_router_mirror_unswept_blocks");
  lines.push("infera_router_mirror_unswept_blocks " + c.router.state.mirror.unswept!());
  r.headersOut["Content-Type"] = "text/plain; version=0.0.4";
  r.return(200, lines.join("\n") + "\n");
}

export default {
  route: route,
  retry: retry,
  firstByte: firstByte,
  firstByteIds: firstByteIds,
  toChat: toChat,
  release: release,
  push: push,
  admin: admin,
  metrics: metrics,
};
