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

  const drop = (e: Entry) => {
    all.delete(e);
    tokens -= e.ids.length;
    const list = byKey.get(e.key);
    if (!list) return;
    const i = list.indexOf(e);
    if (i >= 0) list.splice(i, 1);
    if (!list.length) byKey.delete(e.key);
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
      if (best && bestLen === best.ids.length) drop(best);
      const e: Entry = { key, ids: Int32Array.from(ids), blocks: out };
      if (e.ids.length <= maxTokens) {
        const l = byKey.get(key) || [];
        l.push(e);
        if (l.length > perKey) drop(l[0]);
        byKey.set(key, l);
        all.add(e);
        tokens += e.ids.length;
        for (const old of all) {
          if (tokens <= maxTokens) break;
          drop(old);
        }
      }
      return out.slice();
    },
    stats: () => ({ entries: all.size, tokens, reusedBlocks, hashedBlocks }),
  };
}
