// State that must outlive a request lives behind this interface, so the same
// router runs on a plain object (Node) or on js_shared_dict_zone (njs >= 0.8).
// Strings and numbers are separate namespaces: njs shared dicts are typed.

export interface Store {
  get(key: string): string | undefined;
  set(key: string, value: string): void;
  del(key: string): void;
  /** Adds delta to a number (0 when absent) and returns the new value. */
  incr(key: string, delta: number): number;
  num(key: string): number;
  delNum(key: string): void;
  /** Keys of both namespaces starting with prefix (used only on worker leave / resync). */
  keys(prefix: string): string[];
}

/** In-process store for the ext_proc server and tests. */
export function memStore(): Store {
  let s: { [k: string]: string } = Object.create(null);
  let n: { [k: string]: number } = Object.create(null);
  return {
    get: (k) => s[k],
    set: (k, v) => {
      s[k] = v;
    },
    del: (k) => {
      delete s[k];
    },
    incr: (k, d) => {
      const v = (n[k] || 0) + d;
      n[k] = v;
      return v;
    },
    num: (k) => n[k] || 0,
    delNum: (k) => {
      delete n[k];
    },
    keys: (p) => {
      const out: string[] = [];
      for (const k in s) if (k.indexOf(p) === 0) out.push(k);
      for (const k in n) if (k.indexOf(p) === 0) out.push(k);
      return out;
    },
  };
}
