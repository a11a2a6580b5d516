// A Jinja2 interpreter for chat templates with Python semantics, written for
// the njs subset (no class/Map/Set/spread/for-of/generators), so nginx renders
// the same prompt as the ext_proc server. It walks the AST @huggingface/jinja's
// parser produces (parsed in Node: at load for ext_proc, at build time for njs,
// see templateAst), and follows jinja2 + transformers where the two JS engines
// would differ: None prints "None", str + dict raises, strip(chars), tojson is
// json.dumps(ensure_ascii=False), loop scoping, namespace(), raise_exception.
//
// Values: str, number, bool, null (None), undefined (Undefined), arrays, plain
// objects (dicts, insertion order), namespaces, loop objects and functions.
//
// Own-property checks call Object.prototype.hasOwnProperty directly rather
// than core/util's hasOwn: njs 0.7.9's stack overflows on the deeper templates
// with one more frame per lookup (test/e2e/njs.test.ts render parity).

import { Members, writeNested } from "./json";

export type Ast = any;

function TemplateError(msg: string): Error {
  const e = new Error(msg) as Error & { status: number; type: string };
  e.status = 400;
  e.type = "invalid_request_error";
  return e;
}

const NS_MARK = { ns: 1 };
const BREAK = { ctl: "break" };
const CONTINUE = { ctl: "continue" };

function isArr(v: any): boolean {
  return v instanceof Array;
}
function isNs(v: any): boolean {
  return v !== null && typeof v === "object" && v.__ns === NS_MARK;
}
function isDict(v: any): boolean {
  return v !== null && typeof v === "object" && !(v instanceof Array) && !isNs(v);
}
function isInt(v: any): boolean {
  return typeof v === "number" && isFinite(v) && Math.floor(v) === v;
}

export function truthy(v: any): boolean {
  if (v === undefined || v === null || v === false || v === 0 || v === "") return false;
  if (isArr(v)) return v.length > 0;
  if (isDict(v)) {
    for (const _k in v) return true;
    return false;
  }
  return true;
}

function pyReprStr(s: string): string {
  const q = s.indexOf("'") >= 0 && s.indexOf('"') < 0 ? '"' : "'";
  let out = q;
  for (let i = 0; i < s.length; i++) {
    const c = s.charAt(i);
    const code = s.charCodeAt(i);
    if (c === "\\") out += "\\\\";
    else if (c === q) out += "\\" + q;
    else if (c === "\n") out += "\\n";
    else if (c === "\r") out += "\\r";
    else if (c === "\t") out += "\\t";
    else if (code < 0x20 || code === 0x7f) out += "\\x" + (code < 16 ? "0" : "") + code.toString(16);
    else out += c;
  }
  return out + q;
}

function membersOf(v: any, sortKeys: boolean): Members {
  if (isArr(v)) return { keys: null, vals: v };
  const src = isNs(v) ? v.a : v;
  const keys: string[] = [];
  for (const k in src) keys.push(k);
  if (sortKeys) keys.sort();
  const vals: any[] = [];
  for (let i = 0; i < keys.length; i++) vals.push(src[keys[i]]);
  return { keys: keys, vals: vals };
}

// repr() of a list or dict, iteratively (core/json.ts writeNested).
function pyRepr(v: any): string {
  return writeNested(
    v,
    function (x) {
      return typeof x === "string" ? pyReprStr(x) : isArr(x) || isDict(x) ? null : pyStr(x);
    },
    function (x) {
      return membersOf(x, false);
    },
    function (parts, keys) {
      if (keys === null) return "[" + parts.join(", ") + "]";
      const p: string[] = [];
      for (let i = 0; i < keys.length; i++) p.push(pyReprStr(keys[i]) + ": " + parts[i]);
      return "{" + p.join(", ") + "}";
    },
  );
}

/** Python str() as jinja2 prints it. */
export function pyStr(v: any): string {
  if (typeof v === "string") return v;
  if (v === undefined) return "";
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "number") {
    if (v !== v) return "nan";
    if (v === Infinity) return "inf";
    if (v === -Infinity) return "-inf";
    return String(v);
  }
  if (isArr(v) || isDict(v)) return pyRepr(v);
  if (isNs(v)) return "<Namespace>";
  return String(v);
}

function jsonStr(s: string): string {
  return JSON.stringify(s);
}

/** json.dumps(v, ensure_ascii=False, indent=indent, separators=seps, sort_keys=sortKeys), iteratively. */
export function pyJson(v: any, indent: number | string | null, seps: string[] | null, sortKeys: boolean): string {
  const ind =
    indent === null || indent === undefined
      ? null
      : typeof indent === "number"
        ? new Array(indent + 1).join(" ")
        : String(indent);
  const item = seps ? seps[0] : ind !== null ? "," : ", ";
  const key = seps ? seps[1] : ": ";
  return writeNested(
    v,
    function (x) {
      if (x === null || x === undefined) return "null";
      if (x === true) return "true";
      if (x === false) return "false";
      if (typeof x === "number")
        return x !== x ? "NaN" : x === Infinity ? "Infinity" : x === -Infinity ? "-Infinity" : String(x);
      if (typeof x === "string") return jsonStr(x);
      if (isArr(x) || isDict(x) || isNs(x)) return null;
      throw TemplateError("Object of type " + typeof x + " is not JSON serializable");
    },
    function (x) {
      return membersOf(x, sortKeys);
    },
    function (parts, keys, depth) {
      if (!parts.length) return keys === null ? "[]" : "{}";
      const nl = ind !== null ? "\n" + new Array(depth + 2).join(ind) : "";
      const end = ind !== null ? "\n" + new Array(depth + 1).join(ind) : "";
      if (keys === null) return "[" + nl + parts.join(item + nl) + end + "]";
      const p: string[] = [];
      for (let i = 0; i < keys.length; i++) p.push(jsonStr(keys[i]) + key + parts[i]);
      return "{" + nl + p.join(item + nl) + end + "}";
    },
  );
}

const PY_WS =
  " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";

export function pyStrip(s: string, chars: string | null, left: boolean, right: boolean): string {
  const set = chars === null || chars === undefined ? PY_WS : chars;
  let i = 0;
  let j = s.length;
  // chars may hold surrogate pairs; whitespace never does, and a pair is stripped only whole.
  const has = (a: number, b: number) =>
    b - a === 1 ? set.indexOf(s.charAt(a)) >= 0 : set.indexOf(s.substring(a, b)) >= 0;
  const pairAt = (k: number) => {
    const c = s.charCodeAt(k);
    return c >= 0xd800 && c <= 0xdbff && k + 1 < s.length;
  };
  if (left)
    while (i < j) {
      const w = pairAt(i) ? 2 : 1;
      if (!has(i, i + w)) break;
      i += w;
    }
  if (right)
    while (j > i) {
      const lo = s.charCodeAt(j - 1);
      const w = lo >= 0xdc00 && lo <= 0xdfff && j - 2 >= i ? 2 : 1;
      if (!has(j - w, j)) break;
      j -= w;
    }
  return s.substring(i, j);
}

// Python ==, with an explicit stack of pairs still to compare (no recursion on data).
function pyEq(a0: any, b0: any): boolean {
  const as: any[] = [a0];
  const bs: any[] = [b0];
  while (as.length) {
    const a = as.pop();
    const b = bs.pop();
    if (a === b) continue;
    if ((a === undefined || a === null) !== (b === undefined || b === null)) return false;
    if (typeof a === "boolean" || typeof b === "boolean") {
      const na = typeof a === "boolean" ? (a ? 1 : 0) : a;
      const nb = typeof b === "boolean" ? (b ? 1 : 0) : b;
      if (typeof na === "number" && typeof nb === "number" && na === nb) continue;
      return false;
    }
    if (isArr(a) && isArr(b)) {
      if (a.length !== b.length) return false;
      for (let i = 0; i < a.length; i++) {
        as.push(a[i]);
        bs.push(b[i]);
      }
      continue;
    }
    if (isDict(a) && isDict(b)) {
      let n = 0;
      for (const k in a) {
        n++;
        if (!(k in b)) return false;
        as.push(a[k]);
        bs.push(b[k]);
      }
      for (const _k in b) n--;
      if (n !== 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

function typeName(v: any): string {
  if (v === undefined) return "Undefined";
  if (v === null) return "NoneType";
  if (typeof v === "string") return "str";
  if (typeof v === "boolean") return "bool";
  if (typeof v === "number") return isInt(v) ? "int" : "float";
  if (isArr(v)) return "list";
  if (isDict(v)) return "dict";
  return typeof v;
}

function pyIndex(len: number, i: number): number {
  return i < 0 ? i + len : i;
}

function slice(v: any, start: any, stop: any, step: any): any {
  const isStr = typeof v === "string";
  if (!isStr && !isArr(v)) throw TemplateError("cannot slice " + typeName(v));
  const n = v.length;
  const st = step === undefined || step === null ? 1 : step;
  if (st === 0) throw TemplateError("slice step cannot be zero");
  let a: number;
  let b: number;
  if (st > 0) {
    a = start === undefined || start === null ? 0 : start < 0 ? Math.max(0, start + n) : Math.min(start, n);
    b = stop === undefined || stop === null ? n : stop < 0 ? Math.max(0, stop + n) : Math.min(stop, n);
  } else {
    a = start === undefined || start === null ? n - 1 : start < 0 ? Math.max(-1, start + n) : Math.min(start, n - 1);
    b = stop === undefined || stop === null ? -1 : stop < 0 ? Math.max(-1, stop + n) : Math.min(stop, n - 1);
  }
  const out: any[] = [];
  if (st > 0) for (let i = a; i < b; i += st) out.push(isStr ? v.charAt(i) : v[i]);
  else for (let i = a; i > b; i += st) out.push(isStr ? v.charAt(i) : v[i]);
  return isStr ? out.join("") : out;
}

type Fn = (args: any[], kw: { [k: string]: any }) => any;

function fn(f: Fn): Fn {
  return f;
}

function strMethod(s: string, name: string): Fn | undefined {
  switch (name) {
    case "strip":
    case "lstrip":
    case "rstrip":
      return fn(function (a) {
        return pyStrip(
          s,
          a.length && a[0] !== null && a[0] !== undefined ? String(a[0]) : null,
          name !== "rstrip",
          name !== "lstrip",
        );
      });
    case "startswith":
    case "endswith":
      return fn(function (a) {
        const ps = isArr(a[0]) ? a[0] : [a[0]];
        for (let i = 0; i < ps.length; i++) {
          const p = String(ps[i]);
          if (
            name === "startswith"
              ? s.substr(0, p.length) === p
              : p.length <= s.length && s.substr(s.length - p.length) === p
          )
            return true;
        }
        return false;
      });
    case "split":
      return fn(function (a) {
        const sep = a.length ? a[0] : null;
        const max = a.length > 1 ? a[1] : -1;
        if (sep === null || sep === undefined) {
          const parts = pyStrip(s, null, true, true).split(
            /[ \t\n\r\x0b\x0c\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/,
          );
          return parts.length === 1 && parts[0] === "" ? [] : parts;
        }
        if (sep === "") throw TemplateError("empty separator");
        const out = s.split(sep);
        if (max >= 0 && out.length > max + 1) return out.slice(0, max).concat([out.slice(max).join(sep)]);
        return out;
      });
    case "rsplit":
      return fn(function (a) {
        const sep = a[0];
        const max = a.length > 1 ? a[1] : -1;
        const out = s.split(sep);
        if (max >= 0 && out.length > max + 1)
          return [out.slice(0, out.length - max).join(sep)].concat(out.slice(out.length - max));
        return out;
      });
    case "lower":
      return fn(function () {
        return s.toLowerCase();
      });
    case "upper":
      return fn(function () {
        return s.toUpperCase();
      });
    case "title":
      return fn(function () {
        return s.replace(/[A-Za-z]+/g, function (w) {
          return w.charAt(0).toUpperCase() + w.substr(1).toLowerCase();
        });
      });
    case "capitalize":
      return fn(function () {
        return s.charAt(0).toUpperCase() + s.substr(1).toLowerCase();
      });
    case "replace":
      return fn(function (a) {
        const cnt = a.length > 2 ? a[2] : -1;
        const parts = s.split(String(a[0]));
        if (cnt < 0 || parts.length - 1 <= cnt) return parts.join(String(a[1]));
        return parts.slice(0, cnt + 1).join(String(a[1])) + String(a[0]) + parts.slice(cnt + 1).join(String(a[0]));
      });
    case "find":
      return fn(function (a) {
        return s.indexOf(String(a[0]));
      });
    case "count":
      return fn(function (a) {
        return s.split(String(a[0])).length - 1;
      });
    case "join":
      return fn(function (a) {
        const out: string[] = [];
        for (let i = 0; i < a[0].length; i++) out.push(String(a[0][i]));
        return out.join(s);
      });
    case "format":
      return fn(function (a) {
        let i = 0;
        return s.replace(/\{\}/g, function () {
          return pyStr(a[i++]);
        });
      });
    case "isdigit":
      return fn(function () {
        return /^[0-9]+$/.test(s);
      });
  }
  return undefined;
}

function dictMethod(d: any, name: string): Fn | undefined {
  switch (name) {
    case "items":
      return fn(function () {
        const out: any[] = [];
        for (const k in d) out.push([k, d[k]]);
        return out;
      });
    case "keys":
      return fn(function () {
        const out: any[] = [];
        for (const k in d) out.push(k);
        return out;
      });
    case "values":
      return fn(function () {
        const out: any[] = [];
        for (const k in d) out.push(d[k]);
        return out;
      });
    case "get":
      return fn(function (a) {
        return Object.prototype.hasOwnProperty.call(d, a[0]) ? d[a[0]] : a.length > 1 ? a[1] : null;
      });
  }
  return undefined;
}

/** obj.name / obj[key]: jinja2 tries the attribute, then the item (and the reverse for []). */
function getAttr(obj: any, key: any, computed: boolean): any {
  if (obj === undefined || obj === null) {
    if (obj === undefined) throw TemplateError("'" + pyStr(key) + "' is undefined (attribute of Undefined)");
    return undefined;
  }
  if (isNs(obj)) return Object.prototype.hasOwnProperty.call(obj.a, key) ? obj.a[key] : undefined;
  if (typeof obj === "string") {
    if (typeof key === "number") {
      const i = pyIndex(obj.length, key);
      return i >= 0 && i < obj.length ? obj.charAt(i) : undefined;
    }
    return strMethod(obj, key);
  }
  if (isArr(obj)) {
    if (typeof key === "number") {
      const i = pyIndex(obj.length, key);
      return i >= 0 && i < obj.length ? obj[i] : undefined;
    }
    return undefined;
  }
  if (isDict(obj)) {
    const own =
      typeof key === "string" || typeof key === "number" ? Object.prototype.hasOwnProperty.call(obj, key) : false;
    if (computed) return own ? obj[key] : typeof key === "string" ? dictMethod(obj, key) : undefined;
    const m = typeof key === "string" ? dictMethod(obj, key) : undefined;
    if (m) return m;
    return own ? obj[key] : undefined;
  }
  return undefined;
}

function length(v: any): number {
  if (typeof v === "string" || isArr(v)) return v.length;
  if (isDict(v)) {
    let n = 0;
    for (const _k in v) n++;
    return n;
  }
  throw TemplateError("object of type '" + typeName(v) + "' has no len()");
}

function iterate(v: any): any[] {
  if (isArr(v)) return v;
  if (typeof v === "string") return v.split("");
  if (isDict(v)) {
    const out: any[] = [];
    for (const k in v) out.push(k);
    return out;
  }
  if (v === undefined) return [];
  throw TemplateError("'" + typeName(v) + "' object is not iterable");
}

function binary(op: string, a: any, b: any): any {
  switch (op) {
    case "==":
      return pyEq(a, b);
    case "!=":
      return !pyEq(a, b);
    case "~":
      return pyStr(a) + pyStr(b);
    case "in":
    case "not in": {
      let r: boolean;
      if (typeof b === "string") {
        if (typeof a !== "string")
          throw TemplateError("'in <string>' requires string as left operand, not " + typeName(a));
        r = b.indexOf(a) >= 0;
      } else if (isArr(b)) {
        r = false;
        for (let i = 0; i < b.length; i++)
          if (pyEq(a, b[i])) {
            r = true;
            break;
          }
      } else if (isDict(b))
        r = (typeof a === "string" || typeof a === "number") && Object.prototype.hasOwnProperty.call(b, a);
      else if (b === undefined) r = false;
      else throw TemplateError("argument of type '" + typeName(b) + "' is not iterable");
      return op === "in" ? r : !r;
    }
  }
  const num = (x: any) => typeof x === "number" || typeof x === "boolean";
  if (op === "+") {
    if (num(a) && num(b)) return Number(a) + Number(b);
    if (typeof a === "string" && typeof b === "string") return a + b;
    if (isArr(a) && isArr(b)) return a.concat(b);
    throw TemplateError("unsupported operand type(s) for +: '" + typeName(a) + "' and '" + typeName(b) + "'");
  }
  if (op === "*" && typeof a === "string" && isInt(b)) return new Array(Math.max(0, b) + 1).join(a);
  if (op === "*" && typeof b === "string" && isInt(a)) return new Array(Math.max(0, a) + 1).join(b);
  if (op === "*" && isArr(a) && isInt(b)) {
    let out: any[] = [];
    for (let i = 0; i < b; i++) out = out.concat(a);
    return out;
  }
  if (op === "<" || op === ">" || op === "<=" || op === ">=") {
    if (!((num(a) && num(b)) || (typeof a === "string" && typeof b === "string")))
      throw TemplateError(
        "'" + op + "' not supported between instances of '" + typeName(a) + "' and '" + typeName(b) + "'",
      );
    return op === "<" ? a < b : op === ">" ? a > b : op === "<=" ? a <= b : a >= b;
  }
  if (!num(a) || !num(b))
    throw TemplateError("unsupported operand type(s) for " + op + ": '" + typeName(a) + "' and '" + typeName(b) + "'");
  const x = Number(a);
  const y = Number(b);
  switch (op) {
    case "-":
      return x - y;
    case "*":
      return x * y;
    case "/":
      if (y === 0) throw TemplateError("division by zero");
      return x / y;
    case "//":
      if (y === 0) throw TemplateError("integer division or modulo by zero");
      return Math.floor(x / y);
    case "%":
      if (y === 0) throw TemplateError("integer division or modulo by zero");
      return ((x % y) + y) % y;
    case "**":
      return Math.pow(x, y);
  }
  throw TemplateError("unknown operator " + op);
}

function attrPath(v: any, path: string): any {
  const parts = String(path).split(".");
  for (let i = 0; i < parts.length && v !== undefined; i++)
    v = getAttr(v, /^\d+$/.test(parts[i]) ? Number(parts[i]) : parts[i], true);
  return v;
}

const TESTS: { [name: string]: (v: any, a: any[]) => boolean } = {
  defined: (v) => v !== undefined,
  undefined: (v) => v === undefined,
  none: (v) => v === null,
  string: (v) => typeof v === "string",
  number: (v) => typeof v === "number",
  integer: (v) => isInt(v),
  float: (v) => typeof v === "number" && !isInt(v),
  boolean: (v) => typeof v === "boolean",
  true: (v) => v === true,
  false: (v) => v === false,
  mapping: (v) => isDict(v),
  sequence: (v) => isArr(v) || typeof v === "string" || isDict(v),
  iterable: (v) => isArr(v) || typeof v === "string" || isDict(v),
  callable: (v) => typeof v === "function",
  odd: (v) => isInt(v) && Math.abs(v % 2) === 1,
  even: (v) => isInt(v) && v % 2 === 0,
  lower: (v) => typeof v === "string" && v.toLowerCase() === v,
  upper: (v) => typeof v === "string" && v.toUpperCase() === v,
  eq: (v, a) => pyEq(v, a[0]),
  equalto: (v, a) => pyEq(v, a[0]),
  ne: (v, a) => !pyEq(v, a[0]),
  in: (v, a) => binary("in", v, a[0]),
};

interface Scope {
  vars: { [k: string]: any };
  parent: Scope | null;
}

function lookup(s: Scope | null, name: string): any {
  while (s) {
    if (Object.prototype.hasOwnProperty.call(s.vars, name)) return s.vars[name];
    s = s.parent;
  }
  return undefined;
}

function selectOrReject(items: any[], a: any[], _kw: any, attr: boolean, keep: boolean, env: Env): any[] {
  const out: any[] = [];
  for (let i = 0; i < items.length; i++) {
    const v = attr ? attrPath(items[i], a[0]) : items[i];
    const tname = attr ? a[1] : a[0];
    const targs = attr ? a.slice(2) : a.slice(1);
    const ok = tname === undefined ? truthy(v) : runTest(String(tname), v, targs, env);
    if (ok === keep) out.push(items[i]);
  }
  return out;
}

function runTest(name: string, v: any, args: any[], _env: Env): boolean {
  const t = TESTS[name];
  if (t) return t(v, args);
  if (name === "==") return pyEq(v, args[0]);
  throw TemplateError("no test named '" + name + "'");
}

interface Env {
  tojsonEnsureAscii: boolean;
}

function applyFilter(name: string, v: any, a: any[], kw: { [k: string]: any }, env: Env): any {
  switch (name) {
    case "tojson": {
      const ind = kw.indent !== undefined ? kw.indent : a.length ? a[0] : null;
      const seps = kw.separators !== undefined && kw.separators !== null ? kw.separators : null;
      const out = pyJson(v, ind, seps, kw.sort_keys === true);
      if (kw.ensure_ascii === true)
        return out.replace(/[\u007f-\uffff]/g, function (c) {
          return "\\u" + ("0000" + c.charCodeAt(0).toString(16)).slice(-4);
        });
      return out;
    }
    case "trim":
      return pyStrip(pyStr(v), a.length && a[0] !== null && a[0] !== undefined ? String(a[0]) : null, true, true);
    case "length":
    case "count":
      return length(v);
    case "string":
      return pyStr(v);
    case "int": {
      const n = typeof v === "string" ? parseInt(v, 10) : Number(v);
      return isNaN(n) ? (a.length ? a[0] : 0) : n < 0 ? Math.ceil(n) : Math.floor(n);
    }
    case "float": {
      const n = Number(v);
      return isNaN(n) ? (a.length ? a[0] : 0) : n;
    }
    case "lower":
      return pyStr(v).toLowerCase();
    case "upper":
      return pyStr(v).toUpperCase();
    case "capitalize":
      return (strMethod(pyStr(v), "capitalize") as Fn)([], {});
    case "title":
      return (strMethod(pyStr(v), "title") as Fn)([], {});
    case "first":
      return iterate(v)[0];
    case "last": {
      const it = iterate(v);
      return it[it.length - 1];
    }
    case "list":
      return iterate(v).slice();
    case "reverse":
      return typeof v === "string" ? v.split("").reverse().join("") : iterate(v).slice().reverse();
    case "join": {
      const sep = a.length ? String(a[0]) : kw.d !== undefined ? String(kw.d) : "";
      const it = iterate(v);
      const out: string[] = [];
      for (let i = 0; i < it.length; i++)
        out.push(pyStr(kw.attribute !== undefined ? attrPath(it[i], kw.attribute) : it[i]));
      return out.join(sep);
    }
    case "default":
    case "d": {
      const dflt = a.length ? a[0] : kw.default_value !== undefined ? kw.default_value : "";
      const bool = a.length > 1 ? a[1] : kw.boolean === true;
      return v === undefined || (bool && !truthy(v)) ? dflt : v;
    }
    case "items":
      if (v === undefined) return [];
      return (dictMethod(v, "items") as Fn)([], {});
    case "dictsort": {
      const items = (dictMethod(v, "items") as Fn)([], {});
      items.sort(function (x: any, y: any) {
        const p = String(x[0]).toLowerCase();
        const q = String(y[0]).toLowerCase();
        return p < q ? -1 : p > q ? 1 : 0;
      });
      return items;
    }
    case "replace":
      return (strMethod(pyStr(v), "replace") as Fn)(a, {});
    case "map": {
      const it = iterate(v);
      const out: any[] = [];
      for (let i = 0; i < it.length; i++) {
        if (kw.attribute !== undefined) {
          const x = attrPath(it[i], kw.attribute);
          out.push(x === undefined && kw.default !== undefined ? kw.default : x);
        } else out.push(applyFilter(String(a[0]), it[i], a.slice(1), {}, env));
      }
      return out;
    }
    case "select":
      return selectOrReject(iterate(v), a, kw, false, true, env);
    case "reject":
      return selectOrReject(iterate(v), a, kw, false, false, env);
    case "selectattr":
      return selectOrReject(iterate(v), a, kw, true, true, env);
    case "rejectattr":
      return selectOrReject(iterate(v), a, kw, true, false, env);
    case "unique": {
      const it = iterate(v);
      const out: any[] = [];
      for (let i = 0; i < it.length; i++) {
        let seen = false;
        for (let k = 0; k < out.length; k++) if (pyEq(out[k], it[i])) seen = true;
        if (!seen) out.push(it[i]);
      }
      return out;
    }
    case "sort": {
      const out = iterate(v).slice();
      const rev = kw.reverse === true || a[0] === true;
      out.sort(function (x: any, y: any) {
        const p = kw.attribute !== undefined ? attrPath(x, kw.attribute) : x;
        const q = kw.attribute !== undefined ? attrPath(y, kw.attribute) : y;
        return (p < q ? -1 : p > q ? 1 : 0) * (rev ? -1 : 1);
      });
      return out;
    }
    case "sum": {
      const it = iterate(v);
      let s = 0;
      for (let i = 0; i < it.length; i++) s += kw.attribute !== undefined ? attrPath(it[i], kw.attribute) : it[i];
      return s;
    }
    case "abs":
      return Math.abs(v);
    case "round": {
      const p = a.length ? a[0] : 0;
      const f = Math.pow(10, p);
      return Math.round(v * f) / f;
    }
    case "indent": {
      const w = a.length ? a[0] : kw.width !== undefined ? kw.width : 4;
      const pad = typeof w === "string" ? w : new Array(w + 1).join(" ");
      const first = a.length > 1 ? a[1] : kw.first === true;
      const lines = pyStr(v).split("\n");
      for (let i = first ? 0 : 1; i < lines.length; i++) if (lines[i] || kw.blank === true) lines[i] = pad + lines[i];
      return lines.join("\n");
    }
    case "safe":
    case "e":
    case "escape":
    case "forceescape":
      return v;
    case "wordcount":
      return (strMethod(pyStr(v), "split") as Fn)([], {}).length;
    case "max":
    case "min": {
      const it = iterate(v).slice();
      if (!it.length) return undefined;
      let best = it[0];
      for (let i = 1; i < it.length; i++) if (name === "max" ? it[i] > best : it[i] < best) best = it[i];
      return best;
    }
    case "attr":
      return getAttr(v, a[0], false);
  }
  throw TemplateError("no filter named '" + name + "'");
}

interface Interp {
  env: Env;
}

function evalArgs(it: Interp, args: Ast[], s: Scope): { pos: any[]; kw: { [k: string]: any } } {
  const pos: any[] = [];
  const kw: { [k: string]: any } = {};
  for (let i = 0; i < (args || []).length; i++) {
    const a = args[i];
    if (a.type === "KeywordArgumentExpression") kw[a.key.value] = ev(it, a.value, s);
    else if (a.type === "SpreadExpression") {
      const arr = ev(it, a.argument, s);
      for (let k = 0; k < arr.length; k++) pos.push(arr[k]);
    } else pos.push(ev(it, a, s));
  }
  return { pos: pos, kw: kw };
}

function ev(it: Interp, n: Ast, s: Scope): any {
  switch (n.type) {
    case "StringLiteral":
      return n.value;
    case "IntegerLiteral":
    case "FloatLiteral":
      return n.value;
    case "Identifier":
      return lookup(s, n.value);
    case "ArrayLiteral":
    case "TupleLiteral": {
      const out: any[] = [];
      for (let i = 0; i < n.value.length; i++) out.push(ev(it, n.value[i], s));
      return out;
    }
    case "ObjectLiteral": {
      const o: { [k: string]: any } = {};
      for (let i = 0; i < n.pairs.length; i++) o[pyStr(ev(it, n.pairs[i][0], s))] = ev(it, n.pairs[i][1], s);
      return o;
    }
    case "MemberExpression": {
      const obj = ev(it, n.object, s);
      if (n.computed && n.property.type === "SliceExpression") {
        const p = n.property;
        return slice(
          obj,
          p.start ? ev(it, p.start, s) : null,
          p.stop ? ev(it, p.stop, s) : null,
          p.step ? ev(it, p.step, s) : null,
        );
      }
      const key = n.computed ? ev(it, n.property, s) : n.property.value;
      return getAttr(obj, key, n.computed);
    }
    case "CallExpression": {
      const f = ev(it, n.callee, s);
      const a = evalArgs(it, n.args, s);
      if (typeof f !== "function")
        throw TemplateError(
          "'" + (n.callee.value || (n.callee.property && n.callee.property.value) || "object") + "' is not callable",
        );
      return f(a.pos, a.kw);
    }
    case "BinaryExpression": {
      const op = n.operator.value;
      const l = ev(it, n.left, s);
      if (op === "and") return truthy(l) ? ev(it, n.right, s) : l;
      if (op === "or") return truthy(l) ? l : ev(it, n.right, s);
      return binary(op, l, ev(it, n.right, s));
    }
    case "UnaryExpression": {
      const v = ev(it, n.argument, s);
      if (n.operator.value === "not") return !truthy(v);
      if (n.operator.value === "-") return -v;
      return +v;
    }
    case "FilterExpression": {
      const v = ev(it, n.operand, s);
      if (n.filter.type === "Identifier") return applyFilter(n.filter.value, v, [], {}, it.env);
      const a = evalArgs(it, n.filter.args, s);
      return applyFilter(n.filter.callee.value, v, a.pos, a.kw, it.env);
    }
    case "TestExpression": {
      const v = ev(it, n.operand, s);
      let name: string;
      let args: any[] = [];
      if (n.test.type === "CallExpression") {
        name = n.test.callee.value;
        args = evalArgs(it, n.test.args, s).pos;
      } else name = n.test.value;
      const r = runTest(name, v, args, it.env);
      return n.negate ? !r : r;
    }
    case "Ternary":
      return truthy(ev(it, n.condition, s)) ? ev(it, n.trueExpr, s) : n.falseExpr ? ev(it, n.falseExpr, s) : undefined;
    case "SelectExpression":
      return truthy(ev(it, n.test, s)) ? ev(it, n.lhs, s) : undefined;
  }
  throw TemplateError("unsupported template expression " + n.type);
}

function assign(it: Interp, target: Ast, value: any, s: Scope): void {
  if (target.type === "Identifier") s.vars[target.value] = value;
  else if (target.type === "TupleLiteral") {
    if (!isArr(value) || value.length !== target.value.length) throw TemplateError("cannot unpack " + typeName(value));
    for (let i = 0; i < target.value.length; i++) assign(it, target.value[i], value[i], s);
  } else if (target.type === "MemberExpression") {
    const obj = ev(it, target.object, s);
    if (!isNs(obj)) throw TemplateError("cannot assign attribute on non-namespace object");
    obj.a[target.property.value] = value;
  } else throw TemplateError("invalid assignment target");
}

function renderBlock(it: Interp, body: Ast[], s: Scope, out: string[]): void {
  for (let i = 0; i < body.length; i++) {
    const n = body[i];
    switch (n.type) {
      case "StringLiteral":
        out.push(n.value);
        break;
      case "Comment":
        break;
      case "If":
        renderBlock(it, truthy(ev(it, n.test, s)) ? n.body : n.alternate, s, out);
        break;
      case "Set":
        if (n.value) assign(it, n.assignee, ev(it, n.value, s), s);
        else {
          const o: string[] = [];
          renderBlock(it, n.body, s, o);
          assign(it, n.assignee, o.join(""), s);
        }
        break;
      case "For":
        renderFor(it, n, s, out);
        break;
      case "Break":
        throw BREAK;
      case "Continue":
        throw CONTINUE;
      case "Macro":
        s.vars[n.name.value] = macro(it, n, s);
        break;
      default: {
        const v = ev(it, n, s);
        out.push(pyStr(v));
      }
    }
  }
}

function macro(it: Interp, n: Ast, defScope: Scope): Fn {
  return fn(function (pos, kw) {
    const sc: Scope = { vars: {}, parent: defScope };
    for (let i = 0; i < n.args.length; i++) {
      const p = n.args[i];
      const name = p.type === "KeywordArgumentExpression" ? p.key.value : p.value;
      let v = i < pos.length ? pos[i] : kw[name];
      if (v === undefined && p.type === "KeywordArgumentExpression") v = ev(it, p.value, sc);
      sc.vars[name] = v;
    }
    const o: string[] = [];
    renderBlock(it, n.body, sc, o);
    return o.join("");
  });
}

function renderFor(it: Interp, n: Ast, s: Scope, out: string[]): void {
  const scope: Scope = { vars: {}, parent: s };
  let iterable: Ast = n.iterable;
  let test: Ast = null;
  if (iterable.type === "SelectExpression") {
    test = iterable.test;
    iterable = iterable.lhs;
  }
  const all = iterate(ev(it, iterable, scope));
  let items: any[] = all;
  if (test) {
    items = [];
    for (let i = 0; i < all.length; i++) {
      const ts: Scope = { vars: {}, parent: scope };
      assign(it, n.loopvar, all[i], ts);
      if (truthy(ev(it, test, ts))) items.push(all[i]);
    }
  }
  for (let i = 0; i < items.length; i++) {
    scope.vars.loop = {
      index: i + 1,
      index0: i,
      revindex: items.length - i,
      revindex0: items.length - i - 1,
      first: i === 0,
      last: i === items.length - 1,
      length: items.length,
      previtem: i > 0 ? items[i - 1] : undefined,
      nextitem: i < items.length - 1 ? items[i + 1] : undefined,
    };
    assign(it, n.loopvar, items[i], scope);
    try {
      renderBlock(it, n.body, scope, out);
    } catch (e) {
      if (e === CONTINUE) continue;
      if (e === BREAK) break;
      throw e;
    }
  }
  if (!items.length && n.defaultBlock) renderBlock(it, n.defaultBlock, scope, out);
}

function globals(): { [k: string]: any } {
  return {
    true: true,
    false: false,
    none: null,
    True: true,
    False: false,
    None: null,
    raise_exception: fn(function (a) {
      throw TemplateError(pyStr(a[0]));
    }),
    namespace: fn(function (a, kw) {
      const o: { [k: string]: any } = {};
      if (a.length && isDict(a[0])) for (const k in a[0]) o[k] = a[0][k];
      for (const k in kw) o[k] = kw[k];
      return { __ns: NS_MARK, a: o };
    }),
    dict: fn(function (a, kw) {
      const o: { [k: string]: any } = {};
      if (a.length && isDict(a[0])) for (const k in a[0]) o[k] = a[0][k];
      for (const k in kw) o[k] = kw[k];
      return o;
    }),
    range: fn(function (a) {
      const start = a.length > 1 ? a[0] : 0;
      const stop = a.length > 1 ? a[1] : a[0];
      const step = a.length > 2 ? a[2] : 1;
      const out: number[] = [];
      if (step > 0) for (let i = start; i < stop; i += step) out.push(i);
      else for (let i = start; i > stop; i += step) out.push(i);
      return out;
    }),
    strftime_now: fn(function (a) {
      const d = new Date();
      const M = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
      ];
      const two = (x: number) => (x < 10 ? "0" : "") + x;
      return String(a[0]).replace(/%([YmdbBHMS%])/g, function (_m: string, c: string) {
        return c === "Y"
          ? String(d.getFullYear())
          : c === "m"
            ? two(d.getMonth() + 1)
            : c === "d"
              ? two(d.getDate())
              : c === "b"
                ? M[d.getMonth()].substr(0, 3)
                : c === "B"
                  ? M[d.getMonth()]
                  : c === "H"
                    ? two(d.getHours())
                    : c === "M"
                      ? two(d.getMinutes())
                      : c === "S"
                        ? two(d.getSeconds())
                        : "%";
      });
    }),
  };
}

/** Renders a parsed template (templateAst's output) with the given variables. */
export function renderTemplate(ast: Ast, vars: { [k: string]: any }): string {
  const root: Scope = { vars: globals(), parent: null };
  const top: Scope = { vars: {}, parent: root };
  for (const k in vars) top.vars[k] = vars[k];
  const out: string[] = [];
  const it: Interp = { env: { tojsonEnsureAscii: false } };
  try {
    renderBlock(it, ast.body, top, out);
  } catch (e) {
    if (e === BREAK || e === CONTINUE) throw TemplateError("break/continue outside a loop");
    throw e;
  }
  return out.join("");
}
