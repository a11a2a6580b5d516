// Worker selection: kv-aware scoring, PD disaggregation, multimodal affinity,
// decode input-demand, session affinity, and the reservations that keep load
// accounting honest. All state lives in a Store so njs can share it.
import { Store } from "./store";
import { mirrorClear, mirrorCount, prefixHits } from "./mirror";
import { Features } from "./request";
import { httpError } from "./util";

export type Role = "prefill" | "decode" | "mixed";
export type Policy = "kv-aware" | "round-robin" | "random";
export type DemandMode = "off" | "shadow" | "on";

export interface WorkerSpec {
  id: string;
  /** host:port the gateway proxies to. */
  address: string;
  role: Role;
  /** Block size the worker reports; a mismatch with the router excludes it. */
  blockSize?: number;
  /** KV event endpoint (zmq tcp://… or a NATS subject). */
  events?: string;
}

export interface Worker extends WorkerSpec {
  /** Epoch key "id#n": new on every join, so late releases never touch a recreated entry. */
  ek: string;
}

export interface RouterConfig {
  policy: Policy;
  blockSize: number;
  overlapWeight: number;
  prefillOverlapWeight: number | null;
  decodeOverlapWeight: number | null;
  decodeInputDemand: DemandMode;
  decodeRequestWeight: number;
  sessionAffinity: "off" | "prefill" | "both";
  pdPrefillGuardRelease: "first-token" | "completion";
  mmLruSize: number;
}

export function defaultConfig(): RouterConfig {
  return {
    policy: "kv-aware",
    blockSize: 16,
    overlapWeight: 1,
    prefillOverlapWeight: null,
    decodeOverlapWeight: null,
    decodeInputDemand: "off",
    decodeRequestWeight: 0,
    sessionAffinity: "off",
    pdPrefillGuardRelease: "first-token",
    mmLruSize: 256,
  };
}

/** Throws with a message naming the flag when the combination cannot work. */
export function validateConfig(c: RouterConfig): void {
  if (!(c.blockSize >= 1 && c.blockSize % 1 === 0)) throw new Error("--block-size must be a positive integer");
  if (!(c.overlapWeight >= 0)) throw new Error("--kv-overlap-weight must be >= 0");
  if (c.decodeInputDemand !== "off" && c.policy !== "kv-aware")
    throw new Error("--decode-input-demand " + c.decodeInputDemand + " needs --router-policy kv-aware (got " + c.policy + ")");
  if (!(c.decodeRequestWeight >= 0)) throw new Error("--decode-request-weight must be >= 0");
}

export interface Candidate {
  id: string;
  cost: number;
  hits: number;
  active: number;
}

/** What one held piece of load is made of; released exactly once. Plain data, so njs can keep it in a shared dict between phases. */
export interface Guard {
  ek: string;
  blocks: string[];
  tokens: number;
  requests: number;
  done: boolean;
}

export interface Reservation {
  /** Response started streaming (first token): releases prefill load unless held to completion. */
  firstToken(): void;
  /** Response EOF, cancellation, failure, or a pick that was never used. Idempotent. */
  finish(): void;
  readonly open: boolean;
  /** The held guards (prefill is null outside PD), for callers that release across VMs. */
  guards(): { prefill: Guard | null; main: Guard };
}

export interface Pick {
  target: Worker;
  prefill: Worker | null;
  reservation: Reservation;
  candidates: Candidate[];
  decodeCandidates: Candidate[] | null;
  mmImages: number;
  mmAffinityHits: number;
}

export interface DemandDecision {
  mode: DemandMode;
  input: "exact" | "estimate";
  original: string;
  suggestion: string;
  actual: string;
  agrees: boolean;
  candidates: { id: string; demand: number; originalCost: number }[];
}

export interface RouterHooks {
  log?: (level: "info" | "debug" | "warn", line: string) => void;
  onPick?: (role: string, p: { worker: string; hits: number; blocks: number; policy: Policy }) => void;
  onDemand?: (d: DemandDecision) => void;
  random?: () => number;
}

const WL = "WL";

export interface Router {
  readonly config: RouterConfig;
  setWorkers(list: WorkerSpec[]): void;
  addWorker(w: WorkerSpec): Worker;
  removeWorker(id: string): boolean;
  /** Keeps the worker listed but out of every pool (e.g. block size mismatch seen in its events). */
  exclude(id: string, reason: string): void;
  excluded(id: string): string | null;
  /** Health-check result: unhealthy workers stay listed but get no picks. */
  setHealthy(id: string, ok: boolean): void;
  healthy(id: string): boolean;
  workers(): Worker[];
  worker(id: string): Worker | null;
  pick(f: Features, sessionId?: string | null): Pick;
  cacheView(id: string): { worker_id: string; block_count: number } | null;
  activeBlocks(id: string): number;
  demand(id: string): { tokens: number; requests: number };
  /** Releases a guard rebuilt from its data (njs: popped from a shared dict, so once). */
  releaseGuard(g: Guard): void;
  /** Guards (prefill or decode load) still held. */
  openGuards(): number;
}

export function createRouter(st: Store, cfg: RouterConfig, hooks?: RouterHooks): Router {
  validateConfig(cfg);
  const hk = hooks || {};
  const log = hk.log || (() => undefined);
  const rnd = hk.random || Math.random;
  let cache: Worker[] | null = null;
  let cacheVer = -1;

  function workers(): Worker[] {
    const v = st.num("WV");
    if (cache && v === cacheVer) return cache;
    const raw = st.get(WL);
    cache = raw ? (JSON.parse(raw) as Worker[]) : [];
    cacheVer = v;
    return cache;
  }

  function save(list: Worker[]): void {
    st.set(WL, JSON.stringify(list));
    st.incr("WV", 1);
  }

  function addWorker(spec: WorkerSpec): Worker {
    const list = workers().slice();
    for (let i = 0; i < list.length; i++) {
      const o = list[i];
      if (o.id === spec.id) {
        if (o.address === spec.address && o.role === spec.role && o.events === spec.events && o.blockSize === spec.blockSize) return o;
        removeWorker(spec.id);
        return addWorker(spec);
      }
    }
    const w: Worker = {
      id: spec.id,
      address: spec.address,
      role: spec.role || "mixed",
      blockSize: spec.blockSize,
      events: spec.events,
      ek: spec.id + "#" + st.incr("EP", 1),
    };
    if (w.blockSize !== undefined && w.blockSize !== cfg.blockSize)
      log("warn", "worker " + w.id + " excluded: block size " + w.blockSize + " != router --block-size " + cfg.blockSize);
    list.push(w);
    save(list);
    return w;
  }

  function removeWorker(id: string): boolean {
    const list = workers();
    const keep: Worker[] = [];
    let gone: Worker | null = null;
    for (let i = 0; i < list.length; i++) {
      if (list[i].id === id) gone = list[i];
      else keep.push(list[i]);
    }
    if (!gone) return false;
    save(keep);
    // Cache contents go with the worker; in-flight reservations keep their own
    // epoch key and drain into counters nobody else reads.
    mirrorClear(st, gone.ek);
    st.del("I:" + gone.ek);
    st.del("X:" + gone.ek);
    st.del("H:" + gone.ek);
    st.del("MS:" + gone.ek);
    return true;
  }

  function setWorkers(specs: WorkerSpec[]): void {
    const want: { [id: string]: boolean } = {};
    for (let i = 0; i < specs.length; i++) want[specs[i].id] = true;
    const cur = workers();
    for (let i = 0; i < cur.length; i++) if (!want[cur[i].id]) removeWorker(cur[i].id);
    for (let i = 0; i < specs.length; i++) addWorker(specs[i]);
  }

  function worker(id: string): Worker | null {
    const list = workers();
    for (let i = 0; i < list.length; i++) if (list[i].id === id) return list[i];
    return null;
  }

  function usable(w: Worker): boolean {
    return (w.blockSize === undefined || w.blockSize === cfg.blockSize) && st.get("X:" + w.ek) === undefined && st.get("H:" + w.ek) === undefined;
  }

  function setHealthy(id: string, ok: boolean): void {
    const w = worker(id);
    if (!w) return;
    const was = st.get("H:" + w.ek) === undefined;
    if (ok === was) return;
    if (ok) st.del("H:" + w.ek);
    else st.set("H:" + w.ek, "down");
    log(ok ? "info" : "warn", "worker " + id + (ok ? " healthy again" : " failed health checks: out of every pool"));
  }

  function exclude(id: string, reason: string): void {
    const w = worker(id);
    if (!w || st.get("X:" + w.ek) !== undefined) return;
    st.set("X:" + w.ek, reason);
    mirrorClear(st, w.ek);
    log("warn", "worker " + id + " excluded: " + reason);
  }

  function pools(): { prefill: Worker[]; decode: Worker[]; pd: boolean } {
    const list = workers();
    const p: Worker[] = [];
    const d: Worker[] = [];
    const m: Worker[] = [];
    for (let i = 0; i < list.length; i++) {
      const w = list[i];
      if (!usable(w)) continue;
      if (w.role === "prefill") p.push(w);
      else if (w.role === "decode") d.push(w);
      else m.push(w);
    }
    // PD needs both pools; mixed workers can serve either side.
    if (p.length && d.length) return { prefill: p.concat(m), decode: d.concat(m), pd: true };
    return { prefill: list.filter(usable), decode: [], pd: false };
  }

  function active(ek: string): number {
    return st.num("AC:" + ek);
  }

  // ---- image affinity (per-worker LRU of media hashes, most recent last) ----
  function lru(ek: string): string[] {
    const raw = st.get("I:" + ek);
    return raw ? raw.split(",") : [];
  }

  function touchImages(ek: string, hashes: string[]): void {
    let cur = lru(ek);
    for (let i = 0; i < hashes.length; i++) {
      const keep: string[] = [];
      for (let j = 0; j < cur.length; j++) if (cur[j] !== hashes[i]) keep.push(cur[j]);
      keep.push(hashes[i]);
      cur = keep;
    }
    if (cur.length > cfg.mmLruSize) cur = cur.slice(cur.length - cfg.mmLruSize);
    st.set("I:" + ek, cur.join(","));
  }

  function imageHits(ek: string, hashes: string[]): number {
    const have: { [h: string]: boolean } = {};
    const cur = lru(ek);
    for (let i = 0; i < cur.length; i++) have[cur[i]] = true;
    let n = 0;
    for (let i = 0; i < hashes.length; i++) if (have[hashes[i]]) n++;
    return n;
  }

  // ---- scoring ----
  function score(pool: Worker[], f: Features, weight: number, useMedia: boolean): Candidate[] {
    const out: Candidate[] = [];
    const nb = f.blocks.length;
    if (useMedia) {
      // Text overlap is meaningless for media prompts; image hits stand in for it,
      // scaled so a full hit is worth as much as a fully cached prompt.
      const ni = f.mediaHashes.length;
      const unit = Math.max(1, nb / ni);
      for (let i = 0; i < pool.length; i++) {
        const w = pool[i];
        const h = imageHits(w.ek, f.mediaHashes);
        const a = active(w.ek);
        out.push({ id: w.id, cost: weight * (ni - h) * unit + a, hits: h, active: a });
      }
      return out;
    }
    const live: { [ek: string]: boolean } = {};
    for (let i = 0; i < pool.length; i++) live[pool[i].ek] = true;
    const hits = nb && weight > 0 ? prefixHits(st, f.blocks, live) : {};
    for (let i = 0; i < pool.length; i++) {
      const w = pool[i];
      const h = hits[w.ek] || 0;
      const a = active(w.ek);
      out.push({ id: w.id, cost: weight * (nb - h) + a, hits: h, active: a });
    }
    return out;
  }

  // Lowest cost; ties: fewer active blocks, fewer cached blocks (spreads cold
  // prompts), then candidate order. Deterministic for a given state.
  function best(pool: Worker[], cands: Candidate[]): number {
    let bi = 0;
    let bc = 0;
    for (let i = 0; i < cands.length; i++) {
      const c = cands[i];
      const cc = mirrorCount(st, pool[i].ek);
      if (i === 0) {
        bc = cc;
        continue;
      }
      const b = cands[bi];
      if (c.cost < b.cost || (c.cost === b.cost && (c.active < b.active || (c.active === b.active && cc < bc)))) {
        bi = i;
        bc = cc;
      }
    }
    return bi;
  }

  function choose(pool: Worker[], cands: Candidate[]): number {
    if (cfg.policy === "round-robin") return (st.incr("RR", 1) - 1) % pool.length;
    if (cfg.policy === "random") return Math.min(pool.length - 1, Math.floor(rnd() * pool.length));
    return best(pool, cands);
  }

  function weightFor(role: "prefill" | "decode", pd: boolean): number {
    if (pd && role === "prefill" && cfg.prefillOverlapWeight !== null) return cfg.prefillOverlapWeight;
    if (pd && role === "decode" && cfg.decodeOverlapWeight !== null) return cfg.decodeOverlapWeight;
    return cfg.overlapWeight;
  }

  // ---- sessions ----
  function session(sid: string | null | undefined): { p?: string; d?: string } | null {
    if (!sid || cfg.sessionAffinity === "off") return null;
    const raw = st.get("S:" + sid);
    return raw ? JSON.parse(raw) : {};
  }

  // Session bindings are bounded: past MAX_SESSIONS the table starts over
  // (a session then simply picks afresh), so memory cannot grow without end.
  const MAX_SESSIONS = 100000;
  function bind(sid: string, s: { p?: string; d?: string }): void {
    if (st.get("S:" + sid) === undefined && st.incr("SN", 1) > MAX_SESSIONS) {
      const all = st.keys("S:");
      for (let i = 0; i < all.length; i++) st.del(all[i]);
      st.delNum("SN");
      st.incr("SN", 1);
    }
    st.set("S:" + sid, JSON.stringify(s));
  }

  function indexOfEk(pool: Worker[], ek: string | undefined): number {
    if (!ek) return -1;
    for (let i = 0; i < pool.length; i++) if (pool[i].ek === ek) return i;
    return -1;
  }

  // ---- reservations ----
  function hold(ek: string, blocks: string[], tokens: number, requests: number): Guard {
    for (let i = 0; i < blocks.length; i++) if (st.incr("A:" + ek + ":" + blocks[i], 1) === 1) st.incr("AC:" + ek, 1);
    if (tokens) st.incr("DT:" + ek, tokens);
    if (requests) st.incr("DR:" + ek, requests);
    st.incr("OPEN", 1);
    return { ek, blocks, tokens, requests, done: false };
  }

  function release(g: Guard | null): void {
    if (!g || g.done) return;
    g.done = true;
    try {
      for (let i = 0; i < g.blocks.length; i++) {
        const k = "A:" + g.ek + ":" + g.blocks[i];
        if (st.incr(k, -1) <= 0) {
          st.delNum(k);
          if (st.incr("AC:" + g.ek, -1) <= 0) st.delNum("AC:" + g.ek);
        }
      }
      if (g.tokens && st.incr("DT:" + g.ek, -g.tokens) <= 0) st.delNum("DT:" + g.ek);
      if (g.requests && st.incr("DR:" + g.ek, -g.requests) <= 0) st.delNum("DR:" + g.ek);
      st.incr("OPEN", -1);
    } catch (e) {
      // Release must never throw into a response path; the log says what broke.
      log("warn", "release failed for " + g.ek + ": " + String(e));
    }
  }

  function reservation(pre: Guard | null, main: Guard): Reservation {
    const r = {
      open: true,
      guards() {
        return { prefill: pre, main };
      },
      firstToken() {
        if (cfg.pdPrefillGuardRelease === "first-token") release(pre);
      },
      finish() {
        r.open = false;
        release(pre);
        release(main);
      },
    };
    return r;
  }

  function demandPick(pool: Worker[], cands: Candidate[], original: number, f: Features): number {
    const need = f.inputTokens * demandN(f);
    const rows: { id: string; demand: number; originalCost: number }[] = [];
    let bi = 0;
    for (let i = 0; i < pool.length; i++) {
      const ek = pool[i].ek;
      const d = st.num("DT:" + ek) + need + cfg.decodeRequestWeight * st.num("DR:" + ek);
      rows.push({ id: pool[i].id, demand: d, originalCost: cands[i].cost });
      const b = rows[bi];
      if (d < b.demand || (d === b.demand && cands[i].cost < b.originalCost)) bi = i;
    }
    const actual = cfg.decodeInputDemand === "on" ? bi : original;
    const dec: DemandDecision = {
      mode: cfg.decodeInputDemand,
      input: f.exact ? "exact" : "estimate",
      original: pool[original].id,
      suggestion: pool[bi].id,
      actual: pool[actual].id,
      agrees: bi === original,
      candidates: rows,
    };
    log(
      "debug",
      "decode-demand mode=" + dec.mode + " input=" + dec.input + " candidates=" +
        rows.map((r) => r.id + ":" + r.demand + "/" + r.originalCost).join(",") +
        " original=" + dec.original + " suggestion=" + dec.suggestion + " actual=" + dec.actual,
    );
    if (hk.onDemand) hk.onDemand(dec);
    return actual;
  }

  function pick(f: Features, sessionId?: string | null): Pick {
    const P = pools();
    if (!P.prefill.length) throw httpError(503, "no workers available", "service_unavailable");
    const sess = session(sessionId);
    const useMedia = f.mediaHashes.length > 0 && cfg.policy === "kv-aware";
    const wp = weightFor("prefill", P.pd);
    const cands = score(P.prefill, f, wp, useMedia);
    let pi = indexOfEk(P.prefill, sess ? sess.p : undefined);
    if (pi < 0) pi = choose(P.prefill, cands);
    const pw = P.prefill[pi];
    const mmHits = useMedia ? cands[pi].hits : 0;
    log(
      "info",
      "pick policy=" + cfg.policy + " role=prefill picked=" + pw.id + " mm_images=" + f.mediaHashes.length + " mm_affinity_hits=" + mmHits,
    );
    if (hk.onPick) hk.onPick("prefill", { worker: pw.id, hits: useMedia ? 0 : cands[pi].hits, blocks: f.blocks.length, policy: cfg.policy });
    if (f.mediaHashes.length) touchImages(pw.ek, f.mediaHashes);

    if (!P.pd) {
      if (sess && sessionId) bind(sessionId, { p: pw.ek });
      const g = hold(pw.ek, f.blocks, 0, 0);
      return { target: pw, prefill: null, reservation: reservation(null, g), candidates: cands, decodeCandidates: null, mmImages: f.mediaHashes.length, mmAffinityHits: mmHits };
    }

    // Decode side routes by text overlap (transferred KV) and load; media plays no part.
    const wd = weightFor("decode", true);
    const dc = score(P.decode, f, wd, false);
    let di = cfg.sessionAffinity === "both" ? indexOfEk(P.decode, sess ? sess.d : undefined) : -1;
    const bound = di >= 0;
    if (!bound) {
      di = choose(P.decode, dc);
      if (cfg.decodeInputDemand !== "off") di = demandPick(P.decode, dc, di, f);
    }
    const dw = P.decode[di];
    log("info", "pick policy=" + cfg.policy + " role=decode picked=" + dw.id + (bound ? " session=bound" : ""));
    if (hk.onPick) hk.onPick("decode", { worker: dw.id, hits: dc[di].hits, blocks: f.blocks.length, policy: cfg.policy });
    if (sess && sessionId) {
      const s: { p?: string; d?: string } = { p: pw.ek };
      if (cfg.sessionAffinity === "both") s.d = dw.ek;
      bind(sessionId, s);
    }
    const tokens = cfg.decodeInputDemand !== "off" ? f.inputTokens * demandN(f) : 0;
    const pg = hold(pw.ek, f.blocks, 0, 0);
    const dg = hold(dw.ek, f.blocks, tokens, cfg.decodeInputDemand !== "off" ? 1 : 0);
    return { target: dw, prefill: pw, reservation: reservation(pg, dg), candidates: cands, decodeCandidates: dc, mmImages: f.mediaHashes.length, mmAffinityHits: mmHits };
  }

  // Invalid n counts as 1.
  function demandN(f: Features): number {
    return typeof f.n === "number" && f.n >= 1 && f.n % 1 === 0 ? f.n : 1;
  }

  return {
    config: cfg,
    setWorkers,
    addWorker,
    removeWorker,
    exclude,
    setHealthy,
    healthy(id: string) {
      const w = worker(id);
      return !!w && st.get("H:" + w.ek) === undefined;
    },
    excluded(id: string) {
      const w = worker(id);
      return w ? st.get("X:" + w.ek) || null : null;
    },
    workers: () => workers().slice(),
    worker,
    pick,
    cacheView(id: string) {
      const w = worker(id);
      return w ? { worker_id: w.id, block_count: mirrorCount(st, w.ek) } : null;
    },
    activeBlocks(id: string) {
      const w = worker(id);
      return w ? active(w.ek) : 0;
    },
    demand(id: string) {
      const w = worker(id);
      return w ? { tokens: st.num("DT:" + w.ek), requests: st.num("DR:" + w.ek) } : { tokens: 0, requests: 0 };
    },
    releaseGuard: (g: Guard) => release({ ek: g.ek, blocks: g.blocks, tokens: g.tokens, requests: g.requests, done: false }),
    openGuards: () => st.num("OPEN"),
  };
}
