import { pairHex, xxh3Hex, xxh3Pair, xxh3PairWords } from "./xxh3";
import { BlockHash } from "./types";

/** Hashes a byte range to 16 lowercase hex digits (XXH3-64). Node swaps in a native one. */
export type Hasher = (bytes: Uint8Array) => string;

export const jsHasher: Hasher = (b) => xxh3Hex(b);

function hexDigit(c: number): number {
  // 0-9, a-f, A-F; anything else reads as 0 like parseInt's NaN byte did
  if (c <= 57) return c >= 48 ? c - 48 : 0;
  const l = c | 32;
  return l >= 97 && l <= 102 ? l - 87 : 0;
}

function putHex64LE(buf: Uint8Array, o: number, hex: string): void {
  // hex is big-endian digits of the u64; write it little-endian. Char codes,
  // not parseInt(substr): this runs once per mirrored block on event intake.
  for (let i = 0; i < 8; i++) {
    const p = 14 - 2 * i;
    buf[o + i] = (hexDigit(hex.charCodeAt(p)) << 4) | hexDigit(hex.charCodeAt(p + 1));
  }
}

/** A block's tokens as little-endian u32s at byte o of buf (o a multiple of 4). */
function putTokens(buf: Uint8Array, o: number, tokens: ArrayLike<number>, start: number, blockSize: number): void {
  const words = (buf as BlockBuffer).words;
  if (words) {
    // Little-endian host: one 32-bit store per token (KV event intake hashes every mirrored block).
    const w0 = o >> 2;
    for (let i = 0; i < blockSize; i++) words[w0 + i] = tokens[start + i];
    return;
  }
  for (let i = 0; i < blockSize; i++) {
    const t = tokens[start + i] >>> 0;
    const p = o + 4 * i;
    buf[p] = t & 255;
    buf[p + 1] = (t >>> 8) & 255;
    buf[p + 2] = (t >>> 16) & 255;
    buf[p + 3] = t >>> 24;
  }
}

/** Hash of one block chained to its parent (null for the first block). */
export function chainNext(
  parent: string | null,
  tokens: ArrayLike<number>,
  start: number,
  blockSize: number,
  buf: Uint8Array,
  h: Hasher,
): BlockHash {
  let o = 0;
  if (parent) {
    putHex64LE(buf, 0, parent);
    o = 8;
  }
  putTokens(buf, o, tokens, start, blockSize);
  return h(o ? buf : buf.subarray(0, blockSize * 4)) as BlockHash;
}

/** A block's bytes, with a 32-bit view of them when the host is little-endian (the hash input is LE). */
interface BlockBuffer extends Uint8Array {
  words?: Uint32Array;
}

const littleEndian = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

export function blockBuffer(blockSize: number): Uint8Array {
  const b: BlockBuffer = new Uint8Array(8 + blockSize * 4);
  if (littleEndian) b.words = new Uint32Array(b.buffer);
  return b;
}

/**
 * Chained block hashes of a token sequence, one per full block of blockSize tokens.
 * block 0 = XXH3(tokens_0 as u32 LE); block i = XXH3(LE64(hash_{i-1}) || tokens_i as u32 LE).
 * A salt (e.g. the images of a multimodal request) seeds the chain as a virtual parent,
 * so the same text with other images never matches a text-only block.
 */
export function blockHashes(tokens: ArrayLike<number>, blockSize: number, hasher?: Hasher, salt?: string): BlockHash[] {
  const h = hasher || jsHasher;
  if (h === jsHasher) return jsBlockHashes(tokens, blockSize, salt);
  const n = Math.floor(tokens.length / blockSize);
  const out: BlockHash[] = [];
  const buf = blockBuffer(blockSize);
  let parent: BlockHash | null = (salt as BlockHash) || null;
  for (let b = 0; b < n; b++) {
    parent = chainNext(parent, tokens, b * blockSize, blockSize, buf, h);
    out.push(parent);
  }
  return out;
}

/**
 * blockHashes with the pure-JS XXH3 (njs): the same chain, but each parent goes
 * into the next block's bytes straight from the hash's (hi, lo) words instead
 * of through its hex string, which njs would parse back digit by digit.
 */
function jsBlockHashes(tokens: ArrayLike<number>, blockSize: number, salt?: string): BlockHash[] {
  const n = Math.floor(tokens.length / blockSize);
  const out: BlockHash[] = [];
  const buf = blockBuffer(blockSize);
  const words = (buf as BlockBuffer).words;
  let ph = 0;
  let pl = 0;
  for (let b = 0; b < n; b++) {
    let o = 0;
    if (b > 0) {
      // LE64(parent): low word first, each word little-endian
      if (words) {
        words[0] = pl;
        words[1] = ph;
      } else
        for (let i = 0; i < 4; i++) {
          buf[i] = (pl >>> (8 * i)) & 255;
          buf[4 + i] = (ph >>> (8 * i)) & 255;
        }
      o = 8;
    } else if (salt) {
      putHex64LE(buf, 0, salt);
      o = 8;
    }
    putTokens(buf, o, tokens, b * blockSize, blockSize);
    const r = words ? xxh3PairWords(words, buf, o + 4 * blockSize) : xxh3Pair(buf, 0, o + 4 * blockSize);
    ph = r[0];
    pl = r[1];
    out.push(pairHex(ph, pl) as BlockHash);
  }
  return out;
}
