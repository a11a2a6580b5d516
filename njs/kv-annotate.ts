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
  annotate(id: string, seq: number, events: KvEvent[], restart = false): void {
    const ek = id as EpochKey;
    if (restart) forgetMirror(this.mirror, ek);
    let blockSize = 0;
    for (const ev of events) if (ev.type === "BlockStored" && !blockSize) blockSize = ev.blockSize;
    if (!blockSize) {
      // No store: removals and clears still change what later chains find.
      applyBatch(this.mirror, ek, seq, events, 1, { hasher: nativeHasher, maxBlocks: this.maxBlocks });
      return;
    }
    applyBatch(this.mirror, ek, seq, events, blockSize, {
      hasher: nativeHasher,
      maxBlocks: this.maxBlocks,
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
