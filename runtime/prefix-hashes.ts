// Chained block hashes with the hashes of a recently seen prefix reused: a
// conversation that grows by a turn shares every earlier block with its
// previous request, so only the blocks past the common prefix are hashed.
// A block's hash depends only on the salt and the tokens up to its end, so a
// reused hash is exactly the one hashing would give (test/unit/prefix-hashes.test.ts).
import { blockBuffer, chainNext, Hasher } from "../core/hash";
import { BlockHash } from "../core/types";

interface Entry {
  key: string;
  ids: Int32Array;
  blocks: BlockHash[];
}

export interface PrefixHashes {
  hash(ids: ArrayLike<number>, blockSize: number, salt: string | undefined): BlockHash[];
  stats(): { entries: number; tokens: number; reusedBlocks: number; hashedBlocks: number };
}

/** maxTokens bounds the token ids kept (4 bytes each, plus ~1/16 of a hash string per token). */
export function prefixHashes(hasher: Hasher, maxTokens = 4 * 1024 * 1024, perKey = 4): PrefixHashes {
  // Insertion order = age; a Map keeps both the lookup and the eviction order.
  const byKey = new Map<string, Entry[]>();
  const all = new Set<Entry>();
  let tokens = 0;
  let reusedBlocks = 0;
  let hashedBlocks = 0;
  // One iterator kept across evictions: a fresh one per eviction would walk
  // every entry deleted since the Set last rehashed (V8 leaves them in place
  // until then), so at capacity each insert got slower until the router stalled.
  let oldest = all.values();

  // keepKey: the caller re-adds to this key at once (deleting and re-setting
  // one key lengthens V8's hash chain for it until the next rehash).
  const drop = (e: Entry, keepKey = false) => {
    all.delete(e);
    tokens -= e.ids.length;
    const list = byKey.get(e.key);
    if (!list) return;
    const i = list.indexOf(e);
    if (i >= 0) list.splice(i, 1);
    if (!list.length && !keepKey) byKey.delete(e.key);
  };

  return {
    hash(ids, blockSize, salt) {
      const n = Math.floor(ids.length / blockSize);
      if (n === 0) return [];
      const buf = blockBuffer(blockSize);
      const first = chainNext(salt || null, ids, 0, blockSize, buf, hasher);
      const key = (salt || "") + "|" + blockSize + "|" + first;
      const list = byKey.get(key);
      let best: Entry | null = null;
      let bestLen = 0;
      if (list)
        for (const e of list) {
          const lim = Math.min(e.ids.length, ids.length);
          let i = 0;
          while (i < lim && e.ids[i] === ids[i]) i++;
          if (i > bestLen) {
            bestLen = i;
            best = e;
          }
        }
      const reuse = best ? Math.min(n, Math.floor(bestLen / blockSize), best.blocks.length) : 0;
      const out: BlockHash[] = reuse ? best!.blocks.slice(0, reuse) : [first];
      let parent: BlockHash = out[out.length - 1];
      for (let b = out.length; b < n; b++) {
        parent = chainNext(parent, ids, b * blockSize, blockSize, buf, hasher);
        out.push(parent);
      }
      reusedBlocks += reuse;
      hashedBlocks += n - reuse;
      // The entry this one extends is now redundant: keep the longer one.
      const e: Entry = { key, ids: Int32Array.from(ids), blocks: out };
      const keep = e.ids.length <= maxTokens;
      if (best && bestLen === best.ids.length) drop(best, keep);
      if (keep) {
        let l = byKey.get(key);
        if (!l) byKey.set(key, (l = []));
        l.push(e);
        if (l.length > perKey) drop(l[0]);
        all.add(e);
        tokens += e.ids.length;
        while (tokens > maxTokens) {
          let r = oldest.next();
          if (r.done) {
            oldest = all.values();
            r = oldest.next();
            if (r.done) break;
          }
          drop(r.value);
        }
      }
      return out.slice();
    },
    stats: () => ({ entries: all.size, tokens, reusedBlocks, hashedBlocks }),
  };
}
