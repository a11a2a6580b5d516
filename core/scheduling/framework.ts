// The scheduling framework: a pick runs a profile = filters -> scorers -> picker
// over the fleet, after the Gateway API Inference Extension EPP's scheduler and
// Dynamo's lower-is-better scoring. Every scorer returns one term per candidate;
// a candidate's cost is the weighted sum of the terms, and the picker chooses.
// Plugins are plain objects registered by name (njs has no classes).
import { RouterState } from "../state/types";
import { produce } from "./data";
import { Candidate, EpochKey, Features, Guard, RouterConfig, SessionBinding, Worker } from "../types";
import { LatencyModel } from "../latency";
import { TwinEntry } from "../twin";
import { PrefillAdmission, Ticket } from "../admission";
import { Objective } from "../objectives";

export type ProfileName = "prefill" | "decode";

/** What one pick knows: the request, the fleet, the state, and what earlier stages found. */
export interface PickContext {
  features: Features;
  config: RouterConfig;
  state: RouterState;
  /** Every worker in the registry, for filters that look at the whole fleet (PD detection). */
  fleet: Worker[];
  /** The profile being run and whether the fleet is disaggregated. */
  profile: ProfileName;
  pd: boolean;
  /** The request's session and its binding (null when affinity is off or there is no session). */
  sessionId: string | null;
  session: SessionBinding | null;
  /** Rows of the profile that ran before this one (decode-demand reads the decode costs). */
  previous: Row[] | null;
  random: () => number;
  /** Per-profile-run memo shared by plugins (e.g. in-flight prefixes), cleared by runProfile. */
  cycle: { [key: string]: unknown };
  /** The workers' learned speeds (null: --speed-learning off) and the clock their observations use. */
  latency: LatencyModel | null;
  now: () => number;
}

/**
 * What the data stage (data.ts) found for one candidate, once per profile run
 * and before any scorer: every plugin after it reads these, none writes them,
 * so a scorer's weight (even 0) never changes what admission, shedding, the
 * load reservation or a tie-break sees.
 */
export interface CandidateData {
  /** Leading request blocks the worker holds: cached (tier-weighted) or in flight there, whichever is longer. 0 for image prefills. */
  hits: number;
  /** Leading request blocks in flight on the worker (prefill side with an overlap weight; else 0). */
  inflight: number;
  /** Leading request blocks its KV events report cached (tier-weighted), whatever is in flight. */
  cached: number;
  /** Of those, blocks still queued for prefill there. */
  queuedShared: number;
  /** The request's images the worker has seen (kv-aware image prefills). */
  imageHits: number;
  /** Distinct prompt blocks in flight on the worker. */
  active: number;
  /** Uncached blocks of requests routed there that have no first token yet. */
  pending: number;
  /** Requests holding load on the worker. */
  held: number;
  /** Time per unit of work against the fleet's median (core/latency.ts); 1 = typical or not yet learned. */
  slowness: number;
  /** The worker's KV cache capacity in blocks (its engine's /metrics or --kv-capacity-blocks; core/engine-readings.ts); null = unknown. */
  capacityBlocks: number | null;
  /** Share of its KV cache held by running requests, 0..1, as its engine last reported; null = unknown. */
  kvUsage: number | null;
  /** Requests queued in its engine, not yet scheduled, as last reported; null = unknown. */
  waitingRequests: number | null;
}

/** A candidate while it is scored. */
export interface Row {
  worker: Worker;
  cost: number;
  /** What logs, metrics and the admission gate call the worker's hits: image hits for image prefills, else data.hits. */
  hits: number;
  /** data.active. */
  active: number;
  data: CandidateData;
  /** Each scorer's raw term, by scorer name (before weighting). */
  terms: { [scorer: string]: number };
}

export interface Filter {
  name: string;
  /** Which profiles run it. */
  profiles: ProfileName[];
  filter(ctx: PickContext, workers: Worker[]): Worker[];
}

export interface Scorer {
  name: string;
  profiles: ProfileName[];
  /** The term's weight for this pick; 0 skips the scorer entirely. */
  weight(ctx: PickContext): number;
  /** One term per row, lower is better; reads the rows' data, writes nothing. */
  score(ctx: PickContext, rows: Row[]): number[];
}

export interface Picker {
  name: string;
  /** Index of the chosen row. */
  pick(ctx: PickContext, rows: Row[]): number;
}

/** Gives a guard's load back, once whatever the number of calls (Guard.done). */
export type Release = (g: Guard | null) => void;

/**
 * Request lifecycle hooks (the EPP's requestcontrol): after the pick, when the
 * response starts (first token), and when the request is over (EOF, reset,
 * cancel, error, or a pick never used). Each runs once per request.
 */
export interface LifecyclePlugin {
  name: string;
  preRequest?(ctx: PickContext, result: PickResult): void;
  firstToken?(result: PickResult, release: Release): void;
  /** A later chunk of the streamed response (after the first token): a step of the worker ended. */
  chunk?(result: PickResult, release: Release): void;
  complete?(result: PickResult, release: Release): void;
}

export interface PickResult {
  config: RouterConfig;
  prefill: Row;
  decode: Row | null;
  /** Load held for the request (filled by the load-reservation plugin). */
  guards: { prefill: Guard | null; main: Guard | null; queued: Guard | null };
  /** What the speed-learning plugin observes at the first token: null when it does not learn from this request. */
  timing: {
    model: LatencyModel;
    now: () => number;
    worker: EpochKey;
    tokens: number;
    running: number;
    /** Its own prefill's attention work (latency.ts attentionWork). */
    attention: number;
    /** Of tokens, other requests' queued prefill. */
    queued: number;
    start: number;
    /**
     * When the request leaves for its worker: takes the queued prefill ahead
     * from what is in the engine now and, after a wait at the router (`waited`),
     * reads its other inputs again (what it waited for is done by then).
     */
    refresh?: (waited: boolean) => void;
    /** Its own prefill tokens while counted in the model's inEngine (between leaving and the first token). */
    own?: number;
    /** The scheduler replica's entry for it (core/twin.ts), from when it left for its worker. */
    entry?: TwinEntry;
    /** What the replica predicted for its time to first token when it left (null: not learned yet). */
    predicted?: number | null;
  } | null;
  /** --pd-decider chose the decode worker to prefill too: no prefill hop, the prefill row only names the pool's pick. */
  decodeFirst?: boolean;
}

/** The row of the worker that computes the prompt: the decode pick on a decode-first path, else the prefill pick. */
export function prefillSide(result: PickResult): Row {
  return result.decodeFirst && result.decode ? result.decode : result.prefill;
}

/**
 * What the shedders and admitters see of a request once it is picked (the
 * EPP's admission stage): the pick's figures, the request's objective and
 * headers, the settings they read, and the admission queues. Plain data, so
 * the same plugins run for every adapter.
 */
export interface AdmissionContext {
  /** Where the request's prefill runs (the prefill worker under PD, else the target): admission queues per worker. */
  worker: string;
  /** Prompt tokens that worker must compute (Pick.uncachedTokens). */
  uncachedTokens: number;
  /** The target's pool as scored, cheapest first (the decode pool under PD). */
  pool: Candidate[];
  objective: Objective;
  /** A request header, lower-case name (the adapter has already removed the client's routing headers). */
  header(name: string): string | undefined;
  settings: AdmissionSettings;
  /** Prefill admission's per-worker slots and queues (core/admission.ts). */
  queue: PrefillAdmission;
  /** Request body bytes, for flow control's byte bounds. */
  bytes: number;
  /**
   * Late binding (--queue-late-binding): re-targets the waiting request to
   * another worker (its pick made again there); false = it cannot go there.
   * Absent: the request waits for the worker it was picked for.
   */
  move?: (worker: string) => boolean;
}

export interface AdmissionSettings {
  /** --epp-shed-active-blocks: 0 = off. */
  eppShedActiveBlocks: number;
  /** --epp-sheddable-objectives. */
  eppSheddableObjectives: string[];
}

/** A request refused before it is sent: the answer, and what the logs and counters say of it. */
export interface Refusal {
  status: number;
  message: string;
  /** The OpenAI-style error type. */
  type: string;
  headers?: { [name: string]: string };
  /** Why, for the log line (null: not logged). */
  log: string | null;
  /** Set when the refusal counts in infera_router_shed_total, under this priority band. */
  shedPriority?: number;
}

/** Refuses a picked request now (429 and the like), or lets it through (null). Runs before any admitter. */
export interface Shedder {
  name: string;
  shed(ctx: AdmissionContext): Refusal | null;
}

/**
 * Holds a picked request at the router until it may go: go() runs once, when
 * it may (before enter returns when at once); evicted() runs instead if a
 * request of a higher band takes its queue place. A ticket refused at once
 * has `refused` set. The ticket gives back what the request took, at its
 * first token or its end (leave), and lets the adapter's clock send it past
 * the wait bound (force) or take it out at its TTL (expire). Clock-free: the
 * adapter owns the timers.
 */
export interface Admitter {
  name: string;
  enter(ctx: AdmissionContext, go: () => void, evicted: () => void): Ticket;
  /**
   * Optional: true when enter() would let the request go at once holding
   * nothing (no slot, no queue place, nothing to give back), so the adapter
   * may skip entering it. Must agree with enter(); absent = always enter.
   */
  passes?(ctx: AdmissionContext): boolean;
  /**
   * Optional: true when enter() would admit the request at once (it may take
   * a slot, given back through its ticket), so the adapter may enter it
   * without preparing for a wait. Must agree with enter(); absent = unknown.
   */
  admitsNow?(ctx: AdmissionContext): boolean;
}

interface Registry {
  filters: Filter[];
  scorers: Scorer[];
  pickers: { [name: string]: Picker };
  lifecycle: LifecyclePlugin[];
  shedders: Shedder[];
  admitters: Admitter[];
}

const registry: Registry = { filters: [], scorers: [], pickers: {}, lifecycle: [], shedders: [], admitters: [] };

function replace<T extends { name: string }>(list: T[], p: T): void {
  for (let i = 0; i < list.length; i++)
    if (list[i].name === p.name) {
      list[i] = p;
      return;
    }
  list.push(p);
}

/** Registration: a plugin with the name of an existing one replaces it. */
export const register = {
  filter: (f: Filter) => replace(registry.filters, f),
  scorer: (s: Scorer) => replace(registry.scorers, s),
  picker: (p: Picker) => {
    registry.pickers[p.name] = p;
  },
  lifecycle: (l: LifecyclePlugin) => replace(registry.lifecycle, l),
  /** Shedders run in registration order; the first refusal answers. */
  shedder: (p: Shedder) => replace(registry.shedders, p),
  /** Admitters run in registration order, each once the one before has let the request go. */
  admitter: (p: Admitter) => replace(registry.admitters, p),
};

export function picker(name: string): Picker {
  const p = registry.pickers[name];
  if (!p) throw new Error("no picker registered as '" + name + "'");
  return timer ? timedPicker(p) : p;
}

export function lifecyclePlugins(): LifecyclePlugin[] {
  return timer ? timedLifecycle() : registry.lifecycle;
}

export function scorers(): Scorer[] {
  return registry.scorers;
}

/** Policy names (--router-policy), from the registered pickers. */
export function policyNames(): string[] {
  return Object.keys(registry.pickers);
}

/** Scorer names (--scorer-weights), from the registry. */
export function scorerNames(): string[] {
  const out: string[] = [];
  for (let i = 0; i < registry.scorers.length; i++) out.push(registry.scorers[i].name);
  return out;
}

/** What infera_router_plugin_duration_seconds{kind} calls a plugin. */
export type PluginKind = "filter" | "data" | "scorer" | "picker" | "lifecycle";

/**
 * Times every plugin run: now() in milliseconds and an observer of (kind,
 * plugin name, seconds). Core has no clock of its own, so the runtime sets one
 * (performance.now into a histogram); unset (njs, simulations, benches) the
 * pipeline runs untimed. One per process, like the registry.
 */
export interface PluginTimer {
  now: () => number;
  observe: (kind: PluginKind, plugin: string, seconds: number) => void;
}

let timer: PluginTimer | null = null;
/** Each picker's timed wrapper, with the registered picker it wraps (re-registration replaces it). */
let timedPickers: { [name: string]: { inner: Picker; timed: Picker } } = {};
/** The lifecycle plugins with timed hooks, and the registered ones they wrap. */
let timedHooks: { inner: LifecyclePlugin[]; timed: LifecyclePlugin[] } | null = null;

/** Sets (or with null clears) the process's plugin timer. */
export function setPluginTimer(t: PluginTimer | null): void {
  timer = t;
  timedPickers = {};
  timedHooks = null;
}

function timedPicker(p: Picker): Picker {
  const cached = timedPickers[p.name];
  if (cached && cached.inner === p) return cached.timed;
  const t = timer as PluginTimer;
  const w: Picker = {
    name: p.name,
    pick: function (ctx, rows) {
      const t0 = t.now();
      const i = p.pick(ctx, rows);
      t.observe("picker", p.name, (t.now() - t0) / 1000);
      return i;
    },
  };
  timedPickers[p.name] = { inner: p, timed: w };
  return w;
}

function timedHook<A, B>(t: PluginTimer, name: string, f: (a: A, b: B) => void): (a: A, b: B) => void {
  return function (a, b) {
    const t0 = t.now();
    try {
      f(a, b);
    } finally {
      t.observe("lifecycle", name, (t.now() - t0) / 1000);
    }
  };
}

/** The lifecycle plugins with each hook timed; rebuilt when the timer or the registered lifecycle plugins change. */
function timedLifecycle(): LifecyclePlugin[] {
  if (timedHooks && sameList(timedHooks.inner, registry.lifecycle)) return timedHooks.timed;
  const t = timer as PluginTimer;
  const out: LifecyclePlugin[] = [];
  for (let i = 0; i < registry.lifecycle.length; i++) {
    const l = registry.lifecycle[i];
    const w: LifecyclePlugin = { name: l.name };
    if (l.preRequest) w.preRequest = timedHook(t, l.name, l.preRequest);
    if (l.firstToken) w.firstToken = timedHook(t, l.name, l.firstToken);
    if (l.complete) w.complete = timedHook(t, l.name, l.complete);
    out.push(w);
  }
  timedHooks = { inner: registry.lifecycle.slice(), timed: out };
  return out;
}

export function shedders(): Shedder[] {
  return registry.shedders;
}

export function admitters(): Admitter[] {
  return registry.admitters;
}

function sameList<T>(a: T[], b: T[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Filters, then the data stage, then (kv-aware only: the other policies ignore
 * cost) every scorer of the profile with a non-zero weight; returns the scored rows.
 */
export function runProfile(ctx: PickContext): Row[] {
  ctx.cycle = {};
  const t = timer;
  let t0 = 0;
  let pool = ctx.fleet;
  for (let i = 0; i < registry.filters.length; i++) {
    const f = registry.filters[i];
    if (f.profiles.indexOf(ctx.profile) < 0) continue;
    if (t) t0 = t.now();
    pool = f.filter(ctx, pool);
    if (t) t.observe("filter", f.name, (t.now() - t0) / 1000);
  }
  if (t) t0 = t.now();
  const rows = produce(ctx, pool);
  if (t) t.observe("data", "candidate-data", (t.now() - t0) / 1000);
  if (!rows.length || ctx.config.policy !== "kv-aware") return rows;
  for (let i = 0; i < registry.scorers.length; i++) {
    const s = registry.scorers[i];
    if (s.profiles.indexOf(ctx.profile) < 0) continue;
    let w = s.weight(ctx);
    if (!(w > 0)) continue;
    const o = ctx.config.scorerWeights ? ctx.config.scorerWeights[s.name] : undefined;
    if (o !== undefined) w = o;
    if (!(w > 0)) continue;
    if (t) t0 = t.now();
    const terms = s.score(ctx, rows);
    if (t) t.observe("scorer", s.name, (t.now() - t0) / 1000);
    for (let j = 0; j < rows.length; j++) {
      rows[j].terms[s.name] = terms[j];
      rows[j].cost += w * terms[j];
    }
  }
  // Costs count work; a worker's learned slowness turns its work into time.
  for (let j = 0; j < rows.length; j++) rows[j].cost *= rows[j].data.slowness;
  return rows;
}

/** The overlap weight of a profile: per-role weights apply under PD only. */
export function overlapWeight(ctx: PickContext): number {
  const c = ctx.config;
  if (ctx.pd && ctx.profile === "prefill" && c.prefillOverlapWeight !== null) return c.prefillOverlapWeight;
  if (ctx.pd && ctx.profile === "decode" && c.decodeOverlapWeight !== null) return c.decodeOverlapWeight;
  return c.overlapWeight;
}

/** Image requests on the prefill side route by image affinity (kv-aware): their text blocks say nothing of the images. */
export function usesImageAffinity(ctx: PickContext): boolean {
  return ctx.profile === "prefill" && ctx.features.mediaHashes.length > 0 && ctx.config.policy === "kv-aware";
}

/** The request's n (choices); invalid n counts as 1. */
export function demandN(f: Features): number {
  return typeof f.n === "number" && f.n >= 1 && f.n % 1 === 0 ? f.n : 1;
}
