// The bridge's block hashes on pushed KV events (njs/kv-annotate.ts): njs's
// applyBatch (core/kvevents.ts, compiled into the bundle's push handler)
// stores them instead of hashing when they start from the parent it finds,
// and the mirror it builds is the one hashing would have built.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { applyBatch, KvEvent, TIERS, tierKey } from "../../core/kvevents";
import { blockHashes, Hasher, jsHasher } from "../../core/hash";
import { keyedMirror } from "../../core/state/keyed";
import { memStore } from "../../core/store";
import { MirrorIndex } from "../../core/state/types";
import { BlockHash, EpochKey } from "../../core/types";
import { KvAnnotator, splitBatch } from "../../njs/kv-annotate";

const W = "w#1" as EpochKey;
type Stored = Extract<KvEvent, { type: "BlockStored" }>;
const toks = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);

function counting(): { h: Hasher; calls: () => number } {
  let n = 0;
  return {
    h: (b) => {
      n++;
      return jsHasher(b);
    },
    calls: () => n,
  };
}

test("njs stores the bridge's hashes when their chain starts at its own parent, and hashes otherwise", () => {
  const t = toks(32, 500);
  const right = blockHashes(t, 16, jsHasher);
  // Deliberately wrong hashes: the mirror holding them proves they were taken, not recomputed.
  const m = keyedMirror(memStore());
  const c = counting();
  const ev: Stored = {
    type: "BlockStored",
    hashes: ["e0", "e1"],
    parent: null,
    tokens: t,
    blockSize: 16,
    ours: ["x0" as BlockHash, "x1" as BlockHash],
    oursFrom: null,
  };
  applyBatch(m, W, 0, [ev], 16, { hasher: c.h });
  assert.deepEqual([m.lookup(W, "e0"), m.lookup(W, "e1")], ["x0", "x1"]);
  assert.equal(c.calls(), 0, "no block hashed in njs");
  // A chain the bridge started elsewhere (its mirror differs): hashed here, the bridge's hashes ignored.
  const m2 = keyedMirror(memStore());
  const c2 = counting();
  applyBatch(m2, W, 0, [{ ...ev, oursFrom: "somewhere" as BlockHash }], 16, { hasher: c2.h });
  assert.deepEqual([m2.lookup(W, "e0"), m2.lookup(W, "e1")], right);
  assert.equal(c2.calls(), 2);
  // The old event shape (no ours): hashed as before.
  const m3 = keyedMirror(memStore());
  applyBatch(m3, W, 0, [{ ...ev, ours: undefined, oursFrom: undefined }], 16);
  assert.deepEqual([m3.lookup(W, "e0"), m3.lookup(W, "e1")], right);
  // A count that does not match the event's blocks: hashed.
  const m4 = keyedMirror(memStore());
  applyBatch(m4, W, 0, [{ ...ev, ours: ["x0" as BlockHash] }], 16);
  assert.deepEqual([m4.lookup(W, "e0"), m4.lookup(W, "e1")], right);
});

/** Every engine hash's mirror entry in every tier, and the counts: what a push leaves in njs. */
function snapshot(m: MirrorIndex, engineHashes: string[]): string {
  const out: string[] = [];
  for (const t of TIERS) {
    const k = tierKey(W, t);
    out.push(t + ":" + m.count(k) + ":" + m.entries(k));
    for (const e of engineHashes) out.push(String(m.lookup(k, e)));
  }
  out.push(String(m.sequence(W)));
  return out.join(",");
}

// A deterministic pseudo-random stream of batches: chains from the root and
// from earlier blocks, adapters, salts, multimodal blocks, tiers, removals,
// clears, a restart and a sequence gap.
function stream(seed: number): { seq: number; events: KvEvent[]; restart?: boolean }[] {
  let s = seed;
  const rnd = (n: number) => {
    s = (s * 1103515245 + 12345) % 2147483648;
    return s % n;
  };
  const known: string[] = [];
  let next = 0;
  let seq = 0;
  const out: { seq: number; events: KvEvent[]; restart?: boolean }[] = [];
  for (let b = 0; b < 60; b++) {
    const events: KvEvent[] = [];
    const k = 1 + rnd(4);
    for (let e = 0; e < k; e++) {
      const r = rnd(20);
      if (r < 13) {
        const n = 1 + rnd(6);
        const hashes = toks(n).map(() => "e" + next++);
        const parent = known.length && rnd(3) > 0 ? known[rnd(known.length)] : rnd(5) === 0 ? "0" : null;
        const extra =
          rnd(4) === 0
            ? hashes.map((_, i) => (i === 0 ? ["salt-" + rnd(2)] : rnd(3) === 0 ? [["img", i]] : null))
            : null;
        events.push({
          type: "BlockStored",
          hashes,
          parent,
          tokens: toks(n * 16, rnd(50) * 7),
          blockSize: 16,
          loraName: rnd(6) === 0 ? "sql" : null,
          extraKeys: extra,
          medium: ["GPU", "GPU", "CPU", null][rnd(4)],
        });
        known.push(...hashes);
      } else if (r < 18 && known.length) {
        events.push({
          type: "BlockRemoved",
          hashes: [known[rnd(known.length)], known[rnd(known.length)]],
          medium: rnd(2) ? "GPU" : "CPU",
        });
      } else if (r === 18) events.push({ type: "AllBlocksCleared", medium: rnd(2) ? "CPU" : null });
    }
    seq += b === 40 ? 3 : 1;
    out.push({ seq, events, restart: b === 25 ? true : undefined });
  }
  return out;
}

/** Every hash the engine stored over the stream: the blocks a mirror snapshot is read at. */
function storedHashes(batches: { events: KvEvent[] }[]): string[] {
  const all = new Set<string>();
  for (const b of batches)
    for (const ev of b.events) if (ev.type === "BlockStored") ev.hashes.forEach((h) => all.add(h));
  return [...all];
}

/** What njs's push handler does on an engine restart: the worker's mirror forgotten, every tier. */
function forget(m: MirrorIndex): void {
  for (const t of TIERS) m.clear(tierKey(W, t));
  m.setSequence(W, undefined);
}

test("a mirror fed the bridge's annotated batches is the mirror hashing builds, with almost no hashing in njs", () => {
  for (const seed of [1, 7, 42]) {
    const batches = stream(seed);
    const engineHashes = storedHashes(batches);
    const plain = keyedMirror(memStore());
    const fed = keyedMirror(memStore());
    const ann = new KvAnnotator();
    const cPlain = counting();
    const cFed = counting();
    let blocks = 0;
    let annotated = 0;
    for (const b of batches) {
      const copy = JSON.parse(JSON.stringify(b.events)) as KvEvent[];
      ann.annotate("w#1", b.seq, copy, !!b.restart);
      // What travels to nginx is JSON: the annotations survive it.
      const wire = JSON.parse(JSON.stringify(copy)) as KvEvent[];
      for (const ev of wire)
        if (ev.type === "BlockStored") {
          blocks += ev.hashes.length;
          if (ev.ours) annotated += ev.ours.length;
        }
      // njs's push handler: a restart forgets the worker first (njs/infera.ts push).
      if (b.restart) [plain, fed].forEach(forget);
      const a = applyBatch(plain, W, b.seq, b.events, 16, { hasher: cPlain.h });
      const f = applyBatch(fed, W, b.seq, wire, 16, { hasher: cFed.h });
      assert.deepEqual(f, a, "same result");
      assert.equal(snapshot(fed, engineHashes), snapshot(plain, engineHashes), `seed ${seed} seq ${b.seq}`);
    }
    assert.ok(annotated > blocks / 2, `most blocks annotated (${annotated} of ${blocks})`);
    assert.ok(cFed.calls() * 5 < cPlain.calls(), `njs hashed ${cFed.calls()} times, against ${cPlain.calls()} without`);
  }
});

test("a batch cut into parts (splitBatch) and applied part by part in order leaves the mirror the whole batch leaves; a part missing is a gap", () => {
  for (const seed of [1, 7, 42]) {
    const batches = stream(seed);
    const engineHashes = storedHashes(batches);
    const whole = keyedMirror(memStore());
    const cut = keyedMirror(memStore());
    const ann = new KvAnnotator();
    let split = 0;
    for (const b of batches) {
      if (b.restart) [whole, cut].forEach(forget);
      applyBatch(whole, W, b.seq, b.events, 16);
      const parts = splitBatch(JSON.parse(JSON.stringify(b.events)) as KvEvent[], 3);
      for (let k = 0; k < parts.length; k++) {
        let blocks = 0;
        for (const ev of parts[k])
          if (ev.type === "BlockStored" || ev.type === "BlockRemoved") blocks += ev.hashes.length;
        assert.ok(blocks <= 3, `part of ${blocks} blocks`);
        ann.annotate("w#1", b.seq, parts[k], !!b.restart && k === 0, k, parts.length);
        const wire = JSON.parse(JSON.stringify(parts[k])) as KvEvent[];
        const r = applyBatch(cut, W, b.seq, wire, 16, { part: k, partOf: parts.length });
        // Only the stream's own gap (seq jumps by 3 at batch 40) is one, and only on a first part.
        if (k > 0) assert.equal(r.gap, false, `seed ${seed} seq ${b.seq} part ${k}`);
      }
      if (parts.length > 1) split++;
      assert.equal(snapshot(cut, engineHashes), snapshot(whole, engineHashes), `seed ${seed} seq ${b.seq}`);
    }
    assert.ok(split > 10, `batches cut: ${split}`);
  }
  // A part lost: the next part is a gap (the mirror cleared), and so is a batch after an unfinished one.
  const m = keyedMirror(memStore());
  const store = (from: number, n: number, parent: string | null): KvEvent => ({
    type: "BlockStored",
    hashes: toks(n, from).map((i) => "b" + i),
    parent,
    tokens: toks(n * 16, from * 16),
    blockSize: 16,
  });
  const parts = splitBatch([store(0, 9, null)], 3);
  assert.equal(parts.length, 3);
  assert.equal(applyBatch(m, W, 1, parts[0], 16, { part: 0, partOf: 3 }).gap, false);
  assert.equal(m.sequence(W), undefined, "the sequence moves with the last part");
  assert.equal(applyBatch(m, W, 1, parts[1], 16, { part: 1, partOf: 3 }).gap, false);
  assert.equal(applyBatch(m, W, 1, parts[2], 16, { part: 2, partOf: 3 }).gap, false);
  assert.deepEqual([m.count(W), m.sequence(W)], [9, 1]);
  const next = splitBatch([store(9, 9, "b8")], 3);
  assert.equal(applyBatch(m, W, 2, next[0], 16, { part: 0, partOf: 3 }).gap, false);
  const lost = applyBatch(m, W, 2, next[2], 16, { part: 2, partOf: 3 });
  assert.equal(lost.gap, true, "part 3 after part 1: a gap");
  assert.equal(m.count(W), 0, "cleared (and part 3's chain has no parent left)");
  // A last part lost: the batch after it is a gap too.
  const m2 = keyedMirror(memStore());
  applyBatch(m2, W, 1, parts[0], 16, { part: 0, partOf: 3 });
  applyBatch(m2, W, 1, parts[1], 16, { part: 1, partOf: 3 });
  assert.equal(applyBatch(m2, W, 2, [store(20, 1, null)], 16).gap, true);
  assert.deepEqual([m2.count(W), m2.sequence(W)], [1, 2]);
});
