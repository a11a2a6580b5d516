// vLLM's LoRA gauge parsed as the router reads it, and the table's verdicts.
import { test } from "node:test";
import assert from "node:assert/strict";
import { memoryLoraTable, storeLoraTable, parseLoraInfo, LORA_RECENT_MS, LoraTable } from "../../core/lora";
import { memStore } from "../../core/store";

// The table's rules are the same in memory (the router) and in a store (nginx's shared dict, njs): both are checked.
const TABLES: [string, () => LoraTable][] = [
  ["memory", memoryLoraTable],
  ["store", () => storeLoraTable(memStore())],
];
import {
  parseSessionHeaders,
  sessionFromHeaders,
  sessionHeadersProblem,
  DEFAULT_SESSION_HEADERS,
} from "../../core/session-headers";

// Shaped as vLLM's Prometheus logger writes it: one series per pair of lists ever seen, valued at the time it was last current.
const VLLM = `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7650001e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="x\\"y"} 1.7650003e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7650002e+09
vllm:num_requests_running{engine="0",model_name="m"} 2
`;

test("the current LoRA series is the one with the latest time; lists split on commas, escapes undone", () => {
  assert.deepEqual(parseLoraInfo(VLLM), { maxLora: 2, running: ["sql-lora", "chat-lora"], waiting: ['x"y'] });
  assert.equal(parseLoraInfo('vllm:num_requests_running{engine="0"} 1\n'), null, "no gauge: not a LoRA engine");
  assert.equal(parseLoraInfo('# vllm:lora_requests_info{max_lora="1"} 5\n'), null, "a comment is not a sample");
});

for (const [kind, make] of TABLES)
  test(`${kind}: a worker is loaded, recently used, has a free slot, or is full of other adapters`, () => {
    const t = make();
    assert.equal(t.fit("w", "A", 0), "unknown");
    t.set("w", { maxLora: 2, running: ["A"], waiting: [] });
    assert.equal(t.fit("w", "A", 0), "loaded");
    assert.equal(t.fit("w", "B", 0), "free-slot");
    t.note("w", "B", 1000);
    assert.equal(t.fit("w", "B", 1000), "loaded", "sent since the last scrape");
    assert.equal(t.fit("w", "C", 1000), "full", "A running, B sent: both slots taken");
    t.set("w", { maxLora: 2, running: [], waiting: [] });
    assert.equal(t.fit("w", "B", 2000), "recent");
    assert.equal(t.fit("w", "B", 1000 + LORA_RECENT_MS), "free-slot");
    assert.ok(t.isAdapter("A") && t.isAdapter("B") === false);
    t.markAdapter("B");
    assert.ok(t.isAdapter("B"));
  });

test("session headers: the configured one first, then the agents' list in order; names checked", () => {
  const h: Record<string, string> = { "x-opencode-session": "oc", "x-claude-code-session-id": "cc" };
  const list = parseSessionHeaders(DEFAULT_SESSION_HEADERS);
  assert.equal(
    sessionFromHeaders((n) => h[n], "x-session-id", list),
    "cc",
  );
  assert.equal(
    sessionFromHeaders((n) => ({ ...h, "x-session-id": "mine" })[n], "x-session-id", list),
    "mine",
  );
  assert.equal(
    sessionFromHeaders((n) => h[n], "x-session-id", parseSessionHeaders("none")),
    null,
  );
  assert.deepEqual(parseSessionHeaders(" A, b ,a"), ["a", "b"]);
  assert.equal(sessionHeadersProblem(DEFAULT_SESSION_HEADERS), null);
  assert.match(sessionHeadersProblem("x-ok,bad header") ?? "", /not a header name/);
});

for (const [kind, make] of TABLES)
  test(`${kind}: the memory of resident adapters keeps max_lora of them, least recently sent out first`, () => {
    const t = make();
    t.set("w", { maxLora: 2, running: [], waiting: [] });
    t.note("w", "A", 1);
    t.note("w", "B", 2);
    t.note("w", "C", 3);
    t.set("w", { maxLora: 2, running: [], waiting: [] });
    assert.equal(t.fit("w", "A", 4), "evicts", "A was pushed out by C, as the engine's LRU does");
    assert.equal(t.fit("w", "B", 4), "recent");
    assert.equal(t.fit("w", "C", 4), "recent");
  });

test("store: every table over one store sees the others' scrapes, sends and adapter names (nginx's worker processes share one dict)", () => {
  const st = memStore();
  const a = storeLoraTable(st);
  const b = storeLoraTable(st);
  a.set("w", { maxLora: 1, running: [], waiting: [] });
  a.note("w", "A", 10);
  assert.equal(b.fit("w", "A", 10), "loaded");
  assert.equal(b.fit("w", "B", 10), "full");
  b.markAdapter("B");
  assert.ok(a.isAdapter("B"));
  b.drop("w");
  assert.equal(a.fit("w", "A", 10), "unknown");
  st.set("LR:x", "not json");
  assert.equal(a.fit("x", "A", 0), "unknown", "a damaged entry reads as none");
});
