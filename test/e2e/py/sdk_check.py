"""Drives the official openai and anthropic Python SDKs against one base URL
(the simulator, Envoy or nginx) and checks what they parse. Prints one JSON
line: {"ok": true, "checks": [...]} or exits non-zero with the failure.
Usage: python3 sdk_check.py http://127.0.0.1:PORT"""
import json
import sys

try:
    import openai
    import anthropic
except ImportError as e:  # the node test turns this into a skip with the reason
    print(json.dumps({"skip": f"SDK not importable: {e}"}))
    sys.exit(0)

base = sys.argv[1]
checks = []


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    if name not in checks:
        checks.append(name)


oa = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, timeout=30)
msgs = [{"role": "user", "content": "Tell me about the routing of long prompts, twice over."}]

r = oa.chat.completions.create(model="sim-model", messages=msgs, max_tokens=5)
check("openai chat", r.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4", r.choices[0].message.content)
check("openai chat usage", r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 5, str(r.usage))
check("openai chat cached_tokens", r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens >= 0, str(r.usage))
r2 = oa.chat.completions.create(model="sim-model", messages=msgs, max_tokens=5)
check("openai chat cache hit reported", r2.usage.prompt_tokens_details.cached_tokens > 0, str(r2.usage))

parts = []
finish = None
with oa.chat.completions.create(model="sim-model", messages=msgs, max_tokens=6, stream=True) as s:
    for chunk in s:
        check("openai chunk object", chunk.object == "chat.completion.chunk", chunk.object)
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
check("openai chat stream", "".join(parts) == "tok0 tok1 tok2 tok3 tok4 tok5", "".join(parts))
check("openai chat stream finish", finish == "length", str(finish))

c = oa.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=3)
check("openai completions", c.object == "text_completion" and c.choices[0].text == "tok0 tok1 tok2", c.model_dump_json())
c = oa.completions.create(model="sim-model", prompt=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], max_tokens=2)
check("openai completions token ids", c.usage.prompt_tokens == 18, str(c.usage))
text = []
for chunk in oa.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=4, stream=True):
    check("openai completions chunk object", chunk.object == "text_completion", chunk.object)
    text.extend(x.text for x in chunk.choices)
check("openai completions stream", "".join(text) == "tok0 tok1 tok2 tok3", "".join(text))

an = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0, timeout=30)
amsgs = [{"role": "user", "content": "Explain KV caches to a new engineer, please."}]
m = an.messages.create(model="sim-model", max_tokens=4, messages=amsgs)
check("anthropic message", m.type == "message" and m.content[0].text == "tok0 tok1 tok2 tok3", m.model_dump_json())
check("anthropic usage", m.usage.output_tokens == 4 and m.usage.input_tokens > 0 and m.stop_reason == "max_tokens", str(m.usage))
m = an.messages.create(model="sim-model", max_tokens=4, messages=amsgs)
check("anthropic cache read reported", (m.usage.cache_read_input_tokens or 0) > 0, str(m.usage))

kinds = []
with an.messages.stream(model="sim-model", max_tokens=5, messages=amsgs) as s:
    for ev in s:
        kinds.append(ev.type)
    final = s.get_final_message()
check("anthropic stream events", [k for k in kinds if k in ("message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop")] == ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"], str(kinds))
check("anthropic stream text", final.content[0].text == "tok0 tok1 tok2 tok3 tok4", final.model_dump_json())
check("anthropic stream usage", final.usage.output_tokens == 5 and final.stop_reason == "max_tokens", final.model_dump_json())

print(json.dumps({"ok": True, "checks": checks, "openai": openai.__version__, "anthropic": anthropic.__version__}))
