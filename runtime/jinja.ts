// Chat templates are parsed in Node by @huggingface/jinja's parser and rendered
// by core/jinja.ts (Python semantics, njs-safe), so Envoy and nginx render with
// one interpreter. The AST is turned into plain JSON (its Maps into pairs) so
// the njs bundle can carry it.
import { parse, tokenize } from "@huggingface/jinja";

function plain(v: any): any {
  if (v === null || typeof v !== "object") return v;
  if (v instanceof Map) {
    const pairs: any[] = [];
    v.forEach((val: any, key: any) => pairs.push([plain(key), plain(val)]));
    return pairs;
  }
  if (Array.isArray(v)) return v.map(plain);
  const o: Record<string, any> = {};
  for (const k of Object.keys(v)) o[k] = plain(v[k]);
  if (o.type === "ObjectLiteral") {
    o.pairs = o.value;
    delete o.value;
  }
  return o;
}

/** The template's AST as plain JSON, with transformers' trim_blocks + lstrip_blocks applied. */
export function templateAst(src: string): any {
  return plain(parse(tokenize(src, { lstrip_blocks: true, trim_blocks: true })));
}
