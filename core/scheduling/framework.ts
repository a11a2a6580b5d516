// The scheduling framework: a pick runs a profile = filters -> scorers -> picker
// over the fleet, after the Gateway API Inference Extension EPP's scheduler and
// Dynamo's lower-is-better scoring. Every scorer returns one term per candidate;
// a candidate's cost is the weighted sum of the terms, and the picker chooses.
// Plugins are plain objects registered by name (njs has no classes).
import { RouterState } from "../state/types";
import { EpochKey, Features, Guard, RouterConfig, SessionBinding, Worker } from "../types";

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
}

/** A candidate while it is scored. Scorers may fill hits/active for logs and metrics. */
export interface Row {
  worker: Worker;
  cost: number;
  hits: number;
  active: number;
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
  /** One term per row, lower is better. */
  score(ctx: PickContext, rows: Row[], weight: number): number[];
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
  complete?(result: PickResult, release: Release): void;
}

export interface PickResult {
  config: RouterConfig;
  prefill: Row;
  decode: Row | null;
  /** Load held for the request (filled by the load-reservation plugin). */
  guards: { prefill: Guard | null; main: Guard | null; queued: Guard | null };
}

interface Registry {
  filters: Filter[];
  scorers: Scorer[];
  pickers: { [name: string]: Picker };
  lifecycle: LifecyclePlugin[];
}

const registry: Registry = { filters: [], scorers: [], pickers: {}, lifecycle: [] };

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
};

export function picker(name: string): Picker {
  const p = registry.pickers[name];
  if (!p) throw new Error("no picker registered as '" + name + "'");
  return p;
}

export function lifecyclePlugins(): LifecyclePlugin[] {
  return registry.lifecycle;
}

export function scorers(): Scorer[] {
  return registry.scorers;
}

/** Filters, then every scorer of the profile with a non-zero weight; returns the scored rows. */
export function runProfile(ctx: PickContext): Row[] {
  ctx.cycle = {};
  let pool = ctx.fleet;
  for (let i = 0; i < registry.filters.length; i++) {
    const f = registry.filters[i];
    if (f.profiles.indexOf(ctx.profile) >= 0) pool = f.filter(ctx, pool);
  }
  const rows: Row[] = [];
  for (let i = 0; i < pool.length; i++) rows.push({ worker: pool[i], cost: 0, hits: 0, active: 0, terms: {} });
  if (!rows.length) return rows;
  for (let i = 0; i < registry.scorers.length; i++) {
    const s = registry.scorers[i];
    if (s.profiles.indexOf(ctx.profile) < 0) continue;
    let w = s.weight(ctx);
    if (!(w > 0)) continue;
    const o = ctx.config.scorerWeights ? ctx.config.scorerWeights[s.name] : undefined;
    if (o !== undefined) w = o;
    if (!(w > 0)) continue;
    const terms = s.score(ctx, rows, w);
    for (let j = 0; j < rows.length; j++) {
      rows[j].terms[s.name] = terms[j];
      rows[j].cost += w * terms[j];
    }
  }
  return rows;
}

/**
 * Leading request blocks in flight on each row's worker, computed once per
 * profile run. Prefill side only: a decode worker's cache is what was
 * transferred to it and reported, and decode load stays whole. With overlap
 * weight 0 (pure load balance) nothing is shared either.
 */
export function inflightPrefix(ctx: PickContext, rows: Row[]): { [epochKey: string]: number } {
  const memo = ctx.cycle.inflight as { [epochKey: string]: number } | undefined;
  if (memo) return memo;
  const eks: EpochKey[] = [];
  for (let i = 0; i < rows.length; i++) eks.push(rows[i].worker.epochKey);
  const out = ctx.features.blocks.length && ctx.profile === "prefill" && overlapWeight(ctx) > 0 ? ctx.state.load.activePrefix(ctx.features.blocks, eks) : {};
  ctx.cycle.inflight = out;
  return out;
}

/**
 * For each row's worker, how many of the request's in-flight leading blocks
 * (inflightPrefix) are still queued for prefill there, computed once per
 * profile run for queued-prefill and queued-shared.
 */
export function queuedSharedBlocks(ctx: PickContext, rows: Row[]): { [epochKey: string]: number } {
  const memo = ctx.cycle.queuedShared as { [epochKey: string]: number } | undefined;
  if (memo) return memo;
  const out = ctx.features.blocks.length ? ctx.state.load.queuedShared(ctx.features.blocks, inflightPrefix(ctx, rows)) : {};
  ctx.cycle.queuedShared = out;
  return out;
}

/** The overlap weight of a profile: per-role weights apply under PD only. */
export function overlapWeight(ctx: PickContext): number {
  const c = ctx.config;
  if (ctx.pd && ctx.profile === "prefill" && c.prefillOverlapWeight !== null) return c.prefillOverlapWeight;
  if (ctx.pd && ctx.profile === "decode" && c.decodeOverlapWeight !== null) return c.decodeOverlapWeight;
  return c.overlapWeight;
}
