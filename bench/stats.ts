// Summary statistics for the bench reports, one copy for every bench.
//
// Three percentile rules are in use, each kept because tables already
// published were made with it, and for one p and n they can pick different
// samples (n = 10, p = 50: pct takes the 6th smallest, pctNearestRank the
// 5th, pctLower the 5th; n = 100, p = 99: the 100th, 99th and 99th). None
// interpolates: every result is one of the samples. p is in percent (0-100).
// An empty list gives NaN everywhere except meanOrZero.

function sorted(xs: number[]): number[] {
  return xs.slice().sort((a, b) => a - b);
}

/** The sample at 0-based index floor(p% of n) of the sorted list (capped at the last): the upper median for p = 50. */
export function pct(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = sorted(xs);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

/** Nearest rank: the smallest sample with at least p% of the samples at or below it (1-based rank ceil(p% of n)). */
export function pctNearestRank(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = sorted(xs);
  return s[Math.max(0, Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1))];
}

/** The sample at 0-based index floor(p% of (n - 1)): numpy's "lower" method. */
export function pctLower(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = sorted(xs);
  return s[Math.floor((p / 100) * (s.length - 1))];
}

/** The upper median (the sample at index floor(n / 2) of the sorted list), the same sample as pct(xs, 50). */
export function median(xs: number[]): number {
  if (!xs.length) return NaN;
  return sorted(xs)[Math.floor(xs.length / 2)];
}

export function sum(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0);
}

/** The arithmetic mean; NaN for no samples. */
export function mean(xs: number[]): number {
  return xs.length ? sum(xs) / xs.length : NaN;
}

/** The arithmetic mean, 0 for no samples: for tables that print a side with no answers as 0 rather than NaN. */
export function meanOrZero(xs: number[]): number {
  return sum(xs) / Math.max(1, xs.length);
}
