// Runs inside the `njs` CLI (no nginx): checks BPE parity and times
// tokenize + hash + pick on the native njs engine. See test/e2e/njs.test.ts.
import { createBpe, CompactTokenizer } from "../core/bpe";
import { memStore } from "../core/store";
import { keyedState } from "../core/state/keyed";
import { createRouter, defaultConfig } from "../core/router";
import { computeFeatures, parseRequest, renderChatML } from "../core/request";
import { xxh3Hex } from "../core/xxh3";
import { blockHashes } from "../core/hash";

function encodeAll(vocab: CompactTokenizer, texts: string[]): number[][] {
  const bpe = createBpe(vocab);
  const out: number[][] = [];
  for (let i = 0; i < texts.length; i++) out.push(bpe.encode(texts[i]));
  return out;
}

function hashes(inputs: number[][]): string[] {
  const out: string[] = [];
  for (let i = 0; i < inputs.length; i++) out.push(xxh3Hex(new Uint8Array(inputs[i])));
  return out;
}

/** ms per request (median of reps) for a chat prompt of about `words` words over 8 workers. */
function timePick(vocab: CompactTokenizer, text: string, reps: number): { tokens: number; ms: number } {
  const bpe = createBpe(vocab);
  const tok = { encode: bpe.encode, renderChat: renderChatML };
  const r = createRouter(keyedState(memStore()), defaultConfig());
  for (let i = 0; i < 8; i++) r.addWorker({ id: "w" + i, address: "127.0.0.1:" + (9000 + i), role: "mixed" });
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: text }] });
  const times: number[] = [];
  let tokens = 0;
  for (let k = 0; k < reps; k++) {
    // fresh BPE cache each time: an nginx request gets a fresh VM
    const fresh = createBpe(vocab);
    tok.encode = fresh.encode;
    const t0 = Date.now();
    const f = computeFeatures(parseRequest("chat", body, body.length, { maxBodyBytes: 1 << 26 }), tok, 16);
    const p = r.pick(f);
    times.push(Date.now() - t0);
    p.reservation.finish();
    tokens = f.inputTokens;
  }
  times.sort(function (a, b) {
    return a - b;
  });
  return { tokens: tokens, ms: times[Math.floor(times.length / 2)] };
}

export default { encodeAll: encodeAll, hashes: hashes, timePick: timePick, blockHashes: blockHashes };
