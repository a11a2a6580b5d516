// @huggingface/jinja with Python's str.strip/lstrip/rstrip semantics. Its
// string methods ignore the `chars` argument (Qwen3's template calls
// .strip('\n') on reasoning, which must keep leading spaces) and trim JS's
// whitespace set, not Python's; the parity corpus caught both. The fix hooks
// the interpreter's call evaluation once, for string receivers only.
import { Interpreter, Template } from "@huggingface/jinja";

const PY_WS = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";

export function pyStrip(s: string, chars: string | null, left: boolean, right: boolean): string {
  const set = chars === null ? PY_WS : chars;
  // Code-point aware: a chars argument may hold astral characters.
  const cps = Array.from(s);
  const inSet = (c: string) => (set.length === 0 ? false : set.indexOf(c) >= 0);
  let i = 0;
  let j = cps.length;
  if (left) while (i < j && inSet(cps[i])) i++;
  if (right) while (j > i && inSet(cps[j - 1])) j--;
  if (i === 0 && j === cps.length) return s;
  return cps.slice(i, j).join("");
}

const STRIPS: Record<string, [boolean, boolean]> = { strip: [true, true], lstrip: [true, false], rstrip: [false, true] };
let patched = false;

function patch(): void {
  if (patched) return;
  patched = true;
  const proto = (Interpreter as any).prototype;
  const orig = proto.evaluateCallExpression;
  proto.evaluateCallExpression = function (expr: any, env: any) {
    const c = expr.callee;
    if (c && c.type === "MemberExpression" && !c.computed && c.property && STRIPS[c.property.value] && expr.args.length <= 1) {
      const obj = this.evaluate(c.object, env);
      if (obj && obj.type === "StringValue") {
        let chars: string | null = null;
        if (expr.args.length === 1) {
          const a = this.evaluate(expr.args[0], env);
          if (a.type === "StringValue") chars = a.value;
          else if (a.type !== "NullValue" && a.type !== "UndefinedValue") throw new Error("strip arg must be None or str");
        }
        const [l, r] = STRIPS[c.property.value];
        return new obj.constructor(pyStrip(obj.value, chars, l, r));
      }
    }
    return orig.call(this, expr, env);
  };
}

/** A chat template compiled for rendering with Python string semantics. */
export function pyTemplate(src: string): Template {
  patch();
  return new Template(src);
}
