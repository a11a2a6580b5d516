// State that must outlive a request lives behind this interface, so the same
// router runs on a plain object (Node) or on js_shared_dict_zone (njs >= 0.8).
// Strings and numbers are separate namespaces: njs shared dicts are typed.

export interface Store {
  get(key: string): string | undefined;
  set(key: string, value: string): void;
  /**
   * set() when key is absent, in one operation: false (nothing written) when
   * it exists. Optional: without it, callers read first.
   */
  add?(key: string, value: string): boolean;
  del(key: string): void;
  /** Adds delta to a number (0 when absent) and returns the new value. */
  incr(key: string, delta: number): number;
  num(key: string): number;
  delNum(key: string): void;
  /** Keys of both namespaces starting with prefix (used only on worker leave / resync). */
  keys(prefix: string): string[];
  /**
   * keys() of several prefixes at once: out[i] holds the keys starting with
   * prefixes[i] (the first that matches). A backend that can only list every
   * key (njs's shared dicts) lists them once for all the prefixes.
   */
  keysMany(prefixes: string[]): string[][];
}

/** A JSON value kept under key: null when absent or not valid JSON (a damaged entry reads as none). */
export function storedJson(st: Store, key: string): unknown {
  const raw = st.get(key);
  if (raw === undefined) return null;
  try {
    return JSON.parse(raw);
  } catch (e) {
    return null;
  }
}

/** In-process store for the ext_proc server and tests. */
export function memStore(): Store {
  const s: { [k: string]: string } = Object.create(null);
  const n: { [k: string]: number } = Object.create(null);
  // Keys with two colons ("MR:<ek>:<h>") are indexed by their "MR:<ek>:" bucket,
  // so dropping one worker's mirror costs its own keys, not the whole store.
  const idx: { [bucket: string]: { [k: string]: boolean } } = Object.create(null);
  function bucket(k: string): string | null {
    const a = k.indexOf(":");
    const b = a < 0 ? -1 : k.indexOf(":", a + 1);
    return b < 0 ? null : k.substr(0, b + 1);
  }
  function index(k: string): void {
    const b = bucket(k);
    if (b === null) return;
    (idx[b] || (idx[b] = Object.create(null)))[k] = true;
  }
  function unindex(k: string): void {
    const b = bucket(k);
    if (b === null || !idx[b]) return;
    delete idx[b][k];
  }
  return {
    get: (k) => s[k],
    set: (k, v) => {
      if (s[k] === undefined) index(k);
      s[k] = v;
    },
    del: (k) => {
      if (s[k] !== undefined) {
        delete s[k];
        if (n[k] === undefined) unindex(k);
      }
    },
    incr: (k, d) => {
      if (n[k] === undefined) index(k);
      const v = (n[k] || 0) + d;
      n[k] = v;
      return v;
    },
    num: (k) => n[k] || 0,
    delNum: (k) => {
      if (n[k] !== undefined) {
        delete n[k];
        if (s[k] === undefined) unindex(k);
      }
    },
    keys: keysOf,
    keysMany(ps) {
      // The bucket index answers each prefix from its own keys.
      const out: string[][] = [];
      for (let i = 0; i < ps.length; i++) out.push(keysOf(ps[i]));
      return out;
    },
  };
  function keysOf(p: string): string[] {
    const out: string[] = [];
    if (bucket(p) === p) {
      const b = idx[p];
      if (b) for (const k in b) out.push(k);
      return out;
    }
    for (const k in s) if (k.indexOf(p) === 0) out.push(k);
    for (const k in n) if (k.indexOf(p) === 0 && s[k] === undefined) out.push(k);
    return out;
  }
}
