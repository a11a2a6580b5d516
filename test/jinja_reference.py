#!/usr/bin/env python3
"""Renders template snippets with transformers' chat-template Jinja environment.

stdin: JSON list of {"template", "vars"}; stdout: JSON list of {"out"} or {"error"}.
The environment is the one apply_chat_template compiles templates in
(trim_blocks, lstrip_blocks, loopcontrols, tojson, raise_exception, namespace).
"""
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

cases = json.load(sys.stdin)
out = []
for c in cases:
    try:
        out.append({"out": _compile_jinja_template(c["template"]).render(**c["vars"])})
    except Exception as e:  # noqa: BLE001 - any template error is a result here
        out.append({"error": type(e).__name__ + ": " + str(e)})
json.dump(out, sys.stdout, ensure_ascii=False)
