// Pure-JS XXH3-64 (seed 0, default secret) in 32-bit integer math.
// njs has no BigInt, so every u64 is a (hi, lo) pair of uint32 values.
// Verified bit-for-bit against @node-rs/xxhash in test/unit/xxh3.test.ts.

// Results of the u64 helpers land here (no allocation on the hot path).
let RH = 0;
let RL = 0;

function r32(b: Uint8Array, o: number): number {
  return (b[o] | (b[o + 1] << 8) | (b[o + 2] << 16) | (b[o + 3] << 24)) >>> 0;
}

// The secret as a little-endian u32 at every byte offset: an array read instead
// of four byte loads per secret word (njs interprets every call and load).
// Filled by the first hash, not at load: njs runs this module's top level in
// every request's VM, and most VMs (the proxy location's phases, admin, push
// without hashing) never hash.
const SW: number[] = [];
function secretWords(): void {
  // The 192-byte default secret (kSecret) from the xxHash reference.
  const s = new Uint8Array([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d,
    0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0,
    0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0,
    0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b,
    0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac,
    0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51,
    0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34,
    0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49,
    0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8,
    0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b,
    0x40, 0x7e,
  ]);
  for (let i = 0; i + 4 <= s.length; i++) SW.push(r32(s, i));
}

// 32x32 -> 64 multiply into (RH, RL). Partial products stay below 2^53.
function mul32(a: number, b: number): void {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const b0 = b & 0xffff;
  const b1 = b >>> 16;
  const p01 = a0 * b1;
  const p10 = a1 * b0;
  const lo = a0 * b0 + ((p01 & 0xffff) + (p10 & 0xffff)) * 65536;
  const carry = Math.floor(lo / 4294967296);
  RL = lo >>> 0;
  RH = (a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + carry) >>> 0;
}

// Low 64 bits of a 64x64 product.
function mul64(ah: number, al: number, bh: number, bl: number): void {
  mul32(al, bl);
  RH = (RH + Math.imul(ah, bl) + Math.imul(al, bh)) >>> 0;
}

// Full 128-bit product, folded: lo64 ^ hi64 (XXH3_mul128_fold64).
function mulFold(ah: number, al: number, bh: number, bl: number): void {
  // The four 32x32 products of mul32, inline and sharing the 16-bit halves:
  // this runs six times per 64-token block hash, and njs pays for every call.
  const al0 = al & 0xffff;
  const al1 = al >>> 16;
  const ah0 = ah & 0xffff;
  const ah1 = ah >>> 16;
  const bl0 = bl & 0xffff;
  const bl1 = bl >>> 16;
  const bh0 = bh & 0xffff;
  const bh1 = bh >>> 16;
  // al * bl
  let p01 = al0 * bl1;
  let p10 = al1 * bl0;
  let lo = al0 * bl0 + ((p01 & 0xffff) + (p10 & 0xffff)) * 65536;
  const lll = lo >>> 0;
  const llh = (al1 * bl1 + (p01 >>> 16) + (p10 >>> 16) + Math.floor(lo / 4294967296)) >>> 0;
  // ah * bl
  p01 = ah0 * bl1;
  p10 = ah1 * bl0;
  lo = ah0 * bl0 + ((p01 & 0xffff) + (p10 & 0xffff)) * 65536;
  const hll = lo >>> 0;
  const hlh = (ah1 * bl1 + (p01 >>> 16) + (p10 >>> 16) + Math.floor(lo / 4294967296)) >>> 0;
  // al * bh
  p01 = al0 * bh1;
  p10 = al1 * bh0;
  lo = al0 * bh0 + ((p01 & 0xffff) + (p10 & 0xffff)) * 65536;
  const lhl = lo >>> 0;
  const lhh = (al1 * bh1 + (p01 >>> 16) + (p10 >>> 16) + Math.floor(lo / 4294967296)) >>> 0;
  // ah * bh
  p01 = ah0 * bh1;
  p10 = ah1 * bh0;
  lo = ah0 * bh0 + ((p01 & 0xffff) + (p10 & 0xffff)) * 65536;
  const hhl = lo >>> 0;
  const hhh = (ah1 * bh1 + (p01 >>> 16) + (p10 >>> 16) + Math.floor(lo / 4294967296)) >>> 0;
  const w1 = llh + hll + lhl;
  const c1 = Math.floor(w1 / 4294967296);
  const w2 = hlh + lhh + hhl + c1;
  const c2 = Math.floor(w2 / 4294967296);
  const w3 = (hhh + c2) >>> 0;
  RH = (w3 ^ (w1 >>> 0)) >>> 0;
  RL = ((w2 >>> 0) ^ lll) >>> 0;
}

// XXH3_avalanche: h ^= h >> 37; h *= PRIME_MX1; h ^= h >> 32.
function avalanche(h: number, l: number): void {
  l = (l ^ (h >>> 5)) >>> 0;
  mul64(h, l, 0x16566791, 0x9e3779f9);
  RL = (RL ^ RH) >>> 0;
}

// XXH64_avalanche: ^>>33, *P64_2, ^>>29, *P64_3, ^>>32.
function avalanche64(h: number, l: number): void {
  l = (l ^ (h >>> 1)) >>> 0;
  mul64(h, l, 0xc2b2ae3d, 0x27d4eb4f);
  h = RH;
  l = (RL ^ ((RL >>> 29) | (RH << 3))) >>> 0;
  h = (h ^ (h >>> 29)) >>> 0;
  mul64(h, l, 0x165667b1, 0x9e3779f9);
  RL = (RL ^ RH) >>> 0;
}

// XXH3_rrmxmx for lengths 4..8.
function rrmxmx(h: number, l: number, len: number): void {
  // rotl 49 == rotl 17 of the word-swapped value; rotl 24 directly.
  const r49h = ((l << 17) | (h >>> 15)) >>> 0;
  const r49l = ((h << 17) | (l >>> 15)) >>> 0;
  const r24h = ((h << 24) | (l >>> 8)) >>> 0;
  const r24l = ((l << 24) | (h >>> 8)) >>> 0;
  h = (h ^ r49h ^ r24h) >>> 0;
  l = (l ^ r49l ^ r24l) >>> 0;
  mul64(h, l, 0x9fb21c65, 0x1e98df25);
  h = RH;
  l = RL;
  // h ^= (h >> 35) + len
  const sl = (h >>> 3) + len;
  const sh = sl > 0xffffffff ? 1 : 0;
  l = (l ^ (sl >>> 0)) >>> 0;
  h = (h ^ sh) >>> 0;
  mul64(h, l, 0x9fb21c65, 0x1e98df25);
  h = RH;
  l = RL;
  // h ^= h >> 28
  RL = (l ^ ((l >>> 28) | (h << 4))) >>> 0;
  RH = (h ^ (h >>> 28)) >>> 0;
}

function bswap32(x: number): number {
  return (((x & 0xff) << 24) | ((x & 0xff00) << 8) | ((x >>> 8) & 0xff00) | (x >>> 24)) >>> 0;
}

// Accumulator (hi, lo) += value, carried in plain numbers.
let AH = 0;
let AL = 0;
function accAdd(h: number, l: number): void {
  const lo = AL + l;
  AL = lo >>> 0;
  AH = (AH + h + (lo > 0xffffffff ? 1 : 0)) >>> 0;
}

function mix16(b: Uint8Array, o: number, so: number): void {
  mulFold(
    (r32(b, o + 4) ^ SW[so + 4]) >>> 0,
    (r32(b, o) ^ SW[so]) >>> 0,
    (r32(b, o + 12) ^ SW[so + 12]) >>> 0,
    (r32(b, o + 8) ^ SW[so + 8]) >>> 0,
  );
}

function hashShort(b: Uint8Array, o: number, len: number): void {
  if (len > 8) {
    const ll = (r32(b, o) ^ SW[24] ^ SW[32]) >>> 0;
    const lh = (r32(b, o + 4) ^ SW[28] ^ SW[36]) >>> 0;
    const hl = (r32(b, o + len - 8) ^ SW[40] ^ SW[48]) >>> 0;
    const hh = (r32(b, o + len - 4) ^ SW[44] ^ SW[52]) >>> 0;
    AH = 0;
    AL = len;
    accAdd(bswap32(ll), bswap32(lh));
    accAdd(hh, hl);
    mulFold(lh, ll, hh, hl);
    accAdd(RH, RL);
    avalanche(AH, AL);
    return;
  }
  if (len >= 4) {
    const in1 = r32(b, o);
    const in2 = r32(b, o + len - 4);
    const fh = (SW[12] ^ SW[20]) >>> 0;
    const fl = (SW[8] ^ SW[16]) >>> 0;
    rrmxmx((in1 ^ fh) >>> 0, (in2 ^ fl) >>> 0, len);
    return;
  }
  if (len > 0) {
    const c1 = b[o];
    const c2 = b[o + (len >>> 1)];
    const c3 = b[o + len - 1];
    const combined = ((c1 << 16) | (c2 << 24) | c3 | (len << 8)) >>> 0;
    const flip = (SW[0] ^ SW[4]) >>> 0;
    avalanche64(0, (combined ^ flip) >>> 0);
    return;
  }
  avalanche64((SW[60] ^ SW[68]) >>> 0, (SW[56] ^ SW[64]) >>> 0);
}

function hashMid(b: Uint8Array, o: number, len: number): void {
  mul64(0, len, 0x9e3779b1, 0x85ebca87);
  AH = RH;
  AL = RL;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          mix16(b, o + 48, 96);
          accAdd(RH, RL);
          mix16(b, o + len - 64, 112);
          accAdd(RH, RL);
        }
        mix16(b, o + 32, 64);
        accAdd(RH, RL);
        mix16(b, o + len - 48, 80);
        accAdd(RH, RL);
      }
      mix16(b, o + 16, 32);
      accAdd(RH, RL);
      mix16(b, o + len - 32, 48);
      accAdd(RH, RL);
    }
    mix16(b, o, 0);
    accAdd(RH, RL);
    mix16(b, o + len - 16, 16);
    accAdd(RH, RL);
    avalanche(AH, AL);
    return;
  }
  // 129..240
  const rounds = len >>> 4;
  for (let i = 0; i < 8; i++) {
    mix16(b, o + 16 * i, 16 * i);
    accAdd(RH, RL);
  }
  avalanche(AH, AL);
  AH = RH;
  AL = RL;
  for (let i = 8; i < rounds; i++) {
    mix16(b, o + 16 * i, 16 * (i - 8) + 3);
    accAdd(RH, RL);
  }
  // last 16 bytes use secret offset SECRET_SIZE_MIN(136) - 17
  mix16(b, o + len - 16, 119);
  accAdd(RH, RL);
  avalanche(AH, AL);
}

// Long-input accumulators: hi at 2i, lo at 2i+1.
const ACC = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

function accumulate512(b: Uint8Array, o: number, so: number): void {
  for (let i = 0; i < 8; i++) {
    const dl = r32(b, o + 8 * i);
    const dh = r32(b, o + 8 * i + 4);
    const kl = (dl ^ SW[so + 8 * i]) >>> 0;
    const kh = (dh ^ SW[so + 8 * i + 4]) >>> 0;
    // acc[i ^ 1] += data
    const j = (i ^ 1) * 2;
    let lo = ACC[j + 1] + dl;
    ACC[j + 1] = lo >>> 0;
    ACC[j] = (ACC[j] + dh + (lo > 0xffffffff ? 1 : 0)) >>> 0;
    // acc[i] += lo32(key) * hi32(key)
    mul32(kl, kh);
    const k = i * 2;
    lo = ACC[k + 1] + RL;
    ACC[k + 1] = lo >>> 0;
    ACC[k] = (ACC[k] + RH + (lo > 0xffffffff ? 1 : 0)) >>> 0;
  }
}

function scramble(so: number): void {
  for (let i = 0; i < 8; i++) {
    const k = i * 2;
    const h = ACC[k];
    let l = ACC[k + 1];
    l = (l ^ (h >>> 15) ^ SW[so + 8 * i]) >>> 0;
    const hx = (h ^ SW[so + 8 * i + 4]) >>> 0;
    mul64(hx, l, 0, 0x9e3779b1);
    ACC[k] = RH;
    ACC[k + 1] = RL;
  }
}

function hashLong(b: Uint8Array, o: number, len: number): void {
  const init = [
    0, 0xc2b2ae3d, 0x9e3779b1, 0x85ebca87, 0xc2b2ae3d, 0x27d4eb4f, 0x165667b1, 0x9e3779f9, 0x85ebca77, 0xc2b2ae63, 0,
    0x85ebca77, 0x27d4eb2f, 0x165667c5, 0, 0x9e3779b1,
  ];
  for (let i = 0; i < 16; i++) ACC[i] = init[i];
  const stripesPerBlock = 16; // (192 - 64) / 8
  const blockLen = 1024;
  const nbBlocks = Math.floor((len - 1) / blockLen);
  for (let n = 0; n < nbBlocks; n++) {
    for (let s = 0; s < stripesPerBlock; s++) accumulate512(b, o + n * blockLen + s * 64, s * 8);
    scramble(192 - 64);
  }
  const nbStripes = Math.floor((len - 1 - blockLen * nbBlocks) / 64);
  for (let s = 0; s < nbStripes; s++) accumulate512(b, o + nbBlocks * blockLen + s * 64, s * 8);
  accumulate512(b, o + len - 64, 192 - 64 - 7);
  mul64(0, len, 0x9e3779b1, 0x85ebca87);
  AH = RH;
  AL = RL;
  for (let i = 0; i < 4; i++) {
    const so = 11 + 16 * i;
    mulFold(
      (ACC[4 * i] ^ SW[so + 4]) >>> 0,
      (ACC[4 * i + 1] ^ SW[so]) >>> 0,
      (ACC[4 * i + 2] ^ SW[so + 12]) >>> 0,
      (ACC[4 * i + 3] ^ SW[so + 8]) >>> 0,
    );
    accAdd(RH, RL);
  }
  avalanche(AH, AL);
}

function mix16w(w: Uint32Array, i: number, so: number): void {
  mulFold(
    (w[i + 1] ^ SW[so + 4]) >>> 0,
    (w[i] ^ SW[so]) >>> 0,
    (w[i + 3] ^ SW[so + 12]) >>> 0,
    (w[i + 2] ^ SW[so + 8]) >>> 0,
  );
}

// hashMid over 32-bit words: the same reads, one array access per input word.
function hashMidWords(w: Uint32Array, len: number): void {
  mul64(0, len, 0x9e3779b1, 0x85ebca87);
  AH = RH;
  AL = RL;
  const e = len >>> 2;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        mix16w(w, 12, 96);
        accAdd(RH, RL);
        mix16w(w, e - 16, 112);
        accAdd(RH, RL);
      }
      mix16w(w, 8, 64);
      accAdd(RH, RL);
      mix16w(w, e - 12, 80);
      accAdd(RH, RL);
    }
    mix16w(w, 4, 32);
    accAdd(RH, RL);
    mix16w(w, e - 8, 48);
    accAdd(RH, RL);
  }
  mix16w(w, 0, 0);
  accAdd(RH, RL);
  mix16w(w, e - 4, 16);
  accAdd(RH, RL);
  avalanche(AH, AL);
}

/**
 * XXH3-64 of the first len bytes behind a little-endian u32 view, as [hi, lo]:
 * the block-hash case (whole tokens, optionally after an 8-byte parent).
 * len must be a multiple of 4; lengths outside 17..128 are hashed bytewise.
 */
export function xxh3PairWords(w: Uint32Array, bytes: Uint8Array, len: number): number[] {
  if (!SW.length) secretWords();
  if (len > 16 && len <= 128 && (len & 3) === 0) hashMidWords(w, len);
  else return xxh3Pair(bytes, 0, len);
  return [RH, RL];
}

/** XXH3-64 of b[o, o+len): result as [hi, lo] uint32 pair. */
export function xxh3Pair(b: Uint8Array, o?: number, len?: number): number[] {
  if (!SW.length) secretWords();
  const off = o || 0;
  const n = len === undefined ? b.length - off : len;
  if (n <= 16) hashShort(b, off, n);
  else if (n <= 240) hashMid(b, off, n);
  else hashLong(b, off, n);
  return [RH, RL];
}

const HEX = "0123456789abcdef";
// "00".."ff": a u32 becomes four table reads and three concatenations (filled on first use, as SW).
const HEX2: string[] = [];
function hex32(x: number): string {
  return HEX2[x >>> 24] + HEX2[(x >>> 16) & 255] + HEX2[(x >>> 8) & 255] + HEX2[x & 255];
}

/** 16-hex-digit lowercase string of a (hi, lo) pair, the form hashes take in maps. */
export function pairHex(h: number, l: number): string {
  if (!HEX2.length) for (let i = 0; i < 256; i++) HEX2.push(HEX.charAt(i >>> 4) + HEX.charAt(i & 15));
  return hex32(h) + hex32(l);
}

/** XXH3-64 as 16 lowercase hex digits. */
export function xxh3Hex(b: Uint8Array, o?: number, len?: number): string {
  const p = xxh3Pair(b, o, len);
  return pairHex(p[0], p[1]);
}
