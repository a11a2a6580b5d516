// Block positions the key-encoded backend (state/keyed.ts) writes and reads
// instead of every block of a request. Block hashes are chained (core/hash.ts:
// each one covers its whole prefix, from the chain root on), so a request's
// block at position p held somewhere means that holder shares the request's
// first p + 1 blocks. Marking a request at a fixed set of positions is then
// enough to find, by binary search, how long a prefix it shares with the
// requests in flight: "position p of this prompt is marked on the worker" is
// true up to the longest shared prefix and false after it.
//
// The grid: every position below DENSE, then PER_OCTAVE positions per
// doubling of the position (a shared prefix is found to within 1/PER_OCTAVE of
// its length, rounded down). A request of n blocks writes about
// DENSE + PER_OCTAVE * log2(n / DENSE) marks, and a lookup reads about
// log2 of that: 7,000 blocks write 157 marks and read 8.

const DENSE = 32;
const PER_OCTAVE = 16;

/** The grid step at position p: 1 below DENSE, then 1/PER_OCTAVE of the octave p + 1 lies in. */
function stepAt(p: number): number {
  const m = p + 1;
  if (m < DENSE) return 1;
  let s = 1;
  let x = m;
  while (x >= 2 * PER_OCTAVE) {
    x = Math.floor(x / 2);
    s *= 2;
  }
  return s;
}

/** True when position p is on the grid. */
export function onGrid(p: number): boolean {
  return (p + 1) % stepAt(p) === 0;
}

/** The first m (a position plus one) past m's run of equal grid steps: DENSE, or the next octave. */
function runEnd(m: number): number {
  let b = 2 * PER_OCTAVE;
  while (b <= m) b *= 2;
  return m < DENSE && DENSE < b ? DENSE : b;
}

/**
 * The grid positions in [from, end), ascending. Walks each run of equal grid
 * steps (the dense part, then one octave at a time) in strides of its step:
 * one stepAt per octave, not per position (a pick computes the grid of a long
 * prompt more than once, and njs interprets every loop turn).
 */
export function gridPositions(from: number, end: number): number[] {
  const out: number[] = [];
  let m = from + 1;
  while (m <= end) {
    const s = stepAt(m - 1);
    const last = Math.min(end, runEnd(m) - 1);
    for (let q = m % s === 0 ? m : (Math.floor(m / s) + 1) * s; q <= last; q += s) out.push(q - 1);
    m = last + 1;
  }
  return out;
}

// The last markPositions answer: a pick asks for the same request's marks
// several times (the mirror's walk, the in-flight prefix, the guard it holds).
// Callers only read the list (a guard keeps it as its at).
let lastFrom = -1;
let lastEnd = -1;
let lastMarks: number[] = [];

/**
 * The positions a guard over blocks [from, end) marks: the grid positions in
 * that range and its last block (so that a request identical to one in
 * flight finds all of it with one read).
 */
export function markPositions(from: number, end: number): number[] {
  if (from === lastFrom && end === lastEnd) return lastMarks;
  const out = gridPositions(from, end);
  if (end > from && (out.length === 0 || out[out.length - 1] !== end - 1)) out.push(end - 1);
  lastFrom = from;
  lastEnd = end;
  lastMarks = out;
  return out;
}

/**
 * The length of the longest prefix of a request held somewhere, from marks:
 * at[i] is the position of hashes[i] (ascending, grid positions, the last one
 * possibly the request's last block n - 1 off the grid), held(h) whether a
 * block hash is marked. Exact below DENSE blocks and when the whole request is
 * held; else rounded down to the grid.
 */
export function markedPrefix(hashes: string[], at: number[], n: number, held: (h: string) => boolean): number {
  const k = at.length;
  if (!k) return 0;
  if (at[k - 1] === n - 1 && held(hashes[k - 1])) return n;
  // Binary search over the grid entries: held is true up to the shared prefix.
  let hi = at[k - 1] === n - 1 && !onGrid(n - 1) ? k - 1 : k;
  let lo = -1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (held(hashes[mid])) lo = mid;
    else hi = mid;
  }
  return lo < 0 ? 0 : at[lo] + 1;
}

// A long prompt's block hashes as the tokenizer helper can send them to njs
// (njs/offload.ts): one string of fixed-width hashes, not a JSON array. njs
// makes a string per array element it parses, 7,000 of them for a 112k-token
// prompt, where a pick reads a few hundred: the marks' positions, and the
// positions the mirror's walk bisects where a worker's cached run ends. The
// list is an array of the prompt's length holding the marks' hashes; every
// other position is cut from the packed string when first read (blockAt), so
// the readers see the same hash at every position as with the full list.

/** Characters per hash in a packed list (core/hash.ts: 16 hex digits). */
export const PACKED_WIDTH = 16;

interface PackedList {
  packed?: string;
}

/** The hashes of a packed string of n fixed-width hashes, the marks' positions filled. */
export function packedBlocks(packed: string, n: number): string[] {
  const out = new Array(n) as string[];
  (out as PackedList).packed = packed;
  const at = markPositions(0, n);
  for (let i = 0; i < at.length; i++) out[at[i]] = packed.substr(at[i] * PACKED_WIDTH, PACKED_WIDTH);
  return out;
}

/** blocks[i], cut from the packed string on first read when blocks came packed. */
export function blockAt<T extends string>(blocks: T[], i: number): T {
  const h = blocks[i];
  if (h !== undefined) return h;
  const p = (blocks as PackedList).packed;
  if (p === undefined || !(i >= 0 && i < blocks.length)) return h;
  const v = p.substr(i * PACKED_WIDTH, PACKED_WIDTH) as T;
  blocks[i] = v;
  return v;
}
