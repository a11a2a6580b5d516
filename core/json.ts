// JSON.parse, with a fallback for what an engine's own parser refuses only
// for its nesting: njs's JSON.parse (0.7 and 0.8) throws "Nested too deep" at
// 32 levels, so a tool schema 40 levels deep, which Node parses and vLLM
// serves, would be a 400 on the NGINX path alone. The fallback is a strict
// RFC 8259 parser with an explicit stack (no recursion: a body's nesting never
// decides our call depth); whether the depth is acceptable stays the caller's
// rule (--max-json-depth). Text that is not JSON fails both and keeps the
// first parser's error.

/** Parses text as JSON; throws a SyntaxError-like Error when it is not JSON. */
export function parseJson(text: string): any {
  try {
    return JSON.parse(text);
  } catch (e) {
    const v = parseDeep(text);
    if (v.ok) return v.value;
    throw e;
  }
}

interface Frame {
  /** The container being filled. */
  c: any;
  arr: boolean;
  /** The member name waiting for its value (objects). */
  key: string;
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/g;

function isWs(ch: number): boolean {
  return ch === 32 || ch === 9 || ch === 10 || ch === 13;
}

/** The strict iterative parser; ok false on the first error. */
export function parseDeep(s: string): { ok: boolean; value?: any } {
  const n = s.length;
  let i = 0;
  const stack: Frame[] = [];
  let root: any = undefined;
  let have = false;
  const fail = { ok: false };

  function skip(): void {
    while (i < n && isWs(s.charCodeAt(i))) i++;
  }

  // Reads a string at s[i] === '"'; null when malformed.
  function str(): string | null {
    i++;
    let out = "";
    let from = i;
    while (i < n) {
      const ch = s.charCodeAt(i);
      if (ch === 34) {
        out += s.substring(from, i);
        i++;
        return out;
      }
      if (ch < 32) return null;
      if (ch !== 92) {
        i++;
        continue;
      }
      out += s.substring(from, i);
      const e = s.charAt(i + 1);
      i += 2;
      if (e === '"') out += '"';
      else if (e === "\\") out += "\\";
      else if (e === "/") out += "/";
      else if (e === "b") out += "\b";
      else if (e === "f") out += "\f";
      else if (e === "n") out += "\n";
      else if (e === "r") out += "\r";
      else if (e === "t") out += "\t";
      else if (e === "u") {
        const h = s.substring(i, i + 4);
        if (!/^[0-9a-fA-F]{4}$/.test(h)) return null;
        out += String.fromCharCode(parseInt(h, 16));
        i += 4;
      } else return null;
      from = i;
    }
    return null;
  }

  // Stores a finished value in the open container (or as the root).
  function put(v: any): void {
    if (!stack.length) {
      root = v;
      have = true;
      return;
    }
    const f = stack[stack.length - 1];
    if (f.arr) f.c.push(v);
    else if (f.key === "__proto__")
      // JSON.parse makes an own property of it; assignment would set the prototype.
      Object.defineProperty(f.c, f.key, { value: v, writable: true, enumerable: true, configurable: true });
    else f.c[f.key] = v;
  }

  // The state machine: expecting a value, or after one (',' or a closer).
  let wantValue = true;
  for (;;) {
    skip();
    if (wantValue) {
      if (i >= n) return fail;
      const ch = s.charAt(i);
      if (ch === "{" || ch === "[") {
        const arr = ch === "[";
        const c: any = arr ? [] : {};
        i++;
        skip();
        const close = arr ? "]" : "}";
        if (s.charAt(i) === close) {
          i++;
          put(c);
          wantValue = false;
        } else {
          put(c);
          const f: Frame = { c: c, arr: arr, key: "" };
          stack.push(f);
          if (!arr) {
            if (s.charAt(i) !== '"') return fail;
            const k = str();
            if (k === null) return fail;
            skip();
            if (s.charAt(i) !== ":") return fail;
            i++;
            f.key = k;
          }
          // wantValue stays true: the first member's value
        }
        // An object is put before its members are filled: its place in the
        // parent is fixed now, and members arrive in document order.
        continue;
      }
      let v: any;
      if (ch === '"') {
        const t = str();
        if (t === null) return fail;
        v = t;
      } else if (ch === "t" && s.substring(i, i + 4) === "true") {
        v = true;
        i += 4;
      } else if (ch === "f" && s.substring(i, i + 5) === "false") {
        v = false;
        i += 5;
      } else if (ch === "n" && s.substring(i, i + 4) === "null") {
        v = null;
        i += 4;
      } else {
        NUMBER.lastIndex = i;
        const m = NUMBER.exec(s);
        if (!m || m.index !== i || !m[0].length) return fail;
        v = Number(m[0]);
        i += m[0].length;
      }
      put(v);
      wantValue = false;
      continue;
    }
    // After a value: end of text, a separator, or a closer.
    if (!stack.length) {
      if (i !== n || !have) return fail;
      return { ok: true, value: root };
    }
    const f = stack[stack.length - 1];
    const ch = s.charAt(i);
    if (ch === ",") {
      i++;
      if (!f.arr) {
        skip();
        if (s.charAt(i) !== '"') return fail;
        const k = str();
        if (k === null) return fail;
        skip();
        if (s.charAt(i) !== ":") return fail;
        i++;
        f.key = k;
      }
      wantValue = true;
      continue;
    }
    if (ch === (f.arr ? "]" : "}")) {
      i++;
      stack.pop();
      continue;
    }
    return fail;
  }
}

// Walking a parsed value without recursion. njs's call stack is small: a
// recursive serializer overflows ("Maximum call stack size exceeded") within
// about 40 nested levels, under the 64 that --max-json-depth admits, and on
// the NGINX path that turned a deep tool schema's pick into a random one.
// These walk with an explicit stack, so the body's nesting never decides our
// call depth on any backend.

/** A container's members as the walk visits them: keys null for a list. */
export interface Members {
  keys: string[] | null;
  vals: any[];
}

interface WalkFrame {
  m: Members;
  i: number;
  parts: string[];
  depth: number;
}

/**
 * Writes a nested value bottom-up: leaf() returns a scalar's text, or null for
 * a container, whose members() are written first and then join()ed (depth:
 * the container's nesting, 0 for the root).
 */
export function writeNested(
  root: any,
  leaf: (v: any) => string | null,
  members: (v: any) => Members,
  join: (parts: string[], keys: string[] | null, depth: number) => string,
): string {
  const top = leaf(root);
  if (top !== null) return top;
  const stack: WalkFrame[] = [{ m: members(root), i: 0, parts: [], depth: 0 }];
  for (;;) {
    const f = stack[stack.length - 1];
    if (f.i < f.m.vals.length) {
      const v = f.m.vals[f.i++];
      const s = leaf(v);
      if (s !== null) f.parts.push(s);
      else stack.push({ m: members(v), i: 0, parts: [], depth: f.depth + 1 });
      continue;
    }
    stack.pop();
    const done = join(f.parts, f.m.keys, f.depth);
    if (!stack.length) return done;
    stack[stack.length - 1].parts.push(done);
  }
}

/** A deep copy of a parsed JSON value (plain objects and arrays). */
export function cloneJson(root: any): any {
  if (root === null || typeof root !== "object") return root;
  const top: any = root instanceof Array ? [] : {};
  const src: any[] = [root];
  const dst: any[] = [top];
  while (src.length) {
    const s = src.pop();
    const d = dst.pop();
    const arr = s instanceof Array;
    const keys: string[] = [];
    if (arr) for (let i = 0; i < s.length; i++) keys.push(String(i));
    else for (const k in s) keys.push(k);
    for (let i = 0; i < keys.length; i++) {
      const v = s[keys[i]];
      const k = arr ? i : keys[i];
      if (v === null || typeof v !== "object") d[k] = v;
      else {
        d[k] = v instanceof Array ? [] : {};
        src.push(v);
        dst.push(d[k]);
      }
    }
  }
  return top;
}

/** JSON.stringify(v) for a parsed JSON value, without njs's 32-level limit. */
export function stringifyJson(root: any): string {
  return writeNested(
    root,
    function (x) {
      return x === null || typeof x !== "object" ? JSON.stringify(x) : null;
    },
    function (x) {
      if (x instanceof Array) return { keys: null, vals: x };
      const keys: string[] = [];
      const vals: any[] = [];
      for (const k in x) {
        keys.push(k);
        vals.push(x[k]);
      }
      return { keys: keys, vals: vals };
    },
    function (parts, keys) {
      if (keys === null) return "[" + parts.join(",") + "]";
      const p: string[] = [];
      for (let i = 0; i < keys.length; i++) p.push(JSON.stringify(keys[i]) + ":" + parts[i]);
      return "{" + p.join(",") + "}";
    },
  );
}
