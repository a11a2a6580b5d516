// Native XXH3-64 for Node; identical output to core/xxh3.ts (see test/unit/xxh3.test.ts).
import { xxh3 } from "@node-rs/xxhash";
import { Hasher } from "../core/hash";

export const nativeHasher: Hasher = (b) => {
  const v = xxh3.xxh64(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
  const s = v.toString(16);
  return s.length === 16 ? s : "0000000000000000".substr(s.length) + s;
};
