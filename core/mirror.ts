// Per-worker mirror of cached KV blocks, kept in a Store.
// Keys (ek = worker epoch key "id#epoch", h = our block hash):
//   M:<h>           "ek1,ek2"  global index: who holds h (overlap is O(request blocks))
//   MR:<ek>:<h>     number     references from engine hashes to h on ek
//   ME:<ek>:<eh>    string     engine block hash -> our hash (so removals work)
//   MN:<ek>         number     distinct blocks held (cache-view)
import { Store } from "./store";

function addHolder(st: Store, h: string, ek: string): void {
  const cur = st.get("M:" + h);
  if (!cur) st.set("M:" + h, ek);
  else if (("," + cur + ",").indexOf("," + ek + ",") < 0) st.set("M:" + h, cur + "," + ek);
}

function dropHolder(st: Store, h: string, ek: string): void {
  const cur = st.get("M:" + h);
  if (!cur) return;
  const parts = cur.split(",");
  const keep: string[] = [];
  for (let i = 0; i < parts.length; i++) if (parts[i] !== ek) keep.push(parts[i]);
  if (keep.length) st.set("M:" + h, keep.join(","));
  else st.del("M:" + h);
}

/** Records that engine hash eh on ek is our block h. Returns true when h is new on ek. */
export function mirrorStore(st: Store, ek: string, eh: string, h: string): boolean {
  const prev = st.get("ME:" + ek + ":" + eh);
  if (prev === h) return false;
  if (prev !== undefined) mirrorRemove(st, ek, eh);
  st.set("ME:" + ek + ":" + eh, h);
  if (st.incr("MR:" + ek + ":" + h, 1) === 1) {
    addHolder(st, h, ek);
    st.incr("MN:" + ek, 1);
    return true;
  }
  return false;
}

/** Our hash for an engine hash on ek, if mirrored. */
export function ourHash(st: Store, ek: string, eh: string): string | undefined {
  return st.get("ME:" + ek + ":" + eh);
}

export function mirrorRemove(st: Store, ek: string, eh: string): boolean {
  const h = st.get("ME:" + ek + ":" + eh);
  if (h === undefined) return false;
  st.del("ME:" + ek + ":" + eh);
  if (st.incr("MR:" + ek + ":" + h, -1) <= 0) {
    st.delNum("MR:" + ek + ":" + h);
    dropHolder(st, h, ek);
    st.incr("MN:" + ek, -1);
    return true;
  }
  return false;
}

/** Drops everything mirrored for ek (AllBlocksCleared, sequence gap, worker leave). */
export function mirrorClear(st: Store, ek: string): void {
  const refs = st.keys("MR:" + ek + ":");
  const pre = ("MR:" + ek + ":").length;
  for (let i = 0; i < refs.length; i++) {
    dropHolder(st, refs[i].substr(pre), ek);
    st.delNum(refs[i]);
  }
  const maps = st.keys("ME:" + ek + ":");
  for (let i = 0; i < maps.length; i++) st.del(maps[i]);
  st.delNum("MN:" + ek);
}

export function mirrorCount(st: Store, ek: string): number {
  return st.num("MN:" + ek);
}

/**
 * Longest cached prefix of blocks for every live worker, walking the global
 * index once: candidates shrink block by block, so cost is O(blocks) lookups.
 */
export function prefixHits(st: Store, blocks: string[], live: { [ek: string]: boolean }): { [ek: string]: number } {
  const hits: { [ek: string]: number } = {};
  let cand: { [ek: string]: boolean } | null = null;
  for (let i = 0; i < blocks.length; i++) {
    const holders = st.get("M:" + blocks[i]);
    if (!holders) break;
    const parts = holders.split(",");
    const next: { [ek: string]: boolean } = {};
    let any = false;
    for (let j = 0; j < parts.length; j++) {
      const ek = parts[j];
      if (!live[ek] || (cand !== null && !cand[ek])) continue;
      next[ek] = true;
      hits[ek] = i + 1;
      any = true;
    }
    if (!any) break;
    cand = next;
  }
  return hits;
}
