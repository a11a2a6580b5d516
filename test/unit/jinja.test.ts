// core/jinja.ts against jinja2 itself, in the environment transformers renders
// chat templates in (test/jinja_reference.py): each snippet's output, or the
// fact that it fails, must be the same.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as path from "path";
import { renderTemplate } from "../../core/jinja";
import { templateAst } from "../../runtime/jinja";
import { needs, pythonMissing } from "../tools";

const msgs = [
  { role: "system", content: "  Be brief.\n" },
  { role: "user", content: "Zürich → 東京? 🚀" },
  {
    role: "assistant",
    content: null,
    tool_calls: [{ function: { name: "f", arguments: { b: 1, a: [true, null, 0.5, 'x"y'] } } }],
  },
  { role: "tool", content: "ok" },
];
const V = {
  messages: msgs,
  tools: [
    { type: "function", function: { name: "f", description: null, parameters: { type: "object", properties: {} } } },
  ],
  add_generation_prompt: true,
  n: 7,
  s: "\n\n abc \t\n",
  d: { k: "v", z: 1, a: 2 },
  e: [],
  none: null,
};

const CASES: string[] = [
  "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip('\\n') }}|{{ s.rstrip('\\n') }}|{{ 'xxhixx'.strip('x') }}",
  "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'x'.split('y') }}",
  "{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('lo', 'x')) }}{{ 'ab'.upper() }}{{ 'AB'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}",
  "{{ 'abc'.replace('b', 'X') }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'.find('c') }}|{{ 'abca'.count('a') }}",
  "{{ messages[0].content }}|{{ messages[-1]['role'] }}|{{ messages[1:3]|length }}|{{ messages[::-1][0].role }}|{{ 'abcdef'[1:4] }}|{{ 'abcdef'[::-2] }}|{{ [1,2,3,4][-2:] }}",
  "{{ tools[0] | tojson }}|{{ messages[2].tool_calls[0].function.arguments | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ 'é\"\\n' | tojson }}",
  "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ m.role }};{% endfor %}",
  "{% for m in messages if m.role != 'tool' %}{{ m.role }},{% else %}none{% endfor %}|{% for x in e %}x{% else %}empty{% endfor %}",
  "{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|{% for i in range(5) %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
  "{% set ns = namespace(c=0, last='') %}{% for m in messages %}{% set ns.c = ns.c + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.c }} {{ ns.last }}",
  "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{% endfor %}{{ x }}",
  "{% set block %}A{{ n }}B{% endset %}{{ block }}|{% set a, b = [1, 2] %}{{ a + b }}",
  "{{ none }}|{{ undefined_var }}|{{ none is none }}|{{ undefined_var is defined }}|{{ n is number }}|{{ s is string }}|{{ d is mapping }}|{{ e is iterable }}|{{ true is boolean }}",
  "{{ n is even }}{{ n is odd }}{{ 'x' if n is even else 'y' }}|{{ 'a' in 'cat' }}|{{ 'k' in d }}|{{ 2 in [1,2] }}|{{ 'q' not in d }}",
  "{{ 7 // 2 }} {{ 7 % 3 }} {{ -7 // 2 }} {{ 2 ** 10 }} {{ 1 - 3 }} {{ 3 * 'ab' }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ n ~ '!' }} {{ 'a' ~ none }}",
  "{{ [3,1,2]|sort }}|{{ ['b','a']|join('-') }}|{{ [1,2,2,3]|unique|list }}|{{ d|length }}|{{ [1,2,3]|first }}{{ [1,2,3]|last }}|{{ [1,2,3]|reverse|list }}|{{ [1,2,3]|sum }}",
  "{{ messages|map(attribute='role')|join(',') }}|{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('content')|map(attribute='role')|list }}",
  "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('k') }}|{{ d.get('nope', 'dflt') }}|{{ d.keys()|list }}|{{ d['z'] }}",
  "{{ undefined_var | default('D') }}|{{ '' | default('E', true) }}|{{ none | default('F') }}|{{ s | trim }}|{{ 'x' | string }}|{{ '42' | int + 1 }}",
  "{{ 'a' if n > 3 else 'b' }}|{{ 'yes' if undefined_var }}|{{ not e }}|{{ e or 'empty' }}|{{ n and 'and' }}",
  "{%- if true -%}\n  trimmed  \n{%- endif -%}|\n{% if true %}\n    kept\n{% endif %}\nend",
  "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c') }}",
  "{{ raise_exception('boom') }}",
  "{{ 'a' + 1 }}",
  "{{ 'x' + messages[2].tool_calls[0].function.arguments }}",
  "{{ undefined_var.attr }}",
  "{{ [1, 'a', none, true, {'k': [1.5]}] }}|{{ {'a': 1} }}|{{ 1.5 }}|{{ true }}",
  "{{ dict(a=1, b=2) | tojson }}|{{ {'x': 1, 'y': [2]} | tojson }}|{{ [] | tojson }}|{{ {} | tojson }}",
  "{{ '%s'|length }}{{ ' '.join(['a', 'b']) }}|{{ 'x,y'.rsplit(',', 1) }}",
];

test(
  "core/jinja.ts renders like jinja2 in transformers' environment (outputs and failures)",
  { skip: needs(pythonMissing(["transformers", "jinja2"], "'transformers>=5.24' 'jinja2>=3.1.6'")) },
  () => {
    const r = spawnSync("python3", [path.join(__dirname, "..", "jinja_reference.py")], {
      input: JSON.stringify(CASES.map((t) => ({ template: t, vars: V }))),
      encoding: "utf8",
      maxBuffer: 1 << 24,
    });
    assert.equal(r.status, 0, "jinja_reference.py (needs transformers + jinja2): " + r.stderr);
    const ref = JSON.parse(r.stdout) as { out?: string; error?: string }[];
    const bad: string[] = [];
    CASES.forEach((t, i) => {
      let out: string | null = null;
      let err = "";
      try {
        out = renderTemplate(templateAst(t), V);
      } catch (e) {
        err = (e as Error).message;
      }
      const want = ref[i];
      if (want.error !== undefined) {
        if (!err) bad.push(`#${i} ${t}\n  jinja2 fails (${want.error}) but we rendered ${JSON.stringify(out)}`);
      } else if (err || out !== want.out)
        bad.push(
          `#${i} ${t}\n  want ${JSON.stringify(want.out)}\n  got  ${err ? "error " + err : JSON.stringify(out)}`,
        );
    });
    assert.equal(bad.length, 0, bad.join("\n"));
  },
);
