// Model eligibility (core/models.ts) through the router's pick.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mk, feats, blocks, cache } from "./helpers";
import { memoryModelTable, ModelTable } from "../../core/models";
import { storeModelTable } from "../../core/state/keyed";
import { memStore } from "../../core/store";

// Node keeps the table in memory, njs in the shared dict: both behave the same.
const tables: [string, () => ModelTable][] = [
  ["memory", memoryModelTable],
  ["store", () => storeModelTable(memStore())],
];

function mkm(specs: Parameters<typeof mk>[0], table: ModelTable) {
  const m = mk(specs);
  m.st.models = table;
  return { ...m, t: table };
}

for (const [label, newTable] of tables) {
  test(`${label}: requests go only to workers serving their model (LoRA adapters are models); the cache cannot pull them elsewhere`, () => {
    const { st, r, t } = mkm([{ id: "a" }, { id: "b" }, { id: "c" }], newTable());
    t.set("a", ["qwen", "qwen-lora-sql"]);
    t.set("b", ["llama"]);
    t.set("c", ["qwen"]);
    const bs = blocks("p", 8);
    cache(st, r, "b", bs); // b holds the prompt, but does not serve qwen
    for (let i = 0; i < 6; i++) {
      const p = r.pick(feats(bs, { model: "qwen" }));
      assert.ok(["a", "c"].includes(p.target.id));
      p.reservation.finish();
    }
    const pick = (m?: string) => {
      const p = r.pick(feats(bs, m ? { model: m } : {}));
      p.reservation.finish();
      return p.target.id;
    };
    assert.equal(pick("qwen-lora-sql"), "a");
    assert.equal(pick("llama"), "b");
    assert.equal(pick(), "b", "no model: every worker, the cache wins");
  });

  test(`${label}: an unknown model is vLLM's 404 (NotFoundError, param model); workers that list no models serve anything`, () => {
    const { r, t } = mkm([{ id: "a" }, { id: "b" }], newTable());
    t.set("a", ["qwen"]);
    t.set("b", ["llama"]);
    assert.throws(
      () => r.pick(feats([], { model: "gpt-x" })),
      (e: Error & { status?: number; type?: string; param?: string }) =>
        e.status === 404 &&
        e.type === "NotFoundError" &&
        e.param === "model" &&
        e.message === "The model `gpt-x` does not exist.",
    );
    t.set("b", []);
    assert.equal(t.get("b"), null, "an empty list is no information");
    assert.equal(r.pick(feats([], { model: "gpt-x" })).target.id, "b", "falls back to workers without a list");
    assert.equal(r.pick(feats([], { model: "qwen" })).target.id, "a", "a listed model still goes to its workers only");
  });

  test(`${label}: PD: both pools narrow to the model`, () => {
    const { r, t } = mkm(
      [
        { id: "p1", role: "prefill" },
        { id: "p2", role: "prefill" },
        { id: "d1", role: "decode" },
        { id: "d2", role: "decode" },
      ],
      newTable(),
    );
    t.set("p1", ["qwen"]);
    t.set("d1", ["qwen"]);
    t.set("p2", ["llama"]);
    t.set("d2", ["llama"]);
    const p = r.pick(feats(blocks("x", 4), { model: "llama" }));
    assert.equal(p.prefill!.id, "p2");
    assert.equal(p.target.id, "d2");
    const q = r.pick(feats(blocks("x", 4), { model: "qwen" }));
    assert.equal(q.prefill!.id, "p1");
    assert.equal(q.target.id, "d1");
  });
}
