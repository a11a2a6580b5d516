// Native XXH3-64 for Node; identical output to core/xxh3.ts (see test/unit/xxh3.test.ts).
import { xxh3 } from "@node-rs/xxhash";
import { Hasher } from "../core/hash";

// The addon takes a Uint8Array as is: wrapping each block in a Buffer first
// cost a fifth of the hash on KV event intake (one call per mirrored block).
export const nativeHasher: Hasher = (b) => {
  const s = xxh3.xxh64(b).toString(16);
  return s.length === 16 ? s : "0000000000000000".slice(s.length) + s;
};
