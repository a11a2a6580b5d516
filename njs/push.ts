// The push location's handler in a bundle of its own (infera-push.js). The
// bridge sends a push per KV-event batch, dozens a second on a busy fleet,
// and each one is a request context whose VM runs its bundle's top level
// first; infera.js's is the router, the parser, the tokenizer and the flag
// table. Applying an events batch needs none of them: the worker's epoch key
// from the fleet list, the mirror's keys, the block size and the mirror bound.
// The engine scrapes (about one push a second) need as little. The fleet
// pushes are rarer and need the router: they go on to @infera_push_all, where
// infera.js's push applies them as before. The wire format is the same for both; a config that sends every
// push to infera.push still works.
import type { EpochKey, Worker } from "../core/types";
import type { Store } from "../core/store";
import { EngineReadings, EnginePage, nextReading, storeEngineReadings } from "../core/engine-readings";
import { LoraTable, storeLoraTable } from "../core/lora";
import { acceptPushSeq, keyedMirror, keyedRegistry, MAX_PUSH_SEQ_AHEAD_US, SWEEP_STEP } from "../core/state/keyed";
import {
  ApplyResult,
  applyBatch,
  clearAllTiers,
  forgetMirror,
  KvEvent,
  makeRoom,
  storedIn,
  tierKey,
  TIERS,
} from "../core/kvevents";
import { sameSecret } from "../core/util";
import { errorJson } from "../core/errors";
import { logHook, NUM_ZONE, sharedStore, STR_ZONE, zonesMissing } from "./phases";

/** Where pushes other than KV events go (nginx.conf): infera.js's push. */
export const PUSH_ALL_LOCATION = "@infera_push_all";

function fail(r: NjsRequest, status: number, message: string, type: string): void {
  r.headersOut["Content-Type"] = "application/json";
  r.return(status, errorJson(r.uri, status, message, type));
}

/**
 * An int flag's nginx variable, read as core/flags.ts nginxFlag reads it
 * (unset or empty: the default; else a finite integer within min..max, or
 * the same error), without the flag table, which needs the router.
 * test/unit/cli.test.ts keeps the two equal for the flags read here.
 */
export function intVar(raw: string | undefined, name: string, def: number, min?: number, max?: number): number {
  if (raw === undefined || raw === "") return def;
  const s = String(raw).trim();
  const source = "$" + name;
  const n = s === "" ? NaN : Number(s);
  if (!isFinite(n)) throw new Error(source + ": '" + s + "' is not a number");
  if (n % 1 !== 0) throw new Error(source + ": '" + s + "' is not an integer");
  const range = min !== undefined && max !== undefined ? " (range " + min + ".." + max + ")" : "";
  if (min !== undefined && n < min) throw new Error(source + ": " + s + " is below the minimum " + min + range);
  if (max !== undefined && n > max) throw new Error(source + ": " + s + " is above the maximum " + max + range);
  return n;
}

/** A pushed figure: a finite number, else unknown. */
function figure(v: unknown): number | null {
  return typeof v === "number" && isFinite(v) ? v : null;
}

/**
 * One round of the bridge's scrapes into the shared dict, as the router's
 * engine-metrics applies its own (runtime/engine-metrics.ts): capacity in
 * this router's blocks, kept when a scrape fails; the headroom figures;
 * the LoRA state, whose set also clears the sends noted since the last
 * round. Returns how many workers were applied.
 */
export function applyPages(
  workerOf: (id: string) => Worker | null,
  engine: EngineReadings,
  lora: LoraTable,
  blockSize: number,
  pages: { [worker: string]: EnginePage | null },
): number {
  const now = Date.now();
  let n = 0;
  for (const id in pages) {
    if (!Object.prototype.hasOwnProperty.call(pages, id)) continue;
    const w = workerOf(id);
    if (!w) continue;
    const p = pages[id];
    const prev = engine.get(w.epochKey);
    const tokens = p ? figure(p.capacityTokens) : null;
    const f = p
      ? {
          kvUsage: figure(p.kvUsage),
          waitingRequests: figure(p.waitingRequests),
          runningRequests: figure(p.runningRequests),
        }
      : null;
    engine.set(w.epochKey, nextReading(prev, tokens !== null ? Math.floor(tokens / blockSize) : null, f, now));
    const l = p ? p.lora : null;
    const ok = l && typeof l.maxLora === "number" && l.running instanceof Array && l.waiting instanceof Array;
    lora.set(id, ok ? l : null);
    n++;
  }
  return n;
}

export interface EventsPush {
  type?: string;
  pseq: number;
  /** type "engine": each worker's /metrics page as the bridge last scraped it (null: the scrape failed). */
  pages?: { [worker: string]: EnginePage | null };
  worker?: string;
  seq?: number;
  events?: KvEvent[];
  /** The bridge saw the engine restart: drop this worker's mirror first. */
  restart?: boolean;
  /** Part `part` (0-based) of `partOf` parts of batch seq (core/kvevents.ts ApplyOptions). */
  part?: number;
  partOf?: number;
}

/**
 * How many engine blocks, over every worker and tier, nginx's mirror keeps
 * once its zones have filled: learned when a batch did not fit (0 = none
 * learned, the zones have room). $infera_max_mirror_blocks bounds each worker
 * by count; the zones bound them all by bytes, and a batch that fails half
 * way leaves a worker's mirror torn. So the first failure drops that worker's
 * mirror, notes 90% of the blocks the zones held then, and answers 507: the
 * bridge resyncs, and from then on every push first makes room for its blocks
 * by evicting the oldest blocks of the largest mirror (core/kvevents.ts
 * makeRoom). A resync then fits, where before it failed at the same place
 * every time and was retried for ever.
 */
const FIT_KEY = "ZFIT";

/** Every tier of every worker: the targets makeRoom weighs. */
function mirrorTargets(workers: Worker[]): EpochKey[] {
  const out: EpochKey[] = [];
  for (let i = 0; i < workers.length; i++)
    for (let t = 0; t < TIERS.length; t++) out.push(tierKey(workers[i].epochKey as EpochKey, TIERS[t]));
  return out;
}

/** Logs (at most once a minute across VMs, best effort) that a zone is full or nearly so. */
export function zoneWarning(r: NjsRequest, what: string): void {
  const sh = ngx.shared as { [z: string]: NjsSharedDict };
  const parts: string[] = [];
  const zones = [STR_ZONE, NUM_ZONE];
  for (let i = 0; i < zones.length; i++) {
    const z = sh[zones[i]];
    if (z && typeof z.freeSpace === "function")
      parts.push(zones[i] + " " + z.freeSpace() + "/" + z.capacity + " bytes free");
  }
  try {
    const last = Number(sh[NUM_ZONE].get("ZW") || 0);
    if (Date.now() - last < 60000) return;
    sh[NUM_ZONE].set("ZW", Date.now());
  } catch (e) {
    /* the number zone is full too: log anyway */
  }
  r.warn(
    "infera: shared dict zone full or nearly (" +
      what +
      "): " +
      parts.join(", ") +
      "; routing continues, cache affinity degrades; raise the js_shared_dict_zone size",
  );
}

/**
 * The checks every push passes first, in either bundle: the token, the
 * shared zones, a JSON body with a usable pseq. The body, or null once the
 * refusal is answered.
 */
export function pushGate(r: NjsRequest): EventsPush | null {
  // The token comes from the environment (nginx.conf: env INFERA_PUSH_TOKEN;)
  // or, if set, from $infera_push_token (e.g. an included secrets file).
  const env = typeof process !== "undefined" && process.env ? process.env.INFERA_PUSH_TOKEN : undefined;
  const want = r.variables.infera_push_token || env || "";
  if (!want) {
    fail(
      r,
      503,
      "push refused: set INFERA_PUSH_TOKEN in nginx's environment (env INFERA_PUSH_TOKEN;) or $infera_push_token",
      "push_disabled",
    );
    return null;
  }
  if (!sameSecret(String(r.headersIn["X-Infera-Push-Token"] || ""), want)) {
    fail(r, 403, "push refused: bad token", "forbidden");
    return null;
  }
  const missing = zonesMissing();
  if (missing) {
    r.error(missing);
    fail(r, 500, missing, "server_misconfigured");
    return null;
  }
  let b: EventsPush;
  try {
    b = JSON.parse(r.requestText || "");
  } catch (e) {
    fail(r, 400, "push body is not JSON", "invalid_request_error");
    return null;
  }
  if (!b || typeof b.pseq !== "number") {
    fail(r, 400, "push needs a numeric pseq", "invalid_request_error");
    return null;
  }
  if (b.pseq > Date.now() * 1000 + MAX_PUSH_SEQ_AHEAD_US) {
    fail(
      r,
      400,
      "push refused: pseq " +
        b.pseq +
        " is more than 10 minutes ahead of this host's clock (microseconds since the epoch)",
      "invalid_request_error",
    );
    return null;
  }
  return b;
}

/** An engine push or a KV-event batch that passed pushGate, applied and answered. */
export function applyPush(r: NjsRequest, b: EventsPush): void {
  const sh = ngx.shared as { [z: string]: NjsSharedDict };
  let blockSize: number;
  let maxBlocks: number;
  try {
    blockSize = intVar(r.variables.infera_block_size, "infera_block_size", 16, 1, 4096);
    maxBlocks = intVar(r.variables.infera_max_mirror_blocks, "infera_max_mirror_blocks", 1000000, 0);
  } catch (e) {
    const why = "infera-gate config: " + (e as Error).message;
    r.error(why);
    return fail(r, 500, why, "server_misconfigured");
  }
  const st: Store = sharedStore(sh[STR_ZONE], sh[NUM_ZONE]);
  const engine = b.type === "engine";
  const seqOk = acceptPushSeq(st, engine ? "engine" : "ev:" + b.worker, b.pseq);
  if (!seqOk.ok) return fail(r, 409, "stale push: pseq " + b.pseq + " <= " + seqOk.last, "stale");
  const reg = keyedRegistry(st);
  const mirror = keyedMirror(st);
  // Mirrors cleared by earlier pushes drain a step per push (the engine
  // scrape's pushes come even when no events do), so no push holds the
  // worker for a whole large mirror.
  try {
    mirror.sweep!(SWEEP_STEP);
  } catch (e) {
    /* a zone too full to shorten a holder list: the next push sweeps again */
  }
  if (engine) {
    const n = applyPages(reg.get, storeEngineReadings(st), storeLoraTable(st), blockSize, b.pages || {});
    r.headersOut["Content-Type"] = "application/json";
    return r.return(200, JSON.stringify({ workers: n }));
  }
  const w = reg.get(b.worker || "");
  if (!w) return fail(r, 404, "unknown worker " + b.worker, "not_found");
  if (b.restart) forgetMirror(mirror, w.epochKey);
  const events = b.events || [];
  const fit = st.num(FIT_KEY);
  const targets = mirrorTargets(reg.list());
  if (fit > 0) {
    // Blocks cleared and not yet swept still take room in the zones: as many
    // of them as this batch needs go first, before any live block is evicted.
    const incoming = storedIn(events);
    let over = incoming + mirror.unswept!() - fit;
    for (let i = 0; i < targets.length; i++) over += mirror.entries(targets[i]);
    if (over > 0) mirror.sweep!(over);
    makeRoom(mirror, targets, incoming + mirror.unswept!(), fit);
  }
  let res;
  try {
    res = applyBatch(mirror, w.epochKey, b.seq || 0, events, blockSize, {
      maxBlocks: maxBlocks,
      part: typeof b.part === "number" ? b.part : 0,
      partOf: typeof b.partOf === "number" ? b.partOf : 1,
    });
  } catch (e) {
    let held = mirror.unswept!();
    for (let i = 0; i < targets.length; i++) held += mirror.entries(targets[i]);
    const bound = Math.floor(held * 0.9);
    let note = "";
    try {
      forgetMirror(mirror, w.epochKey);
      if (bound > 0 && (fit === 0 || bound < fit)) st.incr(FIT_KEY, bound - fit);
      note = "; its mirror was dropped";
      if (st.num(FIT_KEY) > 0) note += ", and nginx now keeps at most " + st.num(FIT_KEY) + " blocks over all workers";
    } catch (e2) {
      /* the zones are too full even for that: the answer says no more */
    }
    zoneWarning(r, "kv events of " + w.id);
    return fail(
      r,
      507,
      "shared dict zone full: events of " + w.id + " not applied (" + String(e) + ")" + note,
      "insufficient_storage",
    );
  }
  const str = sh[STR_ZONE];
  if (typeof str.freeSpace === "function" && str.freeSpace() < str.capacity / 10)
    zoneWarning(r, "after events of " + w.id);
  // The router's exclude (core/router.ts): once, with the mirror dropped and a warning.
  if (res.fatal && reg.excluded(w.epochKey as EpochKey) === null) {
    reg.exclude(w.epochKey, res.fatal);
    clearAllTiers(mirror, w.epochKey);
    logHook(r)("warn", "worker " + w.id + " excluded: " + res.fatal, { worker: w.id });
  }
  r.headersOut["Content-Type"] = "application/json";
  // parts: this bundle checks a batch's parts in order, so the bridge may cut long batches (njs/bridge.ts).
  (res as ApplyResult & { parts?: boolean }).parts = true;
  r.return(200, JSON.stringify(res));
}

/**
 * js_content for the internal push location: a KV events batch or an engine
 * push applied here; a fleet push, which needs the router, handed to
 * infera.js (which checks it again).
 */
export function push(r: NjsRequest): void {
  const b = pushGate(r);
  if (!b) return;
  if (b.type === "workers") return r.internalRedirect(PUSH_ALL_LOCATION);
  applyPush(r, b);
}

export default { push: push };
