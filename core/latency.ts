// Each worker's speed, learned online from what the router already sees: a
// request's time from dispatch to its first token, against the prefill work
// ahead of it on that worker (prefill queued there at dispatch plus its own
// uncached tokens) and the requests already running there. No sidecar, no
// training service, no assumption that workers share a shape.
//
// Two levels, because one worker's first handful of requests cannot pin a
// line down: a fleet-wide exponentially weighted least-squares line
// ttft = base + perToken * tokens + perRunning * running, fitted on every
// worker's observations, and per worker one factor, its observed times over
// what the fleet line predicts for the same requests, shrunk toward 1 by a
// pseudo-observation. A worker's prediction is its factor times the
// fleet line.
//
// The router's costs count work in blocks; slowness() turns work into time:
// a worker's factor over the median factor of the candidates. Until a worker
// has minSamples observations it counts as typical (1), so a cold start is
// today's block cost; inside the dead band around 1 it is 1 too, so a uniform
// fleet's picks do not wobble with noise.
// ES5-safe: njs bundles this file.
import { EpochKey } from "./types";

export interface LatencyModel {
  /**
   * One request's first token: the tokens of prefill work it waited for (its
   * own included), the requests running on the worker when it was sent, and
   * the time it took.
   */
  observe(ek: EpochKey, tokens: number, running: number, ms: number): void;
  /** Predicted time to first token; null before minSamples observations. */
  predict(ek: EpochKey, tokens: number, running: number): number | null;
  /** Learned milliseconds per prefill token; null before minSamples observations. */
  msPerToken(ek: EpochKey): number | null;
  /** Time per unit of work relative to the fleet median, per worker (1 = typical, unknown or within the dead band). */
  slowness(eks: EpochKey[]): { [ek: string]: number };
  samples(ek: EpochKey): number;
  forget(ek: EpochKey): void;
}

export interface LatencyOptions {
  /** Observations after which an old one weighs half. */
  halfLife: number;
  /** Observations before a worker's own line is used. */
  minSamples: number;
  /** Ratios within [1/band, band] of the median count as 1. */
  band: number;
}

export function defaultLatencyOptions(): LatencyOptions {
  return { halfLife: 64, minSamples: 3, band: 1.35 };
}

/** Exponentially weighted sums of the normal equations for ms = base + perToken * tokens + perRunning * running. */
interface Fit {
  n: number;
  w: number;
  t: number;
  r: number;
  tt: number;
  tr: number;
  rr: number;
  y: number;
  ty: number;
  ry: number;
}

interface Line {
  base: number;
  perToken: number;
  perRunning: number;
}

function det3(a: number[]): number {
  return a[0] * (a[4] * a[8] - a[5] * a[7]) - a[1] * (a[3] * a[8] - a[5] * a[6]) + a[2] * (a[3] * a[7] - a[4] * a[6]);
}

/**
 * The least-squares line, falling back to fewer terms where the data cannot
 * tell them apart or a term comes out negative: without running requests, then
 * through the origin (every prompt alike has no slope of its own).
 */
function solve(f: Fit): Line {
  const m = [f.w, f.t, f.r, f.t, f.tt, f.tr, f.r, f.tr, f.rr];
  const d = det3(m);
  if (Math.abs(d) > 1e-9 * f.w * f.tt * (f.rr + 1)) {
    const b = det3([f.y, f.t, f.r, f.ty, f.tt, f.tr, f.ry, f.tr, f.rr]) / d;
    const a = det3([f.w, f.y, f.r, f.t, f.ty, f.tr, f.r, f.ry, f.rr]) / d;
    const c = det3([f.w, f.t, f.y, f.t, f.tt, f.ty, f.r, f.tr, f.ry]) / d;
    if (a > 0 && b >= 0 && c >= 0) return { base: b, perToken: a, perRunning: c };
  }
  const den = f.w * f.tt - f.t * f.t;
  if (den > 1e-9 * f.w * f.tt) {
    const a = (f.w * f.ty - f.t * f.y) / den;
    const b = (f.y - a * f.t) / f.w;
    if (a > 0 && b >= 0) return { base: b, perToken: a, perRunning: 0 };
  }
  return { base: 0, perToken: f.t > 0 ? f.y / f.t : 0, perRunning: 0 };
}

/** One worker's exponentially weighted sums: enough to price its requests on any fleet line, since the line is linear. */
interface Factor {
  n: number;
  w: number;
  t: number;
  r: number;
  y: number;
}

/** onObserve: each observation with what the model predicted for it beforehand (null: not learned yet). */
export function latencyModel(
  opts?: LatencyOptions,
  onObserve?: (ek: EpochKey, predicted: number | null, ms: number) => void,
): LatencyModel {
  const o = opts || defaultLatencyOptions();
  const decay = Math.pow(0.5, 1 / o.halfLife);
  // A pseudo-observation at factor 1 that a worker's own data must outweigh.
  const PRIOR = 1;
  const fleet: Fit = { n: 0, w: 0, t: 0, r: 0, tt: 0, tr: 0, rr: 0, y: 0, ty: 0, ry: 0 };
  const workers: { [ek: string]: Factor } = {};
  let line: Line | null = null;

  function at(l: Line, tokens: number, running: number): number {
    return l.base + l.perToken * tokens + l.perRunning * running;
  }

  // The worker's observed time over what today's fleet line predicts for the same requests.
  function factor(ek: string): number | null {
    const f = workers[ek];
    if (!f || f.n < o.minSamples || !line) return null;
    const predicted = line.base * f.w + line.perToken * f.t + line.perRunning * f.r;
    if (!(predicted > 0)) return null;
    const prior = (PRIOR * predicted) / f.w;
    return (f.y + prior) / (predicted + prior);
  }

  function predict(ek: EpochKey, tokens: number, running: number): number | null {
    const k = factor(ek);
    return k === null || !line ? null : k * at(line, tokens, running);
  }

  return {
    observe(ek, tokens, running, ms) {
      if (!(ms >= 0 && tokens >= 0 && running >= 0) || !isFinite(ms) || !isFinite(tokens) || !isFinite(running)) return;
      if (onObserve) onObserve(ek, predict(ek, tokens, running), ms);
      fleet.n++;
      fleet.w = fleet.w * decay + 1;
      fleet.t = fleet.t * decay + tokens;
      fleet.r = fleet.r * decay + running;
      fleet.tt = fleet.tt * decay + tokens * tokens;
      fleet.tr = fleet.tr * decay + tokens * running;
      fleet.rr = fleet.rr * decay + running * running;
      fleet.y = fleet.y * decay + ms;
      fleet.ty = fleet.ty * decay + tokens * ms;
      fleet.ry = fleet.ry * decay + running * ms;
      line = solve(fleet);
      let f = workers[ek];
      if (!f) f = workers[ek] = { n: 0, w: 0, t: 0, r: 0, y: 0 };
      f.n++;
      f.w = f.w * decay + 1;
      f.t = f.t * decay + tokens;
      f.r = f.r * decay + running;
      f.y = f.y * decay + ms;
    },
    predict: predict,
    msPerToken(ek) {
      const k = factor(ek);
      return k === null || !line ? null : k * line.perToken;
    },
    slowness(eks) {
      const out: { [ek: string]: number } = {};
      const known: number[] = [];
      const ks: { [ek: string]: number } = {};
      for (let i = 0; i < eks.length; i++) {
        out[eks[i]] = 1;
        const k = factor(eks[i]);
        if (k !== null && k > 0) {
          ks[eks[i]] = k;
          known.push(k);
        }
      }
      if (known.length < 2) return out;
      known.sort(function (a, b) {
        return a - b;
      });
      const mid =
        known.length % 2 ? known[(known.length - 1) / 2] : (known[known.length / 2 - 1] + known[known.length / 2]) / 2;
      for (const ek in ks) {
        const r = ks[ek] / mid;
        out[ek] = r > o.band || r < 1 / o.band ? r : 1;
      }
      return out;
    },
    samples(ek) {
      return workers[ek] ? workers[ek].n : 0;
    },
    forget(ek) {
      delete workers[ek];
    },
  };
}
