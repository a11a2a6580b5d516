// Each worker's speed, learned online from what the router already sees: a
// request's time from dispatch to its first token, against the prefill work
// ahead of it on that worker (prefill queued there at dispatch plus its own
// uncached tokens), the attention its own prefill does over its context, and
// the requests already running there. No sidecar, no training service, no
// assumption that workers share a shape.
//
// Two levels, because one worker's first handful of requests cannot pin a
// model down: a fleet-wide exponentially weighted least-squares fit
//   ttft = base + perToken * tokens + perAttention * attention + perRunning * running
// on every worker's observations (a term whose coefficient comes out negative
// is dropped and the rest refitted), and per worker one factor: the geometric
// mean of its observed times over what the fleet fit predicts for the same
// requests, over its last WINDOW observations, shrunk toward 1 by PRIOR
// pseudo-observations. A worker's prediction is its factor times the fleet fit.
//
// Why these choices (docs/benchmarks/2026-12-05-mixed-speed.md has the
// measurement): on a uniform fleet the first model (a line in tokens and
// running, a factor as the ratio of sums) read load and prompt mix as speed.
// Prefill attention grows with the square of a long prompt, so a worker whose
// conversations were long looked slow and one serving short cached turns looked
// fast; a ratio of sums let one long request swing a factor; and an unbounded
// factor below 1 pulled every request to the worker that looked fast. Now:
// the attention term fits long prompts; each observation's log ratio is
// clamped (one outlier moves a factor by at most a bounded step) and weighted
// down when the prediction is a few milliseconds (fixed overheads dominate
// it); and slowness() is bounded.
//
// The router's costs count work in blocks; slowness() turns work into time:
// a worker's factor over the median factor of the candidates. Until a worker
// has minSamples observations it counts as typical (1), so a cold start is
// today's block cost; inside the dead band around 1 it is 1 too, so a uniform
// fleet's picks do not wobble with noise.
// ES5-safe: njs bundles this file.
import { EpochKey } from "./types";
import { StepTwin, TwinEntry } from "./twin";

export interface LatencyModel {
  /**
   * One request's first token: the tokens of prefill work it waited for (its
   * own included), the requests running on the worker when it was sent, the
   * time it took, its own prefill's attention work (attentionWork(); 0 if
   * unknown), and of `tokens`, how many were other requests' queued prefill
   * (0 if unknown): the router counts those per request, so a document two
   * queued requests share counts twice and blocks half computed count whole,
   * and the fit learns what a queued token costs apart from an own one.
   */
  observe(
    ek: EpochKey,
    tokens: number,
    running: number,
    ms: number,
    attention?: number,
    queued?: number,
    predicted?: number | null,
    entry?: TwinEntry,
  ): void;
  /**
   * The replica of each worker's step scheduler (core/twin.ts) that predicts
   * a request's time to first token; null when not built. observe()'s
   * `predicted`, when given, is what it predicted at dispatch, reported to
   * onObserve in place of this model's own prediction.
   */
  readonly twin: StepTwin | null;
  /** Predicted time to first token; null before minSamples observations. */
  predict(ek: EpochKey, tokens: number, running: number, attention?: number, queued?: number): number | null;
  /** Learned milliseconds per prefill token; null before minSamples observations. */
  msPerToken(ek: EpochKey): number | null;
  /** Time per unit of work relative to the fleet median, per worker (1 = typical, unknown or within the dead band). */
  slowness(eks: EpochKey[]): { [ek: string]: number };
  samples(ek: EpochKey): number;
  forget(ek: EpochKey): void;
  /**
   * Prefill tokens sent to the worker whose first token has not come back:
   * what a request sent now queues behind in the engine. Requests still
   * waiting at the router (prefill admission) are not in it, unlike the load
   * ledger's pending blocks.
   */
  inEngine(ek: EpochKey): number;
  /** A request left for the worker with `tokens` of its own prefill (add), or reached its first token or ended (add -tokens). */
  sent(ek: EpochKey, tokens: number): void;
}

export interface LatencyOptions {
  /** Observations after which an old one weighs half in the fleet fit. */
  halfLife: number;
  /** Observations before a worker's own factor is used. */
  minSamples: number;
  /** Ratios within [1/band, band] of the median count as 1. */
  band: number;
}

export function defaultLatencyOptions(): LatencyOptions {
  return { halfLife: 64, minSamples: 3, band: 1.35 };
}

/**
 * A request's own prefill attention work: each of its `own` uncached tokens
 * attends to the `cached` tokens before it and, on average, half of its own.
 * In millions of token pairs.
 */
export function attentionWork(own: number, cached: number): number {
  return own > 0 ? (own * (cached + own / 2)) / 1e6 : 0;
}

/** Features in the fit: 1, thousands of own tokens, attention (attentionWork), running requests, thousands of queued tokens. */
const K = 5;
/** A worker's factor reads its last WINDOW observations. */
const WINDOW = 48;
/** Pseudo-observations at factor 1 that a worker's own data must outweigh. */
const PRIOR = 1;
/** One observation moves a factor's log by at most ln 4 / its weight. */
const MAX_LOG_RATIO = Math.log(4);
/** Predictions of a few milliseconds are mostly fixed overheads: they weigh pred / (pred + SMALL_MS). */
const SMALL_MS = 50;
/** Observations shorter than this weigh as if this long in the fit (timer and network jitter). */
const MIN_MS = 10;
/** slowness() stays within [1/MAX_SLOWNESS, MAX_SLOWNESS]. */
const MAX_SLOWNESS = 8;

function features(tokens: number, running: number, attention: number, queued: number): number[] {
  const q = queued > 0 ? Math.min(queued, tokens) : 0;
  return [1, (tokens - q) / 1000, attention, running, q / 1000];
}

/**
 * Least squares on the weighted normal equations (xx: K*K row-major, xy: K)
 * over the features in `use`; null when singular. Gaussian elimination with
 * partial pivoting.
 */
function solveSubset(xx: number[], xy: number[], use: boolean[]): number[] | null {
  const idx: number[] = [];
  for (let i = 0; i < K; i++) if (use[i]) idx.push(i);
  const n = idx.length;
  if (!n) return null;
  const a: number[][] = [];
  for (let i = 0; i < n; i++) {
    const row: number[] = [];
    for (let j = 0; j < n; j++) row.push(xx[idx[i] * K + idx[j]]);
    row.push(xy[idx[i]]);
    a.push(row);
  }
  for (let c = 0; c < n; c++) {
    let p = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(a[r][c]) > Math.abs(a[p][c])) p = r;
    const scale = Math.abs(xx[idx[c] * K + idx[c]]);
    if (!(Math.abs(a[p][c]) > 1e-10 * (scale + 1e-300))) return null;
    const t = a[c];
    a[c] = a[p];
    a[p] = t;
    for (let r = 0; r < n; r++) {
      if (r === c) continue;
      const m = a[r][c] / a[c][c];
      if (m === 0) continue;
      for (let k = c; k <= n; k++) a[r][k] -= m * a[c][k];
    }
  }
  const out: number[] = [];
  for (let i = 0; i < K; i++) out.push(0);
  for (let i = 0; i < n; i++) out[idx[i]] = a[i][n] / a[i][i];
  return out;
}

/**
 * The fit with every coefficient non-negative and a positive per-token one:
 * a term that comes out negative (the data cannot tell it from the others) is
 * dropped and the rest refitted; failing that, time per token through the origin.
 */
function solve(xx: number[], xy: number[]): number[] {
  const use: boolean[] = [];
  for (let i = 0; i < K; i++) use.push(i < 2 || xx[i * K + i] > 0);
  for (let round = 0; round < K; round++) {
    const c = solveSubset(xx, xy, use);
    let worst = -1;
    if (c) {
      for (let i = 0; i < K; i++) if (use[i] && c[i] < 0 && (worst < 0 || c[i] < c[worst])) worst = i;
      if (worst < 0 && c[1] > 0) return c;
      if (worst < 0) worst = 1;
    } else {
      // Singular: drop the last term still in.
      for (let i = K - 1; i >= 0; i--)
        if (use[i] && i !== 1) {
          worst = i;
          break;
        }
    }
    if (worst === 1 || worst < 0) break;
    use[worst] = false;
  }
  const out: number[] = [];
  for (let i = 0; i < K; i++) out.push(0);
  out[1] = xx[K + 1] > 0 ? xy[1] / xx[K + 1] : 0;
  return out;
}

/** One worker's recent observations (a ring), enough to price them on any fleet fit. */
interface Recent {
  n: number;
  x: number[][];
  y: number[];
  next: number;
}

/** The inputs of one observation (LatencyModel.observe's arguments), for diagnostics. */
export interface TimingInputs {
  tokens: number;
  running: number;
  attention: number;
  queued: number;
  /** The scheduler replica's entry for the request (what it assumed when the request left), when it has one. */
  twin?: TwinEntry;
}

/** onObserve: each observation with what the model predicted for it beforehand (null: not learned yet) and its inputs. */
export function latencyModel(
  opts?: LatencyOptions,
  onObserve?: (ek: EpochKey, predicted: number | null, ms: number, inputs: TimingInputs) => void,
  twin?: StepTwin,
): LatencyModel {
  const o = opts || defaultLatencyOptions();
  const decay = Math.pow(0.5, 1 / o.halfLife);
  const xx: number[] = [];
  for (let i = 0; i < K * K; i++) xx.push(0);
  const xy: number[] = [];
  for (let i = 0; i < K; i++) xy.push(0);
  let fitted: number[] | null = null;
  const workers: { [ek: string]: Recent } = {};
  // Factors against the current fit, each recomputed when first read after an
  // observation (the fit moves): a worker's factor reads only its own window,
  // so a first token's prediction refits one worker, not the fleet.
  let fitVersion = 0;
  const factors: { [ek: string]: { version: number; value: number | null } } = {};
  const errs: { [ek: string]: number } = {};
  const engine: { [ek: string]: number } = {};

  function at(c: number[], x: number[]): number {
    let s = 0;
    for (let i = 0; i < K; i++) s += c[i] * x[i];
    return s;
  }

  /** The worker's factor, and in errs[ek] the standard error of its log. */
  function factorOf(ek: string, f: Recent, c: number[]): number | null {
    let sw = 0;
    let sl = 0;
    let sll = 0;
    let sww = 0;
    const m = f.y.length;
    for (let i = 0; i < m; i++) {
      const p = at(c, f.x[i]);
      if (!(p > 0) || !(f.y[i] > 0)) continue;
      let l = Math.log(f.y[i] / p);
      if (l > MAX_LOG_RATIO) l = MAX_LOG_RATIO;
      else if (l < -MAX_LOG_RATIO) l = -MAX_LOG_RATIO;
      const w = p / (p + SMALL_MS);
      sw += w;
      sww += w * w;
      sl += w * l;
      sll += w * l * l;
    }
    if (!(sw > 0)) return null;
    // Weighted variance of the log ratios over the effective sample size (sw^2 / sww).
    const mean = sl / sw;
    const v = Math.max(0, sll / sw - mean * mean);
    errs[ek] = Math.sqrt((v * sww) / (sw * sw));
    return Math.exp(sl / (sw + PRIOR));
  }

  function factor(ek: string): number | null {
    const f = workers[ek];
    if (!f || f.n < o.minSamples || !fitted) return null;
    let c = factors[ek];
    if (!c) c = factors[ek] = { version: -1, value: null };
    if (c.version !== fitVersion) {
      c.value = factorOf(ek, f, fitted);
      c.version = fitVersion;
    }
    return c.value;
  }

  function predict(ek: EpochKey, tokens: number, running: number, attention?: number, queued?: number): number | null {
    const k = factor(ek);
    return k === null || !fitted ? null : k * at(fitted, features(tokens, running, attention || 0, queued || 0));
  }

  return {
    twin: twin || null,
    observe(ek, tokens, running, ms, attention, queued, predicted, entry) {
      const att = attention || 0;
      if (!(ms >= 0 && tokens >= 0 && running >= 0 && att >= 0)) return;
      if (!isFinite(ms) || !isFinite(tokens) || !isFinite(running) || !isFinite(att)) return;
      if (onObserve)
        onObserve(ek, predicted !== undefined ? predicted : predict(ek, tokens, running, att, queued), ms, {
          tokens: tokens,
          running: running,
          attention: att,
          queued: queued || 0,
          twin: entry,
        });
      const x = features(tokens, running, att, queued || 0);
      // Each observation weighs 1 / its time: the fit minimises error relative
      // to the time (what MAPE and a ranking by time care about), so the many
      // short cached requests are not drowned by a few long cold ones.
      const wt = 1 / Math.max(ms, MIN_MS);
      for (let i = 0; i < K; i++) {
        xy[i] = xy[i] * decay + wt * x[i] * ms;
        for (let j = 0; j < K; j++) xx[i * K + j] = xx[i * K + j] * decay + wt * x[i] * x[j];
      }
      fitted = solve(xx, xy);
      let f = workers[ek];
      if (!f) f = workers[ek] = { n: 0, x: [], y: [], next: 0 };
      f.n++;
      if (f.y.length < WINDOW) {
        f.x.push(x);
        f.y.push(ms);
      } else {
        f.x[f.next] = x;
        f.y[f.next] = ms;
        f.next = (f.next + 1) % WINDOW;
      }
      fitVersion++;
    },
    predict: predict,
    msPerToken(ek) {
      const k = factor(ek);
      return k === null || !fitted ? null : (k * fitted[1]) / 1000;
    },
    slowness(eks) {
      const out: { [ek: string]: number } = {};
      const known: number[] = [];
      const ks: { [ek: string]: number } = {};
      for (let i = 0; i < eks.length; i++) out[eks[i]] = 1;
      // One candidate has no median to be slower than: its factor (refitted
      // after every observation) would be computed for nothing.
      if (eks.length < 2) return out;
      for (let i = 0; i < eks.length; i++) {
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
        let r = ks[ek] / mid;
        if (r > MAX_SLOWNESS) r = MAX_SLOWNESS;
        else if (r < 1 / MAX_SLOWNESS) r = 1 / MAX_SLOWNESS;
        // Outside the dead band, and by more than the factor's own standard
        // error: a few noisy first tokens do not move a uniform fleet. One
        // standard error, not two: a fast worker's first tokens (a warm-up
        // whose prompts queue behind each other there) vary by several times,
        // and at two it stayed typical until its documents were placed.
        const d = Math.abs(Math.log(r));
        out[ek] = d > Math.log(o.band) && d > (errs[ek] || 0) ? r : 1;
      }
      return out;
    },
    samples(ek) {
      return workers[ek] ? workers[ek].n : 0;
    },
    inEngine(ek) {
      return engine[ek] || 0;
    },
    sent(ek, tokens) {
      const v = (engine[ek] || 0) + tokens;
      if (v > 0.5) engine[ek] = v;
      else delete engine[ek];
    },
    forget(ek) {
      if (twin) twin.forget(ek);
      delete engine[ek];
      delete workers[ek];
      delete factors[ek];
      fitVersion++;
    },
  };
}
