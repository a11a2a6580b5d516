// Our block hashes for the KV event batches the bridge pushes to nginx.
// applyBatch in njs keeps a mirror keyed by our chained XXH3 of each stored
// block; hashing every block there, in pure JS on the nginx worker's event
// loop, is the main cost of a push. The bridge hashes in Node instead (the
// native hasher of runtime/hasher.ts): it applies each batch it pushes, in push
// order, to a mirror of its own with the same core code, and writes on each
// BlockStored event the hashes it computed (ours) and the parent hash the chain
// started from (oursFrom). njs uses them only when it finds that same parent
// itself, so a mirror that differs here (an eviction bound, a lost push) costs
// the hashing, never a wrong hash. An njs bundle that predates these fields
// ignores them and hashes as before.
import { applyBatch, forgetMirror, KvEvent } from "../core/kvevents";
import { memoryMirror } from "../core/state/memory";
import { MirrorIndex } from "../core/state/types";
import { EpochKey } from "../core/types";
import { nativeHasher } from "../runtime/hasher";

export class KvAnnotator {
  private mirror: MirrorIndex = memoryMirror();

  /** maxBlocks: the bound on mirrored blocks per worker and tier, as nginx's (0 = none). */
  constructor(private maxBlocks = 0) {}

  /**
   * Applies one push's batch of worker id to this mirror and writes ours /
   * oursFrom on its BlockStored events (in place: they are the push body's).
   */
  annotate(id: string, seq: number, events: KvEvent[], restart = false, part = 0, partOf = 1): void {
    const ek = id as EpochKey;
    if (restart) forgetMirror(this.mirror, ek);
    let blockSize = 0;
    for (const ev of events) if (ev.type === "BlockStored" && !blockSize) blockSize = ev.blockSize;
    const opts = { hasher: nativeHasher, maxBlocks: this.maxBlocks, part: part, partOf: partOf };
    // No store: removals and clears still change what later chains find.
    if (!blockSize) return void applyBatch(this.mirror, ek, seq, events, 1, opts);
    applyBatch(this.mirror, ek, seq, events, blockSize, {
      ...opts,
      onChain: (i, from, hashes) => {
        const ev = events[i] as KvEvent & { type: "BlockStored" };
        ev.ours = hashes;
        ev.oursFrom = from;
      },
    });
  }

  /** The worker left: its blocks go. */
  forget(id: string): void {
    forgetMirror(this.mirror, id as EpochKey);
  }
}

type Stored = KvEvent & { type: "BlockStored" };

/**
 * An engine batch as parts of at most maxBlocks stored or removed blocks
 * each, in order (maxBlocks 0: one part). A long store becomes stores chained
 * one from the next (a part's parent is the last block of the part before),
 * so njs finds each part's parent where the part before left it. A batch with
 * a Snapshot stays whole: it is a resync as a whole. Called before annotate,
 * which then hashes each part on its own.
 */
export function splitBatch(events: KvEvent[], maxBlocks: number): KvEvent[][] {
  if (maxBlocks <= 0) return [events];
  let total = 0;
  for (const ev of events) {
    if (ev.type === "Snapshot") return [events];
    if (ev.type === "BlockStored" || ev.type === "BlockRemoved") total += ev.hashes.length;
  }
  if (total <= maxBlocks) return [events];
  const parts: KvEvent[][] = [[]];
  let room = maxBlocks;
  const next = () => {
    parts.push([]);
    room = maxBlocks;
  };
  for (const ev of events) {
    // Not cut: clears, and a store njs skips whole (tokens that do not fill its blocks).
    if (
      (ev.type !== "BlockStored" && ev.type !== "BlockRemoved") ||
      (ev.type === "BlockStored" && ev.tokens.length !== ev.hashes.length * ev.blockSize)
    ) {
      parts[parts.length - 1].push(ev);
      continue;
    }
    for (let a = 0; a < ev.hashes.length;) {
      if (room === 0) next();
      const b = Math.min(ev.hashes.length, a + room);
      if (a === 0 && b === ev.hashes.length) parts[parts.length - 1].push(ev);
      else if (ev.type === "BlockRemoved") parts[parts.length - 1].push({ ...ev, hashes: ev.hashes.slice(a, b) });
      else {
        const st = ev as Stored;
        const cut: Stored = {
          ...st,
          hashes: st.hashes.slice(a, b),
          parent: a === 0 ? st.parent : st.hashes[a - 1],
          tokens: st.tokens.slice(a * st.blockSize, b * st.blockSize),
        };
        if (st.extraKeys) cut.extraKeys = st.extraKeys.slice(a, b);
        delete cut.ours;
        delete cut.oursFrom;
        parts[parts.length - 1].push(cut);
      }
      room -= b - a;
      a = b;
    }
  }
  return parts.filter((p) => p.length > 0);
}
