// Router state encoded as keys of a Store: the backend njs runs on, where the
// Store is a pair of js_shared_dict_zone dicts (strings, numbers) shared by every
// request's VM. No Map/Set here. This file is the only place that knows the keys.
//
// Key schema (ek = worker epoch key "id#n", h = our block hash, eh = engine hash):
//   strings                                  numbers
//   WL          JSON Worker[] (the fleet)    WV          fleet version (cache check)
//   H:<ek>      "down" when unhealthy        EP          epoch counter
//   X:<ek>      exclusion reason             C:<name>    shared counters (round-robin)
//   M:<h>       "ek1,ek2": who holds h       MR:<ek>:<h> engine blocks that map to h on ek
//   ME:<ek>:<eh> our hash for eh on ek       MN:<ek>     distinct blocks held by ek
//   MS:<ek>     last event sequence          A:<ek>:<h>  in-flight holds of block h on ek (marked blocks only, state/marks.ts)
//   I:<ek>      "h1,h2" media LRU            AC:<ek>     distinct in-flight blocks on ek
//   S:<sid>     JSON SessionBinding          DT:<ek>/DR:<ek> in-flight tokens / requests
//   RQ:<rid>    JSON Guard (njs, queued)     PQ:<ek>     blocks queued for prefill on ek
//                                            Q:<ek>:<h>  queued-prefill holds of block h on ek (marked blocks only)
//                                            AG:<ek>     guards held on ek
//   MD:<id>     JSON models a worker serves  HB:<id>|<role> request blocks found cached
//   RP:<rid>/RM:<rid> JSON Guard (njs)       OPEN        guards held; SN sessions bound
//                                            RID         request ids; PS:<stream> push seqs
//                                            DD:<mode>|<input>|<agrees> demand decisions
//   MQ:<ek>:<n> eh stored n-th (eviction)    MQH:<ek>/MQT:<ek> eviction queue head / tail
//   MX:<ek>><name> mirror meta (kvevents)    MQP:<ek>:<eh> queue slot of eh; MEN:<ek> engine blocks
//   RC:<rid>    ek of a cold prefill (njs)   CP:<ek>     cold prefills before their first token
//   MGY         "g:t,...": cleared mirrors   SH:<priority> sheddable requests refused
//               still to drain (sweep)       MG:<t>      mirror generation of target t
// A mirror target t is a worker's epoch key (GPU) or "<ek>|<TIER>" (core/kvevents.ts tierKey).
// Its per-block keys (ME, MR, MQ, MQP) and counters (MN, MEN, MQH, MQT) are
// named by the target's current generation: t itself at generation 0, else
// "t~g". Holder lists (M:<h>) name the target t, of any generation.
import { Store, storedJson } from "../store";
import { blockAt, gridPositions, markedPrefix, markPositions } from "./marks";
import { ModelTable } from "../models";
import { BlockHash, EpochKey, Guard, SessionBinding, Worker, WorkerSpec } from "../types";
import {
  copyEventFields,
  ImageAffinity,
  LoadLedger,
  MAX_SESSIONS,
  MirrorIndex,
  prefixRun,
  RouterState,
  SessionTable,
  visitTarget,
  WorkerRegistry,
} from "./types";

/** Prompts up to this many blocks walk every block of their cached prefix; longer ones walk the grid. */
const EXACT_WALK = 64;

/**
 * The cached prefix of a long prompt from the mirror, reading its blocks at the
 * grid positions of state/marks.ts (a few hundred reads for thousands of
 * blocks): each grid block held stands for the blocks since the previous one
 * (a chained hash held means its prefix was stored; engines evict a prefix's
 * tail first), and where a worker's run ends, a binary search between the last
 * grid block it holds and the first it does not finds the exact end. A block
 * missing in the middle of a run is seen only at a grid position, and a span
 * counts the tier weight of its grid block. holders(i) is block i's holder
 * list as the mirror keeps it ("ek,ek|CPU,..."), undefined when none holds it.
 * Along a run the list is usually the same string from one grid block to the
 * next: then the previous block's weights stand (the candidates are exactly
 * the workers they name, so the filter would give them again) and the list is
 * not split or visited again.
 */
function sampledPrefixRun(
  count: number,
  holders: (i: number) => string | undefined,
  live: { [epochKey: string]: boolean },
  weights?: { [tier: string]: number },
): { [epochKey: string]: number } {
  const at = markPositions(0, count);
  const hits: { [ek: string]: number } = {};
  const lastW: { [ek: string]: number } = {};
  // Where each worker's run ended: the index of its first grid block not held.
  const stop: { [ek: string]: number } = {};
  const weightOf = (tier: string) => {
    let w = tier === "GPU" ? 1 : 0;
    if (weights) {
      const x = weights[tier];
      w = x === undefined ? 0 : x;
    }
    return w;
  };
  let cand: { [ek: string]: boolean } | null = null;
  let prevList: string | undefined = undefined;
  let prevBest: { [ek: string]: number } | null = null;
  // best's workers and weights as lists, in best's key order: the same sums
  // in the same order as iterating best, without a for-in per grid block.
  let bestEks: string[] = [];
  let bestWs: number[] = [];
  let k = 0;
  for (; k < at.length; k++) {
    const list = holders(at[k]);
    const prev = cand;
    let best: { [ek: string]: number };
    if (list !== undefined && list === prevList && prevBest !== null) best = prevBest;
    else {
      best = {};
      let any = false;
      if (list !== undefined) {
        visitHolders(list, (base, tier) => {
          const w = weightOf(tier);
          if (w <= 0 || !live[base] || (prev !== null && !prev[base])) return;
          if (!(best[base] >= w)) best[base] = w;
          any = true;
        });
      }
      if (prev !== null) for (const ek in prev) if (!(best[ek] > 0)) stop[ek] = k;
      if (!any) break;
      const next: { [ek: string]: boolean } = {};
      bestEks = [];
      bestWs = [];
      for (const ek in best) {
        next[ek] = true;
        bestEks.push(ek);
        bestWs.push(best[ek]);
        lastW[ek] = best[ek];
      }
      cand = next;
    }
    const span = at[k] - (k ? at[k - 1] : -1);
    for (let i = 0; i < bestEks.length; i++) hits[bestEks[i]] = (hits[bestEks[i]] || 0) + bestWs[i] * span;
    prevList = list;
    prevBest = best;
  }
  for (const ek in stop) {
    const j = stop[ek];
    let lo = at[j - 1];
    let hi = at[j];
    const holds = (p: number) => {
      const list = holders(p);
      if (list === undefined) return false;
      let yes = false;
      visitHolders(list, (base, tier) => {
        if (base === ek && weightOf(tier) > 0) yes = true;
      });
      return yes;
    };
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (holds(mid)) lo = mid;
      else hi = mid;
    }
    hits[ek] += (lo - at[j - 1]) * lastW[ek];
  }
  return hits;
}

/** Visits each target of a block's holder list as the mirror keeps it ("ek,ek|CPU,..."): its worker and tier. */
function visitHolders(list: string, visit: (base: string, tier: string) => void): void {
  const parts = list.split(",");
  for (let i = 0; i < parts.length; i++) visitTarget(parts[i], visit);
}

/**
 * Blocks a clear removes in the call; a mirror holding more is renamed (its
 * generation moves on, so it is empty at once) and its old blocks drained this
 * many at a time by sweep(), which each push runs (njs/push.ts). A clear in
 * one call costs about ten shared-dict operations per block, and the nginx
 * worker that runs it serves nothing meanwhile: an engine restart or a prefix
 * cache reset of a large mirror would hold it for seconds.
 */
export const SWEEP_STEP = 128;

/** The cleared mirrors still to drain, oldest first: "g:t" (generation, target), comma-separated. */
const GRAVE = "MGY";

/** A target's key name at generation g (t itself at 0). */
function genName(t: string, g: number): string {
  return g ? t + "~" + g : t;
}

/**
 * step: SWEEP_STEP unless given (tests use small steps to drain in many
 * sweeps). A clear of more blocks than step defers their removal to sweep().
 */
export function keyedMirror(st: Store, step?: number): MirrorIndex {
  const sweepStep = step || SWEEP_STEP;
  /** The key name of target t's current generation. */
  function cur(t: string): string {
    return genName(t, st.num("MG:" + t));
  }
  function addHolder(h: string, ek: string): void {
    const list = st.get("M:" + h);
    if (!list) st.set("M:" + h, ek);
    else if (("," + list + ",").indexOf("," + ek + ",") < 0) st.set("M:" + h, list + "," + ek);
  }
  function dropHolder(h: string, ek: string): void {
    const list = st.get("M:" + h);
    if (!list) return;
    const parts = list.split(",");
    const keep: string[] = [];
    for (let i = 0; i < parts.length; i++) if (parts[i] !== ek) keep.push(parts[i]);
    if (keep.length) st.set("M:" + h, keep.join(","));
    else st.del("M:" + h);
  }
  /**
   * Removes the blocks of target t's generation named p, walking its eviction
   * queue from its head: at most budget queue slots (holes included; budget <
   * 0: all of them). Returns the slots walked. Holder lists name t of any
   * generation, so a block of a stale generation (one in the graveyard)
   * leaves h's list only if t's current generation does not hold it.
   * Every ME entry counts in MEN (storeRun keeps that), so once the queue is
   * walked and MEN is still above 0, a store torn by a full zone left entries
   * the queue does not name, and one listing finds them; then p's counters
   * go. A whole clear (budget < 0) of a queue with more holes than blocks
   * lists at once instead of walking the holes. A sweep walks the queue to
   * its tail whatever MEN says: it is the one record of what is left.
   */
  function drain(p: string, t: string, budget: number, stale: boolean): number {
    const now = stale ? cur(t) : p;
    const tail = st.num("MQT:" + p);
    let head = st.num("MQH:" + p);
    const men = st.num("MEN:" + p);
    let walked = 0;
    let gone = 0;
    if (budget >= 0 ? head < tail : men > 0 && tail - head <= 2 * men + 1024) {
      for (; head < tail && (budget < 0 || walked < budget); head++) {
        walked++;
        const qk = "MQ:" + p + ":" + head;
        const eh = st.get(qk);
        if (eh === undefined) continue;
        st.del(qk);
        st.delNum("MQP:" + p + ":" + eh);
        const h = st.get("ME:" + p + ":" + eh);
        if (h === undefined) continue;
        st.del("ME:" + p + ":" + eh);
        gone++;
        if (st.num("MR:" + p + ":" + h) !== 0) {
          st.delNum("MR:" + p + ":" + h);
          if (!stale || !(st.num("MR:" + now + ":" + h) > 0)) dropHolder(h, t);
        }
      }
      if (head < tail) {
        // A sweep's step ends here: the rest waits for the next one.
        st.incr("MQH:" + p, head - st.num("MQH:" + p));
        if (gone) st.incr("MEN:" + p, -gone);
        return walked;
      }
    }
    if (gone < men) {
      const ks = st.keysMany(["MR:" + p + ":", "ME:" + p + ":", "MQP:" + p + ":", "MQ:" + p + ":"]);
      const pre = ("MR:" + p + ":").length;
      for (let i = 0; i < ks[0].length; i++) {
        const h = ks[0][i].substr(pre);
        if (!stale || !(st.num("MR:" + now + ":" + h) > 0)) dropHolder(h, t);
        st.delNum(ks[0][i]);
      }
      for (let i = 0; i < ks[1].length; i++) st.del(ks[1][i]);
      for (let i = 0; i < ks[2].length; i++) st.delNum(ks[2][i]);
      for (let i = 0; i < ks[3].length; i++) st.del(ks[3][i]);
      walked += ks[0].length + ks[1].length;
    }
    st.delNum("MN:" + p);
    st.delNum("MQH:" + p);
    st.delNum("MQT:" + p);
    st.delNum("MEN:" + p);
    return walked;
  }
  /** The graveyard's entries, oldest first ([] when none). */
  function graves(): string[] {
    const g = st.get(GRAVE);
    return g ? g.split(",") : [];
  }
  /** A graveyard entry's target and key name ("g:t"). */
  function grave(e: string): { t: string; p: string } {
    const c = e.indexOf(":");
    const t = e.substr(c + 1);
    return { t: t, p: genName(t, Number(e.substr(0, c))) };
  }
  const mirror: MirrorIndex = {
    store(ek, eh, h) {
      const p = cur(ek);
      const prev = st.get("ME:" + p + ":" + eh);
      if (prev === h) return false;
      if (prev !== undefined) mirror.remove(ek, eh);
      st.set("ME:" + p + ":" + eh, h);
      st.incr("MEN:" + p, 1);
      const slot = st.incr("MQT:" + p, 1) - 1;
      st.set("MQ:" + p + ":" + slot, eh);
      st.incr("MQP:" + p + ":" + eh, slot + 1);
      if (st.incr("MR:" + p + ":" + h, 1) === 1) {
        addHolder(h, ek);
        st.incr("MN:" + p, 1);
        return true;
      }
      return false;
    },
    storeRun(ek, ehs, hs) {
      // store()'s writes with the run's counters (MEN, MQT, MN) moved once per
      // segment: first the ME entries (one add each where the backend has
      // one), then the new blocks' queue slots, reserved together in order,
      // and their holders. A block whose engine hash held another of our
      // hashes ends a segment: the blocks before it are written whole before
      // its removal, as store() one by one would have them.
      const p = cur(ek);
      let fresh: number[] = [];
      let added = 0;
      // ME entries written and not yet counted in MEN: every ME entry counts
      // there once the run ends, however it ends (drain() relies on it).
      let men = 0;
      const countMen = () => {
        if (men) st.incr("MEN:" + p, men);
        men = 0;
      };
      const flush = () => {
        countMen();
        const n = fresh.length;
        if (!n) return;
        const run = fresh;
        fresh = [];
        const base = st.incr("MQT:" + p, n) - n;
        let m = 0;
        try {
          for (let f = 0; f < n; f++) {
            const i = run[f];
            st.set("MQ:" + p + ":" + (base + f), ehs[i]);
            st.incr("MQP:" + p + ":" + ehs[i], base + f + 1);
            if (st.incr("MR:" + p + ":" + hs[i], 1) === 1) {
              addHolder(hs[i], ek);
              m++;
            }
          }
        } finally {
          if (m) st.incr("MN:" + p, m);
          added += m;
        }
      };
      try {
        for (let i = 0; i < ehs.length; i++) {
          const k = "ME:" + p + ":" + ehs[i];
          if (st.add ? !st.add(k, hs[i]) : st.get(k) !== undefined) {
            const prev = st.get(k);
            if (prev === hs[i]) continue;
            flush();
            if (prev !== undefined) mirror.remove(ek, ehs[i]);
            st.set(k, hs[i]);
          } else if (!st.add) st.set(k, hs[i]);
          men++;
          fresh.push(i);
        }
        flush();
      } finally {
        countMen();
      }
      return added;
    },
    lookup: (ek, eh) => st.get("ME:" + cur(ek) + ":" + eh) as BlockHash | undefined,
    remove(ek, eh) {
      const p = cur(ek);
      const h = st.get("ME:" + p + ":" + eh);
      if (h === undefined) return false;
      st.del("ME:" + p + ":" + eh);
      st.incr("MEN:" + p, -1);
      const slot = st.num("MQP:" + p + ":" + eh);
      if (slot > 0) st.del("MQ:" + p + ":" + (slot - 1));
      st.delNum("MQP:" + p + ":" + eh);
      if (st.incr("MR:" + p + ":" + h, -1) <= 0) {
        st.delNum("MR:" + p + ":" + h);
        dropHolder(h, ek);
        st.incr("MN:" + p, -1);
        return true;
      }
      return false;
    },
    clear(ek) {
      // An empty tier holds no per-block key (every ME entry counts in MEN;
      // MR, MQ and MQP keys exist only beside one), so it needs no work: an
      // AllBlocksCleared clears all four tiers, most of them empty. A small
      // mirror goes at once, walking its own eviction queue, which names its
      // blocks (listing keys costs every key of both zones: njs copies them
      // all per listing, other workers' included). A large one moves to a
      // new, empty generation, and the old one joins the graveyard.
      const g = st.num("MG:" + ek);
      const p = genName(ek, g);
      const men = st.num("MEN:" + p);
      if (men <= sweepStep) {
        drain(p, ek, -1, false);
        return;
      }
      // Both writes need room in the zones, which a clear after a full zone
      // may not find: then the clear is done in the call, deletes only. The
      // graveyard entry goes first: a generation moved with no entry would
      // never be swept, and its holders would count again.
      const entry = g + ":" + ek;
      try {
        const list = st.get(GRAVE);
        st.set(GRAVE, (list ? list + "," : "") + entry);
      } catch (e) {
        drain(p, ek, -1, false);
        return;
      }
      try {
        st.incr("MG:" + ek, 1);
      } catch (e) {
        // The entry would name the generation that stays current: out with it.
        const gs = graves();
        const keep: string[] = [];
        for (let i = 0; i < gs.length; i++) if (gs[i] !== entry) keep.push(gs[i]);
        if (keep.length) st.set(GRAVE, keep.join(","));
        else st.del(GRAVE);
        drain(p, ek, -1, false);
      }
    },
    sweep(n) {
      const gs = graves();
      let walked = 0;
      let done = 0;
      const finished: { [e: string]: boolean } = {};
      while (done < gs.length && walked < n) {
        const e = grave(gs[done]);
        walked += drain(e.p, e.t, n - walked, true);
        if (st.num("MQT:" + e.p) !== 0 || st.num("MEN:" + e.p) !== 0) break;
        finished[gs[done]] = true;
        done++;
      }
      if (done) {
        // Re-read: entries another VM added meanwhile stay (each entry is
        // unique, its generation never used again).
        const now = graves();
        const keep: string[] = [];
        for (let i = 0; i < now.length; i++) if (!finished[now[i]]) keep.push(now[i]);
        if (keep.length) st.set(GRAVE, keep.join(","));
        else st.del(GRAVE);
      }
      return walked;
    },
    unswept() {
      const gs = graves();
      let n = 0;
      for (let i = 0; i < gs.length; i++) n += st.num("MEN:" + grave(gs[i]).p);
      return n;
    },
    entries: (ek) => st.num("MEN:" + cur(ek)),
    evictOldest(ek) {
      // Slots of blocks removed since are holes; each is skipped once, so this is amortized O(1).
      const p = cur(ek);
      const tail = st.num("MQT:" + p);
      for (let head = st.num("MQH:" + p); head < tail; head++) {
        const eh = st.get("MQ:" + p + ":" + head);
        if (eh === undefined) continue;
        st.incr("MQH:" + p, head + 1 - st.num("MQH:" + p));
        mirror.remove(ek, eh);
        return true;
      }
      st.incr("MQH:" + p, tail - st.num("MQH:" + p));
      return false;
    },
    meta: (ek, name) => st.get("MX:" + ek + ">" + name),
    setMeta(ek, name, value) {
      if (value === undefined) st.del("MX:" + ek + ">" + name);
      else st.set("MX:" + ek + ">" + name, value);
    },
    count: (ek) => st.num("MN:" + cur(ek)),
    prefixHits(blocks, live, weights) {
      let holders = (i: number) => st.get("M:" + blockAt(blocks, i)) || undefined;
      const gs = graves();
      if (gs.length) {
        // Cleared mirrors not yet drained still stand in holder lists: a
        // target with a graveyard entry holds h only if its current
        // generation does.
        const sweeping: { [t: string]: string } = {};
        for (let i = 0; i < gs.length; i++) {
          const t = grave(gs[i]).t;
          if (sweeping[t] === undefined) sweeping[t] = cur(t);
        }
        holders = (i: number) => {
          const h = blockAt(blocks, i);
          const list = st.get("M:" + h);
          if (!list) return undefined;
          const parts = list.split(",");
          const keep: string[] = [];
          for (let j = 0; j < parts.length; j++) {
            const now = sweeping[parts[j]];
            if (now === undefined || st.num("MR:" + now + ":" + h) > 0) keep.push(parts[j]);
          }
          if (keep.length === parts.length) return list;
          return keep.length ? keep.join(",") : undefined;
        };
      }
      const holdersOf = (i: number, visit: (base: string, tier: string) => void) => {
        const list = holders(i);
        if (!list) return false;
        visitHolders(list, visit);
        return true;
      };
      if (blocks.length <= EXACT_WALK) return prefixRun(blocks.length, holdersOf, live, weights);
      return sampledPrefixRun(blocks.length, holders, live, weights);
    },
    sequence(ek) {
      const v = st.get("MS:" + ek);
      return v === undefined ? undefined : Number(v);
    },
    setSequence(ek, seq) {
      if (seq === undefined) st.del("MS:" + ek);
      else st.set("MS:" + ek, String(seq));
    },
  };
  return mirror;
}

// The ledger marks a guard's blocks at the positions of core/state/marks.ts
// only (a few hundred keys for thousands of blocks), and keeps the guard's own
// record as those marks: holding, finding an in-flight prefix and releasing
// cost O(log) to O(marks) shared-dict operations, not one per block.
// AC (distinct in-flight blocks) moves by the blocks a guard adds to the union
// of the in-flight prefixes (its length minus the longest prefix it shares
// with the guards already there), and by the blocks it alone held when it goes.
export function keyedLedger(st: Store): LoadLedger {
  function marked(kind: string, ek: string): (h: string) => boolean {
    return function (h: string) {
      return st.num(kind + ek + ":" + h) > 0;
    };
  }
  /** The guard's marks: its blocks at their positions (all of them for a guard from an older bundle). */
  function marksOf(g: Guard): { at: number[]; n: number } {
    if (g.at && g.n !== undefined) return { at: g.at, n: g.n };
    const at: number[] = [];
    for (let i = 0; i < g.blocks.length; i++) at.push(i);
    return { at: at, n: g.blocks.length };
  }
  function book(
    ek: EpochKey,
    hashes: BlockHash[],
    at: number[],
    n: number,
    tokens: number,
    requests: number,
    pending: number,
  ): Guard {
    if (pending) for (let i = 0; i < hashes.length; i++) st.incr("Q:" + ek + ":" + hashes[i], 1);
    else {
      const shared = st.num("AC:" + ek) > 0 ? markedPrefix(hashes, at, n, marked("A:", ek)) : 0;
      for (let i = 0; i < hashes.length; i++) st.incr("A:" + ek + ":" + hashes[i], 1);
      if (n > shared) st.incr("AC:" + ek, n - shared);
    }
    if (tokens) st.incr("DT:" + ek, tokens);
    if (requests) st.incr("DR:" + ek, requests);
    if (pending) st.incr("PQ:" + ek, pending);
    st.incr("AG:" + ek, 1);
    st.incr("OPEN", 1);
    return {
      epochKey: ek,
      blocks: hashes,
      tokens: tokens,
      requests: requests,
      pending: pending,
      done: false,
      at: at,
      n: n,
    };
  }
  return {
    hold(ek, blocks, tokens, requests, pending, from) {
      const base = from || 0;
      const at = markPositions(base, base + blocks.length);
      const hashes: BlockHash[] = [];
      for (let i = 0; i < at.length; i++) hashes.push(blockAt(blocks, at[i] - base));
      return book(ek, hashes, at, base + blocks.length, tokens, requests, pending || 0);
    },
    holdLike(ek, g) {
      const m = marksOf(g);
      return book(ek, g.blocks, m.at, m.n, g.tokens, g.requests, g.pending || 0);
    },
    release(g) {
      const ek = g.epochKey;
      const m = marksOf(g);
      if (g.pending)
        for (let i = 0; i < g.blocks.length; i++) {
          const k = "Q:" + ek + ":" + g.blocks[i];
          if (st.incr(k, -1) <= 0) st.delNum(k);
        }
      else {
        for (let i = 0; i < g.blocks.length; i++) {
          const k = "A:" + ek + ":" + g.blocks[i];
          if (st.incr(k, -1) <= 0) st.delNum(k);
        }
        // What other guards still hold of this prefix stays in flight.
        const shared = markedPrefix(g.blocks, m.at, m.n, marked("A:", ek));
        if (m.n > shared && st.incr("AC:" + ek, shared - m.n) <= 0) st.delNum("AC:" + ek);
      }
      if (g.tokens && st.incr("DT:" + ek, -g.tokens) <= 0) st.delNum("DT:" + ek);
      if (g.requests && st.incr("DR:" + ek, -g.requests) <= 0) st.delNum("DR:" + ek);
      if (g.pending && st.incr("PQ:" + ek, -g.pending) <= 0) st.delNum("PQ:" + ek);
      if (st.incr("AG:" + ek, -1) <= 0) {
        st.delNum("AG:" + ek);
        // No guard left there: nothing is in flight, whatever rounding the marks left in AC.
        st.delNum("AC:" + ek);
      }
      st.incr("OPEN", -1);
    },
    activeBlocks: (ek) => Math.max(0, st.num("AC:" + ek)),
    heldGuards: (ek) => st.num("AG:" + ek),
    pendingBlocks: (ek) => Math.max(0, st.num("PQ:" + ek)),
    activePrefix(blocks, eks) {
      const out: { [ek: string]: number } = {};
      let at: number[] | null = null;
      const hashes: string[] = [];
      for (let i = 0; i < eks.length; i++) {
        const ek = eks[i];
        // An idle worker answers on the first lookup.
        if (!(st.num("AC:" + ek) > 0)) continue;
        if (at === null) {
          at = markPositions(0, blocks.length);
          for (let j = 0; j < at.length; j++) hashes.push(blockAt(blocks, at[j]));
        }
        const n = markedPrefix(hashes, at, blocks.length, marked("A:", ek));
        if (n) out[ek] = n;
      }
      return out;
    },
    queuedShared(blocks, upto) {
      // Each grid position p stands for the blocks after the previous one up to p.
      const out: { [ek: string]: number } = {};
      let grid: number[] | null = null;
      for (const ek in upto) {
        if (!(st.num("PQ:" + ek) > 0)) continue;
        const lim = Math.min(upto[ek], blocks.length);
        if (grid === null) grid = gridPositions(0, blocks.length);
        let n = 0;
        let prev = -1;
        for (let i = 0; i < grid.length && grid[i] < lim; i++) {
          if (st.num("Q:" + ek + ":" + blockAt(blocks, grid[i])) > 0) n += grid[i] - prev;
          prev = grid[i];
        }
        // The blocks after the last grid position below lim, by the last of them.
        if (lim - 1 > prev && st.num("Q:" + ek + ":" + blockAt(blocks, lim - 1)) > 0) n += lim - 1 - prev;
        if (n) out[ek] = n;
      }
      return out;
    },
    demand: (ek) => ({ tokens: st.num("DT:" + ek), requests: st.num("DR:" + ek) }),
    openGuards: () => st.num("OPEN"),
  };
}

export function keyedRegistry(st: Store): WorkerRegistry {
  // Parsed fleet, reused while the shared version number is unchanged.
  let cache: Worker[] | null = null;
  let cacheVer = -1;
  function list(): Worker[] {
    const v = st.num("WV");
    if (cache && v === cacheVer) return cache;
    const raw = st.get("WL");
    cache = raw ? (JSON.parse(raw) as Worker[]) : [];
    cacheVer = v;
    return cache;
  }
  function save(l: Worker[]): void {
    st.set("WL", JSON.stringify(l));
    st.incr("WV", 1);
  }
  return {
    list: list,
    get(id) {
      const l = list();
      for (let i = 0; i < l.length; i++) if (l[i].id === id) return l[i];
      return null;
    },
    add(spec: WorkerSpec) {
      const w: Worker = {
        id: spec.id,
        address: spec.address,
        role: spec.role || "mixed",
        blockSize: spec.blockSize,
        events: spec.events,
        epochKey: (spec.id + "#" + st.incr("EP", 1)) as EpochKey,
      };
      copyEventFields(spec, w);
      save(list().concat([w]));
      return w;
    },
    remove(id) {
      const l = list();
      const keep: Worker[] = [];
      let gone: Worker | null = null;
      for (let i = 0; i < l.length; i++) {
        if (l[i].id === id) gone = l[i];
        else keep.push(l[i]);
      }
      if (gone) save(keep);
      return gone;
    },
    setHealthy(ek, ok) {
      if (ok) st.del("H:" + ek);
      else st.set("H:" + ek, "down");
    },
    healthy: (ek) => st.get("H:" + ek) === undefined,
    exclude: (ek, reason) => st.set("X:" + ek, reason),
    excluded: (ek) => {
      const v = st.get("X:" + ek);
      return v === undefined ? null : v;
    },
    forget(ek) {
      st.del("H:" + ek);
      st.del("X:" + ek);
    },
  };
}

export function keyedSessions(st: Store, max?: number): SessionTable {
  const cap = max || MAX_SESSIONS;
  return {
    get(sid) {
      const raw = st.get("S:" + sid);
      return raw ? (JSON.parse(raw) as SessionBinding) : null;
    },
    bind(sid, b) {
      if (st.get("S:" + sid) === undefined && st.incr("SN", 1) > cap) {
        const all = st.keys("S:");
        for (let i = 0; i < all.length; i++) st.del(all[i]);
        st.delNum("SN");
        st.incr("SN", 1);
      }
      st.set("S:" + sid, JSON.stringify(b));
    },
    size: () => st.keys("S:").length,
  };
}

export function keyedImages(st: Store): ImageAffinity {
  function list(ek: string): string[] {
    const raw = st.get("I:" + ek);
    return raw ? raw.split(",") : [];
  }
  return {
    touch(ek, hashes, cap) {
      let cur = list(ek);
      for (let i = 0; i < hashes.length; i++) {
        const keep: string[] = [];
        for (let j = 0; j < cur.length; j++) if (cur[j] !== hashes[i]) keep.push(cur[j]);
        keep.push(hashes[i]);
        cur = keep;
      }
      if (cur.length > cap) cur = cur.slice(cur.length - cap);
      st.set("I:" + ek, cur.join(","));
    },
    hits(ek, hashes) {
      const have: { [h: string]: boolean } = {};
      const cur = list(ek);
      for (let i = 0; i < cur.length; i++) have[cur[i]] = true;
      let n = 0;
      for (let i = 0; i < hashes.length; i++) if (have[hashes[i]]) n++;
      return n;
    },
    list: list,
    drop: (ek) => st.del("I:" + ek),
  };
}

export function keyedState(st: Store): RouterState {
  return {
    workers: keyedRegistry(st),
    mirror: keyedMirror(st),
    load: keyedLedger(st),
    sessions: keyedSessions(st),
    images: keyedImages(st),
    next: (c) => st.incr("C:" + c, 1),
  };
}

// ---- njs request plumbing kept in the same dicts ----

/** A new request id, shared across VMs. */
export function nextRequestId(st: Store): string {
  return String(st.incr("RID", 1));
}

export type GuardSlot = "prefill" | "main" | "queued";

/** Where a request's guard waits between njs phases (popped once to release). */
export function guardKey(rid: string, which: GuardSlot): string {
  return (which === "prefill" ? "RP:" : which === "queued" ? "RQ:" : "RM:") + rid;
}

export function saveGuard(st: Store, rid: string, which: GuardSlot, g: Guard): void {
  st.set(guardKey(rid, which), guardJson(g));
}

/** A character JSON would escape in a string (the hashes and epoch keys never hold one). */
const NEEDS_ESCAPE = /["\\\x00-\x1f]/;
/** A list of non-negative integers joined with ",". */
const PLAIN_INTS = /^[0-9,]*$/;

function plainNumber(x: number): boolean {
  return typeof x === "number" && isFinite(x);
}

/**
 * JSON.stringify(g) for the guards the ledger books, built from Array.join:
 * njs's JSON.stringify formats a guard's few hundred marks one value at a
 * time through its generic path, many times slower than join copies them.
 * The text is byte for byte what JSON.stringify gives (same fields, same
 * order), so readers keep JSON.parse. Anything that would need escaping or
 * another number form goes through JSON.stringify itself.
 */
export function guardJson(g: Guard): string {
  const ek = String(g.epochKey);
  const at = g.at ? g.at.join(",") : "";
  if (
    NEEDS_ESCAPE.test(ek) ||
    NEEDS_ESCAPE.test(g.blocks.join("")) ||
    !plainNumber(g.tokens) ||
    !plainNumber(g.requests) ||
    !plainNumber(g.pending) ||
    typeof g.done !== "boolean" ||
    (g.at !== undefined && !(PLAIN_INTS.test(at) && plainNumber(g.n as number))) ||
    (g.at === undefined && g.n !== undefined)
  )
    return JSON.stringify(g);
  const parts = [
    '{"epochKey":"',
    ek,
    '","blocks":[',
    g.blocks.length ? '"' + g.blocks.join('","') + '"' : "",
    '],"tokens":',
    String(g.tokens),
    ',"requests":',
    String(g.requests),
    ',"pending":',
    String(g.pending),
    ',"done":',
    g.done ? "true" : "false",
  ];
  if (g.at !== undefined) parts.push(',"at":[', at, '],"n":', String(g.n));
  parts.push("}");
  return parts.join("");
}

/** Accepts a push sequence for a stream if it is newer than the last one; returns the last one otherwise. */
/** Push sequences are microseconds since the epoch; one from beyond this much ahead would lock every later push out. */
export const MAX_PUSH_SEQ_AHEAD_US = 600e6;

export function acceptPushSeq(st: Store, stream: string, pseq: number): { ok: boolean; last: number } {
  const key = "PS:" + stream;
  const last = st.num(key);
  if (pseq <= last) return { ok: false, last: last };
  st.incr(key, pseq - last);
  return { ok: true, last: last };
}

export function countDecision(st: Store, mode: string, input: string, agrees: boolean): void {
  st.incr("DD:" + mode + "|" + input + "|" + agrees, 1);
}

export function decisionCounts(st: Store): { mode: string; input: string; agrees: string; count: number }[] {
  const keys = st.keys("DD:");
  const out: { mode: string; input: string; agrees: string; count: number }[] = [];
  for (let i = 0; i < keys.length; i++) {
    const p = keys[i].substr(3).split("|");
    out.push({ mode: p[0], input: p[1], agrees: p[2], count: st.num(keys[i]) });
  }
  return out;
}

/** Models each worker serves: "MD:<worker id>" keys in the shared string dict, so every VM sees them. */
export function storeModelTable(st: Store): ModelTable {
  return {
    get: (id) => {
      const v = storedJson(st, "MD:" + id);
      return v instanceof Array && v.length ? (v as string[]) : null;
    },
    set: (id, models) => {
      if (models === null) st.del("MD:" + id);
      else st.set("MD:" + id, JSON.stringify(models));
    },
  };
}

/** Request blocks found cached on the picked worker, per worker and role (for /metrics). */
export function countHitBlocks(st: Store, worker: string, role: string, hits: number): void {
  st.incr("HB:" + worker + "|" + role, hits);
}

export function hitBlockCounts(st: Store): { worker: string; role: string; count: number }[] {
  const keys = st.keys("HB:");
  const out: { worker: string; role: string; count: number }[] = [];
  for (let i = 0; i < keys.length; i++) {
    const rest = keys[i].substr(3);
    const bar = rest.lastIndexOf("|");
    out.push({ worker: rest.substr(0, bar), role: rest.substr(bar + 1), count: st.num(keys[i]) });
  }
  return out;
}

/** Where a cold prefill's worker waits between njs phases (popped once at first byte or log phase). */
export function coldKey(rid: string): string {
  return "RC:" + rid;
}

/** A cold prefill sent to ek: counted until its first byte or its end (the njs twin of an admission slot). */
export function coldEnter(st: Store, rid: string, ek: EpochKey): void {
  st.incr("CP:" + ek, 1);
  st.set(coldKey(rid), ek);
}

/** Gives back the count of a cold prefill whose key the caller popped (once). */
export function coldLeave(st: Store, ek: string): void {
  if (st.incr("CP:" + ek, -1) <= 0) st.delNum("CP:" + ek);
}

export function coldInFlight(st: Store, ek: EpochKey): number {
  return st.num("CP:" + ek);
}

export function countShed(st: Store, priority: number): void {
  st.incr("SH:" + priority, 1);
}

export function shedCounts(st: Store): { priority: string; count: number }[] {
  const keys = st.keys("SH:");
  const out: { priority: string; count: number }[] = [];
  for (let i = 0; i < keys.length; i++) out.push({ priority: keys[i].substr(3), count: st.num(keys[i]) });
  return out;
}
