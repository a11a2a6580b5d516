#!/usr/bin/env python3
"""Reference renderer for the render-parity test.

Reads a JSONL corpus (one {"id", "family", "endpoint", "body"} per line) and a
JSON map family -> tokenizer directory, and prints one JSON line per request:
{"id", "ids"} or {"id", "error"}. Rendering is HF transformers'
apply_chat_template on the conversation vLLM's OpenAI / Anthropic front ends
build (written here from vLLM's entrypoints/chat_utils.py and
anthropic/serving.py), tokenized the way vLLM tokenizes: chat prompts without
added special tokens, completion prompts with them. No torch needed.

usage: render_reference.py CORPUS.jsonl TOKENIZERS.json > OUT.jsonl
"""
import json
import sys

import jinja2
import jinja2.nodes
from transformers import AutoTokenizer

MEDIA_TYPES = {
    "image_url": "image", "input_image": "image", "image_embeds": "image", "image_pil": "image",
    "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video",
}
TEXT_TYPES = ("text", "input_text", "output_text", "refusal", "thinking")
PLACEHOLDERS = {"image": "<##IMAGE##>", "audio": "<##AUDIO##>", "video": "<##VIDEO##>"}


def content_format(template):
    """'openai' when the template loops over a message's content (vLLM's AST check)."""
    env = jinja2.Environment()
    ast = env.parse(template)
    msg_vars = set()
    for node in ast.find_all(jinja2.nodes.For):
        it = node.iter
        names = [n.name for n in it.find_all(jinja2.nodes.Name)] if not isinstance(it, jinja2.nodes.Name) else [it.name]
        if any("messages" in n for n in names) and isinstance(node.target, jinja2.nodes.Name):
            msg_vars.add(node.target.name)
    for node in ast.find_all(jinja2.nodes.For):
        it = node.iter
        while isinstance(it, jinja2.nodes.Filter):
            it = it.node
        if isinstance(it, jinja2.nodes.Getitem) and isinstance(it.arg, jinja2.nodes.Const) and it.arg.value == "content":
            base = it.node
        elif isinstance(it, jinja2.nodes.Getattr) and it.attr == "content":
            base = it.node
        else:
            continue
        if isinstance(base, jinja2.nodes.Name) and base.name in msg_vars:
            return "openai"
    return "string"


def part_type(p):
    t = p.get("type")
    if isinstance(t, str) and p.get("uuid") is None:
        return t
    for k in ("image_url", "image_pil", "image_embeds", "audio_embeds", "audio_url", "input_audio", "video_url", "tool_reference"):
        if p.get(k) is not None:
            return k
    raise ValueError("content part has no type")


def parse_content(content, fmt):
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = content
    wrap = fmt == "openai"
    out, media = [], []
    for p in parts:
        if isinstance(p, str):
            out.append({"type": "text", "text": p} if wrap else p)
            continue
        t = part_type(p)
        if t in TEXT_TYPES:
            val = p.get("refusal") if t == "refusal" else p.get("thinking") if t == "thinking" else p.get("text")
            if val is None and t in ("text", "refusal"):
                continue
            out.append({"type": "text", "text": val} if wrap else val)
        elif t == "tool_reference":
            out.append({"type": "tool_reference", "name": p.get("name")} if wrap else p.get("name"))
        elif t in MEDIA_TYPES:
            if wrap:
                out.append({"type": MEDIA_TYPES[t]})
            else:
                media.append(MEDIA_TYPES[t])
        else:
            raise ValueError("unsupported part " + str(t))
    if wrap:
        return out
    text = "\n".join(out)
    if not media:
        return text
    counts = {}
    for m in media:
        counts[PLACEHOLDERS[m]] = counts.get(PLACEHOLDERS[m], 0) + 1
    missing = []
    for ph, n in counts.items():
        missing += [ph] * (n - text.count(ph))
    return "\n".join(missing + ([text] if text else []))


def vllm_conversation(messages, fmt):
    conv = []
    for msg in messages:
        role = msg["role"]
        res = {"role": role, "content": parse_content(msg.get("content"), fmt)}
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                res["tool_calls"] = json.loads(json.dumps(msg["tool_calls"]))
            if msg.get("reasoning") is not None:
                res["reasoning"] = msg["reasoning"]
                res["reasoning_content"] = msg["reasoning"]
        elif role == "tool":
            if "tool_call_id" in msg:
                res["tool_call_id"] = msg["tool_call_id"]
            c = res["content"]
            if isinstance(c, list) and not any(isinstance(i, dict) and i.get("type") != "text" for i in c):
                texts = [i.get("text", "") for i in c if isinstance(i, dict) and i.get("type") == "text"]
                res["content"] = "\n".join(texts) if texts else ""
        if isinstance(msg.get("name"), str):
            res["name"] = msg["name"]
        if isinstance(msg.get("task"), str):
            res["task"] = msg["task"]
        if role == "developer":
            res["tools"] = msg.get("tools")
        conv.append(res)
    for m in conv:
        if m["role"] == "assistant" and isinstance(m.get("tool_calls"), list):
            if not m["tool_calls"]:
                del m["tool_calls"]
                continue
            for item in m["tool_calls"]:
                a = item["function"].get("arguments")
                if isinstance(a, str):
                    try:
                        item["function"]["arguments"] = json.loads(a)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(a, (dict, list)):
                    item["function"]["arguments"] = {}
    return conv


def vllm_tools(tools):
    if not tools:
        return None
    out = []
    for t in tools:
        f = t["function"]
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        fn.update({k: v for k, v in f.items() if k not in fn})
        tool = {"type": t.get("type", "function"), "function": fn}
        tool.update({k: v for k, v in t.items() if k not in ("type", "function")})
        out.append(tool)
    return out


def image_url(src):
    if src.get("type") == "url":
        return src.get("url", "")
    return f"data:{src.get('media_type', 'image/jpeg')};base64,{src.get('data', '')}"


def anthropic_to_openai(body):
    msgs, system = [], []

    def add_system(s):
        if isinstance(s, str):
            system.append(s)
        else:
            for b in s:
                if b.get("type") == "text" and b.get("text") and not b["text"].startswith("x-anthropic-billing-header"):
                    system.append(b["text"])

    if body.get("system"):
        add_system(body["system"])
    for m in body["messages"]:
        if m["role"] == "system":
            add_system(m["content"])
    if system:
        msgs.append({"role": "system", "content": "".join(system)})
    for m in body["messages"]:
        if m["role"] == "system":
            continue
        om = {"role": m["role"]}
        if isinstance(m["content"], str):
            om["content"] = m["content"]
        else:
            parts, calls, reasoning = [], [], []
            for b in m["content"]:
                t = b.get("type")
                if t == "text" and b.get("text"):
                    parts.append({"type": "text", "text": b["text"]})
                elif t == "image" and b.get("source"):
                    parts.append({"type": "image_url", "image_url": {"url": image_url(b["source"])}})
                elif t == "thinking" and b.get("thinking") is not None:
                    reasoning.append(b["thinking"])
                elif t == "tool_use":
                    calls.append({"id": b.get("id") or "call_0", "type": "function",
                                  "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}})
                elif t == "tool_result":
                    if m["role"] == "user":
                        text, images = "", []
                        if isinstance(b.get("content"), str):
                            text = b["content"]
                        elif isinstance(b.get("content"), list):
                            ts = []
                            for it in b["content"]:
                                if not isinstance(it, dict):
                                    continue
                                if it.get("type") == "text":
                                    ts.append(it.get("text", ""))
                                elif it.get("type") == "image":
                                    u = image_url(it.get("source", {}))
                                    if u:
                                        images.append(u)
                            text = "\n".join(ts)
                        msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": text or ""})
                        if images:
                            msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
                    else:
                        parts.append({"type": "text", "text": f"Tool result: {b.get('content') or ''}"})
            if reasoning:
                om["reasoning"] = "".join(reasoning)
            if calls:
                om["tool_calls"] = calls
            if parts:
                om["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        if not (m["role"] == "user" and "content" not in om):
            msgs.append(om)
    tools = None
    if body.get("tools") is not None:
        tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description"),
                                                    "parameters": t.get("input_schema"), "defer_loading": t.get("defer_loading")}}
                 for t in body["tools"]] or None
    return msgs, tools


def render(tok, fmt, endpoint, body):
    if endpoint == "completions":
        add = body.get("add_special_tokens", True)
        return tok.encode(body["prompt"], add_special_tokens=add)
    if endpoint == "messages":
        messages, tools = anthropic_to_openai(body)
    else:
        messages, tools = body["messages"], vllm_tools(body.get("tools"))
    conv = vllm_conversation(messages, fmt)
    agp = body.get("add_generation_prompt", True)
    cfm = body.get("continue_final_message", False)
    if agp and cfm:
        raise ValueError("both add_generation_prompt and continue_final_message")
    kwargs = {"reasoning_effort": body.get("reasoning_effort")}
    for k, v in (body.get("chat_template_kwargs") or {}).items():
        if k not in ("chat_template", "tokenize", "continue_final_message"):
            kwargs[k] = v
    kwargs.setdefault("add_generation_prompt", agp)
    kwargs.setdefault("tools", tools)
    kwargs.setdefault("documents", body.get("documents"))
    prompt = tok.apply_chat_template(conv, tokenize=False, continue_final_message=cfm, **kwargs)
    return tok.encode(prompt, add_special_tokens=body.get("add_special_tokens", False))


def main():
    corpus_path, dirs_path = sys.argv[1], sys.argv[2]
    dirs = json.load(open(dirs_path))
    toks, fmts = {}, {}
    for fam, d in dirs.items():
        toks[fam] = AutoTokenizer.from_pretrained(d)
        fmts[fam] = content_format(toks[fam].chat_template or "")
    out = sys.stdout
    for line in open(corpus_path, encoding="utf-8"):
        if not line.strip():
            continue
        item = json.loads(line)
        try:
            ids = render(toks[item["family"]], fmts[item["family"]], item["endpoint"], item["body"])
            out.write(json.dumps({"id": item["id"], "ids": list(ids)}) + "\n")
        except Exception as e:  # the engine answers these with a 400
            out.write(json.dumps({"id": item["id"], "error": type(e).__name__ + ": " + str(e)[:200]}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
