// A bounded cache kept as two generations instead of an LRU. A hit in the
// older generation copies the entry into the newer one; a newer generation that
// would pass its bound retires the older one whole. An LRU Map (delete + set on
// every hit) slows with every request under V8: a deleted key stays in its hash
// chain until the table rehashes, so each lookup of a hot key walks every
// earlier delete of it. Node side only (njs has no Map).

export interface Generations<V> {
  /** The value; one found only in the older generation is copied to the newer. */
  get(key: string, bound: number): V | undefined;
  /** Whether either generation holds key; moves nothing. */
  has(key: string): boolean;
  /** Puts key in the newer generation, first retiring the older if the newer would pass bound (in weigh units). */
  set(key: string, value: V, bound: number): void;
  /** Every key once, older generation first. */
  keys(): string[];
  /** Entries and weight of both generations (a key copied forward counts in each). */
  size(): number;
  weight(): number;
}

export function generations<V>(weigh: (key: string) => number): Generations<V> {
  let cur = new Map<string, V>();
  let old = new Map<string, V>();
  let curWeight = 0;
  let oldWeight = 0;
  const set = (key: string, value: V, bound: number) => {
    if (cur.has(key)) {
      cur.set(key, value);
      return;
    }
    const w = weigh(key);
    if (curWeight + w > bound) {
      old = cur;
      oldWeight = curWeight;
      cur = new Map();
      curWeight = 0;
    }
    cur.set(key, value);
    curWeight += w;
  };
  return {
    get(key, bound) {
      let v = cur.get(key);
      if (v !== undefined) return v;
      v = old.get(key);
      if (v !== undefined) set(key, v, bound);
      return v;
    },
    has: (key) => cur.has(key) || old.has(key),
    set,
    keys: () => [...old.keys()].filter((k) => !cur.has(k)).concat([...cur.keys()]),
    size: () => cur.size + old.size,
    weight: () => curWeight + oldWeight,
  };
}
