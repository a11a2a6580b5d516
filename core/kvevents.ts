// Applies engine KV events (vLLM / SGLang semantics) to a worker's mirror.
// Engine hashes are opaque: we rehash token_ids with our own chained XXH3 and
// keep engine-hash -> our-hash per worker so BlockRemoved can find its block.
import { chainNext, blockBuffer, Hasher, jsHasher } from "./hash";
import { MirrorIndex } from "./state/types";
import { BlockHash, EngineHash, EpochKey } from "./types";
import { utf8 } from "./util";

export type KvEvent =
  | { type: "BlockStored"; hashes: EngineHash[]; parent: EngineHash | null; tokens: number[]; blockSize: number; loraId?: number | null }
  | { type: "BlockRemoved"; hashes: EngineHash[] }
  | { type: "AllBlocksCleared" };

export interface ApplyResult {
  stored: number;
  removed: number;
  cleared: boolean;
  skipped: number;
  gap: boolean;
  /** Set when the worker must be excluded (block size mismatch). */
  fatal: string | null;
}

/**
 * Applies one batch with sequence number seq. A gap (or a restart: seq going
 * backwards) clears the mirror first: we resync rather than drift.
 */
export function applyBatch(mirror: MirrorIndex, ek: EpochKey, seq: number, events: KvEvent[], blockSize: number, hasher?: Hasher): ApplyResult {
  const h = hasher || jsHasher;
  const res: ApplyResult = { stored: 0, removed: 0, cleared: false, skipped: 0, gap: false, fatal: null };
  const hadSeq = mirror.sequence(ek);
  if (hadSeq !== undefined && seq !== hadSeq + 1) {
    mirror.clear(ek);
    res.gap = true;
  }
  mirror.setSequence(ek, seq);
  const buf = blockBuffer(blockSize);
  for (let i = 0; i < events.length; i++) {
    const ev = events[i];
    if (ev.type === "AllBlocksCleared") {
      mirror.clear(ek);
      res.cleared = true;
    } else if (ev.type === "BlockRemoved") {
      for (let j = 0; j < ev.hashes.length; j++) if (mirror.remove(ek, ev.hashes[j])) res.removed++;
    } else if (ev.type === "BlockStored") {
      if (ev.blockSize !== blockSize) {
        res.fatal = "block size " + ev.blockSize + " in KV events != router --block-size " + blockSize;
        return res;
      }
      if (ev.tokens.length !== ev.hashes.length * blockSize) {
        res.skipped += ev.hashes.length;
        continue;
      }
      // LoRA blocks start from a salted root so they never match base-model prompts.
      let parent: BlockHash | null = ev.loraId !== undefined && ev.loraId !== null ? (h(utf8("lora:" + ev.loraId)) as BlockHash) : null;
      if (ev.parent !== null) {
        const p = mirror.lookup(ek, ev.parent);
        // Unknown parent (evicted, or we joined mid-stream): this chain cannot match a prompt.
        if (p === undefined) {
          res.skipped += ev.hashes.length;
          continue;
        }
        parent = p;
      }
      for (let j = 0; j < ev.hashes.length; j++) {
        parent = chainNext(parent, ev.tokens, j * blockSize, blockSize, buf, h);
        if (mirror.store(ek, ev.hashes[j], parent)) res.stored++;
      }
    }
  }
  return res;
}

export function resetSequence(mirror: MirrorIndex, ek: EpochKey): void {
  mirror.setSequence(ek, undefined);
}
