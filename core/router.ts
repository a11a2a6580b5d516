// The router: composes the scheduling pipeline (core/scheduling) over the
// router state (core/state) and keeps load accounting honest through
// reservations. Adapters (ext_proc, njs) talk to this interface only.
import { RouterState } from "./state/types";
import { decideDemand, DemandDecision } from "./scheduling/decode-demand";
import { decidePd, decodeFirstIndex, PdPath } from "./scheduling/pd-decider";
import { kvSource } from "./scheduling/kv-source";
import {
  prefillSide,
  lifecyclePlugins,
  PickContext,
  picker,
  PickResult,
  policyNames,
  ProfileName,
  Row,
  runProfile,
  scorerNames,
} from "./scheduling/framework";
import { boundRow } from "./scheduling/session";
import { isUsable } from "./scheduling/plugins/filter/usable";
import { sameWorker } from "./fleet";
import "./scheduling/plugins";
import { Candidate, Features, Guard, Policy, RouterConfig, Worker, WorkerSpec } from "./types";
import { httpError } from "./util";
import { clearAllTiers, defaultTierWeights, forgetMirror, tierCounts } from "./kvevents";
import { Reservation, reservations } from "./reservation";
import { LatencyModel, latencyModel, TimingInputs } from "./latency";
import { stepTwin } from "./twin";
import { LogFields, LogHook } from "./log";
import { engineReadings } from "./engine-readings";

export type { Reservation } from "./reservation";

export type { Candidate, DemandMode, Features, Guard, Policy, Role, RouterConfig, Worker, WorkerSpec } from "./types";
export type { DemandDecision } from "./scheduling/decode-demand";

/**
 * Uncached blocks cost 8 in-flight blocks by default (another request's
 * queued prefill half that: queued-prefill.ts). Against 4, the default
 * before, a conversation stays with the worker holding its history when
 * in-flight load elsewhere looks lighter; weight 1 let a momentarily busy
 * worker lose the prompts it caches. The comparison:
 * docs/benchmarks/2026-12-05-policy-sim.md#measurements-behind-the-defaults
 */
export const DEFAULT_OVERLAP_WEIGHT = 8;

export function defaultConfig(): RouterConfig {
  return {
    policy: "kv-aware",
    blockSize: 16,
    overlapWeight: DEFAULT_OVERLAP_WEIGHT,
    prefillOverlapWeight: null,
    decodeOverlapWeight: null,
    decodeInputDemand: "off",
    decodeRequestWeight: 0,
    sessionAffinity: "off",
    pdPrefillGuardRelease: "first-token",
    pdDecider: "off",
    pdDecodeFirstMaxUncachedTokens: 256,
    pdDecodeFirstMaxPromptTokens: 0,
    pdDecodeFirstMaxInterference: 0,
    kvSourceHint: "off",
    mmLruSize: 256,
    kvTierWeights: defaultTierWeights(),
    scorerWeights: {},
    speedLearning: "on",
    prefillTokenBudget: 8192,
  };
}

/** Names in a --scorer-weights value that no registered scorer has, as the problem naming the valid ones; null if none. */
export function unknownScorers(weights: { [name: string]: number } | null): string | null {
  const known = scorerNames();
  const bad: string[] = [];
  for (const k in weights || {}) if (known.indexOf(k) < 0) bad.push(k);
  return bad.length ? "unknown scorer " + bad.join(", ") + " (known: " + known.join(", ") + ")" : null;
}

/** Throws with a message naming the flag when the combination cannot work. */
export function validateConfig(c: RouterConfig): void {
  if (policyNames().indexOf(c.policy) < 0)
    throw new Error("--router-policy: unknown policy " + c.policy + " (known: " + policyNames().join(", ") + ")");
  const unknown = unknownScorers(c.scorerWeights);
  if (unknown) throw new Error("--scorer-weights: " + unknown);
  if (!(c.blockSize >= 1 && c.blockSize % 1 === 0)) throw new Error("--block-size must be a positive integer");
  if (!(c.overlapWeight >= 0)) throw new Error("--kv-overlap-weight must be >= 0");
  if (c.decodeInputDemand !== "off" && c.policy !== "kv-aware")
    throw new Error(
      "--decode-input-demand " + c.decodeInputDemand + " needs --router-policy kv-aware (got " + c.policy + ")",
    );
  if (!(c.decodeRequestWeight >= 0)) throw new Error("--decode-request-weight must be >= 0");
  for (const k in c.scorerWeights)
    if (!(c.scorerWeights[k] >= 0)) throw new Error("--scorer-weights " + k + " must be >= 0");
}

export interface Pick {
  target: Worker;
  prefill: Worker | null;
  reservation: Reservation;
  candidates: Candidate[];
  decodeCandidates: Candidate[] | null;
  mmImages: number;
  mmAffinityHits: number;
  /**
   * Prompt tokens the prefill worker must compute (what its cache and the
   * requests in flight there do not hold); the whole prompt for image
   * requests and for policies that do not read the cache.
   */
  uncachedTokens: number;
  /** Under PD with --pd-decider prefix: whether the request took the prefill hop; null otherwise. */
  pdPath: PdPath | null;
  /** --kv-source-hint: a worker holding more of the prompt than the target, to pull KV from; null otherwise. */
  kvSource: Worker | null;
  /** The request asked for a streamed answer (set by the runtime from the parsed body). */
  stream?: boolean;
  /** --send-token-ids: the prompt's token ids as the router computed them (set by the runtime), else unset. */
  promptIds?: ArrayLike<number>;
}

export interface RouterHooks {
  /** Milliseconds, for speed learning (default Date.now; a simulation passes its virtual clock). */
  now?: () => number;
  /** Structured log lines (core/log.ts): a stable message and its fields. */
  log?: LogHook;
  onPick?: (role: string, p: { worker: string; hits: number; blocks: number; policy: Policy }) => void;
  onDemand?: (d: DemandDecision) => void;
  /** A PD request's path as --pd-decider chose it. */
  onPdPath?: (path: PdPath) => void;
  /** A first token the speed model learned from: its prediction beforehand (null: not learned yet) and the time it took. */
  onTiming?: (worker: string, predictedMs: number | null, ms: number, inputs: TimingInputs) => void;
  random?: () => number;
}

export interface Router {
  readonly config: RouterConfig;
  readonly state: RouterState;
  /** The workers' learned speeds; null with --speed-learning off. */
  readonly latency: LatencyModel | null;
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
  /** allow: an optional candidate filter (e.g. the gateway's endpoint subset); nothing allowed = 503. */
  pick(f: Features, sessionId?: string | null, allow?: (w: Worker) => boolean): Pick;
  /** Holds a guard's load again on another worker (the gateway served the request elsewhere); null if unknown. */
  holdOn(id: string, g: Guard): Guard | null;
  /** block_count: GPU blocks (what a hit means); tiers: blocks per storage tier. */
  /** seq: the last KV event batch applied to the mirror (null before the first), so a caller can wait for a given batch. */
  cacheView(
    id: string,
  ): { worker_id: string; block_count: number; tiers: { [tier: string]: number }; seq: number | null } | null;
  activeBlocks(id: string): number;
  demand(id: string): { tokens: number; requests: number };
  /** Releases a guard rebuilt from its data (njs: popped from a shared dict, so once). */
  releaseGuard(g: Guard): void;
  /** Guards (prefill or decode load) still held. */
  openGuards(): number;
}

function candidates(rows: Row[]): Candidate[] {
  const out: Candidate[] = [];
  for (let i = 0; i < rows.length; i++)
    out.push({ id: rows[i].worker.id, cost: rows[i].cost, hits: rows[i].hits, active: rows[i].active });
  return out;
}

export function createRouter(state: RouterState, cfg: RouterConfig, hooks?: RouterHooks): Router {
  validateConfig(cfg);
  const hk = hooks || {};
  const log = hk.log || (() => undefined);
  const rnd = hk.random || Math.random;
  const reg = state.workers;
  if (!state.engine) state.engine = engineReadings();
  const held = reservations(state, log);
  const now = hk.now || Date.now;
  const onTiming = hk.onTiming;
  const latency =
    cfg.speedLearning === "on"
      ? latencyModel(
          undefined,
          onTiming
            ? function (ek, predicted, ms, inputs) {
                const ws = reg.list();
                for (let i = 0; i < ws.length; i++)
                  if (ws[i].epochKey === ek) onTiming(ws[i].id, predicted, ms, inputs);
              }
            : undefined,
          stepTwin({ budget: cfg.prefillTokenBudget || 8192, minSamples: 3 }),
        )
      : null;

  function addWorker(spec: WorkerSpec): Worker {
    const old = reg.get(spec.id);
    if (old) {
      if (sameWorker(old, spec)) return old;
      removeWorker(spec.id);
    }
    const w = reg.add(spec);
    if (w.blockSize !== undefined && w.blockSize !== cfg.blockSize)
      log(
        "warn",
        "worker " + w.id + " excluded: block size " + w.blockSize + " != router --block-size " + cfg.blockSize,
        { worker: w.id },
      );
    return w;
  }

  function removeWorker(id: string): boolean {
    const gone = reg.remove(id);
    if (!gone) return false;
    // Cache contents go with the worker; in-flight reservations keep their own
    // epoch key and drain into counters nobody else reads.
    forgetMirror(state.mirror, gone.epochKey);
    state.images.drop(gone.epochKey);
    if (latency) latency.forget(gone.epochKey);
    if (state.engine) state.engine.forget(gone.epochKey);
    reg.forget(gone.epochKey);
    return true;
  }

  function setWorkers(specs: WorkerSpec[]): void {
    const want: { [id: string]: boolean } = {};
    for (let i = 0; i < specs.length; i++) want[specs[i].id] = true;
    const cur = reg.list();
    for (let i = 0; i < cur.length; i++) if (!want[cur[i].id]) removeWorker(cur[i].id);
    for (let i = 0; i < specs.length; i++) addWorker(specs[i]);
  }

  function setHealthy(id: string, ok: boolean): void {
    const w = reg.get(id);
    if (!w || reg.healthy(w.epochKey) === ok) return;
    reg.setHealthy(w.epochKey, ok);
    log(ok ? "info" : "warn", "worker " + id + (ok ? " healthy again" : " failed health checks: out of every pool"), {
      worker: id,
    });
  }

  function exclude(id: string, reason: string): void {
    const w = reg.get(id);
    if (!w || reg.excluded(w.epochKey) !== null) return;
    reg.exclude(w.epochKey, reason);
    clearAllTiers(state.mirror, w.epochKey);
    log("warn", "worker " + id + " excluded: " + reason, { worker: id });
  }

  function context(f: Features, fleet: Worker[], pd: boolean, sessionId: string | null): PickContext {
    const session = sessionId && cfg.sessionAffinity !== "off" ? state.sessions.get(sessionId) || {} : null;
    return {
      features: f,
      config: cfg,
      state: state,
      fleet: fleet,
      profile: "prefill",
      pd: pd,
      sessionId: session ? sessionId : null,
      session: session,
      previous: null,
      random: rnd,
      cycle: {},
      latency: latency,
      now: now,
    };
  }

  function choose(ctx: PickContext, rows: Row[]): { index: number; bound: boolean } {
    const b = boundRow(ctx, rows);
    if (b >= 0) return { index: b, bound: true };
    return { index: picker(cfg.policy).pick(ctx, rows), bound: false };
  }

  function run(ctx: PickContext, profile: ProfileName): Row[] {
    ctx.profile = profile;
    return runProfile(ctx);
  }

  /** The prefill side of a pick, to the log and the onPick hook (a function of its own: no closure per pick). */
  function reportPrefill(row: Row, f: Features, media: boolean): void {
    // Per pick: debug, with fields (the request's logs say where it went at debug level).
    log("debug", "pick", {
      policy: cfg.policy,
      role: "prefill",
      picked: row.worker.id,
      mm_images: f.mediaHashes.length,
      mm_affinity_hits: media ? row.hits : 0,
    });
    if (hk.onPick)
      hk.onPick("prefill", {
        worker: row.worker.id,
        hits: media ? 0 : row.hits,
        blocks: f.blocks.length,
        policy: cfg.policy,
      });
  }

  function pick(f: Features, sessionId?: string | null, allow?: (w: Worker) => boolean): Pick {
    const fleet = allow ? reg.list().filter(allow) : reg.list();
    let hasPrefill = false;
    let hasDecode = false;
    for (let i = 0; i < fleet.length; i++) {
      if (!isUsable(fleet[i], cfg, state)) continue;
      if (fleet[i].role === "prefill") hasPrefill = true;
      else if (fleet[i].role === "decode") hasDecode = true;
    }
    const ctx = context(f, fleet, hasPrefill && hasDecode, sessionId || null);
    const prefillRows = run(ctx, "prefill");
    if (!prefillRows.length)
      throw httpError(503, "no workers available: " + whyNone(reg.list(), fleet), "service_unavailable");
    const prefillIndex = choose(ctx, prefillRows).index;
    const prefillWorker = prefillRows[prefillIndex].worker;
    const media = f.mediaHashes.length > 0 && cfg.policy === "kv-aware";
    const mmHits = media ? prefillRows[prefillIndex].hits : 0;
    // Reported once the worker that prefills is known (--pd-decider may move it to the decode pick).
    if (!ctx.pd) reportPrefill(prefillRows[prefillIndex], f, media);

    let decodeRows: Row[] | null = null;
    let decodeIndex = -1;
    let decodeFirst = false;
    let pdPath: PdPath | null = null;
    if (ctx.pd) {
      ctx.previous = prefillRows;
      decodeRows = run(ctx, "decode");
      const c = choose(ctx, decodeRows);
      decodeIndex = c.index;
      if (!c.bound && cfg.decodeInputDemand !== "off") {
        const d = decideDemand(ctx, decodeRows, decodeIndex);
        decodeIndex = d.index;
        const rowsTxt: string[] = [];
        for (let i = 0; i < d.decision.candidates.length; i++) {
          const r = d.decision.candidates[i];
          rowsTxt.push(r.id + ":" + r.demand + "/" + r.originalCost);
        }
        log("debug", "decode-demand", {
          mode: d.decision.mode,
          input: d.decision.input,
          candidates: rowsTxt.join(","),
          original: d.decision.original,
          suggestion: d.decision.suggestion,
          actual: d.decision.actual,
        });
        if (hk.onDemand) hk.onDemand(d.decision);
      }
      if (!c.bound) decodeIndex = decodeFirstIndex(cfg, f, decodeRows, decodeIndex);
      const decodeWorker = decodeRows[decodeIndex].worker;
      const pd = decidePd(cfg, f, decodeRows[decodeIndex]);
      decodeFirst = pd !== null && pd.path === "decode-first";
      pdPath = pd ? pd.path : null;
      reportPrefill(decodeFirst ? decodeRows[decodeIndex] : prefillRows[prefillIndex], f, media);
      if (pd) {
        log("debug", "pd-decider", {
          path: pd.path,
          uncached: pd.uncached,
          prompt: pd.prompt,
          running: pd.running,
          guarded: pd.guarded ? 1 : 0,
        });
        if (hk.onPdPath) hk.onPdPath(pd.path);
      }
      const fields: LogFields = { policy: cfg.policy, role: "decode", picked: decodeWorker.id };
      if (c.bound) fields.session = "bound";
      log("debug", "pick", fields);
      if (hk.onPick)
        hk.onPick("decode", {
          worker: decodeWorker.id,
          hits: decodeRows[decodeIndex].hits,
          blocks: f.blocks.length,
          policy: cfg.policy,
        });
    }

    const result: PickResult = {
      config: cfg,
      prefill: prefillRows[prefillIndex],
      decode: decodeRows ? decodeRows[decodeIndex] : null,
      guards: { prefill: null, main: null, queued: null },
      timing: null,
      decodeFirst: decodeFirst,
    };
    const plugins = lifecyclePlugins();
    for (let i = 0; i < plugins.length; i++) {
      const p = plugins[i];
      if (p.preRequest) p.preRequest(ctx, result);
    }
    return {
      target: result.decode ? result.decode.worker : prefillWorker,
      prefill: result.decode && !decodeFirst ? prefillWorker : null,
      reservation: held.open(result, plugins),
      candidates: candidates(prefillRows),
      decodeCandidates: decodeRows ? candidates(decodeRows) : null,
      mmImages: f.mediaHashes.length,
      mmAffinityHits: mmHits,
      uncachedTokens:
        cfg.policy === "kv-aware" && !media
          ? Math.max(0, f.inputTokens - prefillSide(result).data.hits * cfg.blockSize)
          : f.inputTokens,
      pdPath: pdPath,
      kvSource: ctx.pd ? null : kvSourceOf(prefillRows, prefillIndex, f.mediaHashes.length > 0),
    };
  }

  function kvSourceOf(rows: Row[], index: number, media: boolean): Worker | null {
    // Image requests: text hits do not say who holds the images' KV.
    if (cfg.kvSourceHint !== "on" || media) return null;
    const h = kvSource(rows, index);
    if (h < 0) return null;
    log("debug", "kv-source hint", {
      holder: rows[h].worker.id,
      holder_hits: rows[h].data.hits,
      picked: rows[index].worker.id,
      picked_hits: rows[index].data.hits,
    });
    return rows[h].worker;
  }

  /**
   * Why a pick found no candidate, for the 503's text: the operator reading it
   * (or the client's log) should know which of fleet, health, exclusion or the
   * request's own filters left nothing.
   */
  function whyNone(all: Worker[], fleet: Worker[]): string {
    if (!all.length) return "no worker yet (the fleet is empty: discovery has found none)";
    if (!fleet.length) return "none of the " + all.length + " known worker(s) is in the gateway's endpoint subset";
    let unhealthy = 0;
    let excluded = 0;
    let otherSize = 0;
    for (let i = 0; i < fleet.length; i++) {
      const w = fleet[i];
      if (w.blockSize !== undefined && w.blockSize !== cfg.blockSize) otherSize++;
      else if (reg.excluded(w.epochKey) !== null) excluded++;
      else if (!reg.healthy(w.epochKey)) unhealthy++;
    }
    if (unhealthy === fleet.length) return "no healthy worker (all " + fleet.length + " failed their health checks)";
    if (unhealthy + excluded + otherSize === fleet.length) {
      const parts: string[] = [];
      if (unhealthy) parts.push(unhealthy + " failed health checks");
      if (excluded) parts.push(excluded + " excluded (see /v1/admin/workers)");
      if (otherSize) parts.push(otherSize + " with a block size other than --block-size " + cfg.blockSize);
      return "no usable worker (of " + fleet.length + ": " + parts.join(", ") + ")";
    }
    return (
      "no worker passed this request's filters (model, role) among " +
      (fleet.length - unhealthy - excluded - otherSize) +
      " usable of " +
      fleet.length
    );
  }

  function byId<T>(id: string, f: (w: Worker) => T, none: T): T {
    const w = reg.get(id);
    return w ? f(w) : none;
  }

  return {
    config: cfg,
    state: state,
    latency: latency,
    setWorkers: setWorkers,
    addWorker: addWorker,
    removeWorker: removeWorker,
    exclude: exclude,
    setHealthy: setHealthy,
    healthy: (id) => byId(id, (w) => reg.healthy(w.epochKey), false),
    excluded: (id) => byId(id, (w) => reg.excluded(w.epochKey), null as string | null),
    workers: () => reg.list().slice(),
    worker: (id) => reg.get(id),
    pick: pick,
    cacheView: (id) =>
      byId(
        id,
        (w) => {
          const seq = state.mirror.sequence(w.epochKey);
          return {
            worker_id: w.id,
            block_count: state.mirror.count(w.epochKey),
            tiers: tierCounts(state.mirror, w.epochKey),
            seq: seq === undefined ? null : seq,
          };
        },
        null as {
          worker_id: string;
          block_count: number;
          tiers: { [tier: string]: number };
          seq: number | null;
        } | null,
      ),
    activeBlocks: (id) => byId(id, (w) => state.load.activeBlocks(w.epochKey), 0),
    demand: (id) => byId(id, (w) => state.load.demand(w.epochKey), { tokens: 0, requests: 0 }),
    holdOn: (id, g) =>
      byId(
        id,
        (w) =>
          (state.load.holdLike
            ? state.load.holdLike(w.epochKey, {
                epochKey: g.epochKey,
                blocks: g.blocks,
                tokens: g.tokens,
                requests: g.requests,
                pending: 0,
                done: false,
                at: g.at,
                n: g.n,
              })
            : state.load.hold(w.epochKey, g.blocks, g.tokens, g.requests)) as Guard | null,
        null,
      ),
    releaseGuard: (g) => held.releaseCopy(g),
    openGuards: () => state.load.openGuards(),
  };
}
