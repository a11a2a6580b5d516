// Runs inside the `njs` CLI (no nginx): checks BPE parity and times
// tokenize + hash + pick on the native njs engine. See test/e2e/njs.test.ts.
import { compactTokenizer, createBpe, CompactTokenizer } from "../core/bpe";
import { memStore } from "../core/store";
import { keyedState } from "../core/state/keyed";
import { createRouter, defaultConfig } from "../core/router";
import { computeFeatures, Endpoint, parseRequest, promptTokenIds } from "../core/request";
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
  const r = createRouter(keyedState(memStore()), defaultConfig());
  for (let i = 0; i < 8; i++) r.addWorker({ id: "w" + i, address: "127.0.0.1:" + (9000 + i), role: "mixed" });
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: text }] });
  const times: number[] = [];
  let tokens = 0;
  for (let k = 0; k < reps; k++) {
    // fresh BPE cache each time: an nginx request gets a fresh VM
    const tok = compactTokenizer(vocab);
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

/** Parse + render + tokenize each request as the njs router does: ids, or the error the router answers with. */
function renderIds(
  vocab: CompactTokenizer,
  items: { endpoint: Endpoint; body: string }[],
): { ids?: number[]; error?: string }[] {
  const tok = compactTokenizer(vocab);
  const out: { ids?: number[]; error?: string }[] = [];
  for (let i = 0; i < items.length; i++) {
    try {
      const b = items[i].body;
      out.push({
        ids: promptTokenIds(parseRequest(items[i].endpoint, b, b.length, { maxBodyBytes: 1 << 30 }), tok) as number[],
      });
    } catch (e) {
      out.push({ error: String((e as Error).message) });
    }
  }
  return out;
}

/** Median ms of each phase (parse, render, encode, hash, pick) for one chat prompt: where njs pick time goes. */
function phases(vocab: CompactTokenizer, text: string, reps: number): { [phase: string]: number } {
  const r = createRouter(keyedState(memStore()), defaultConfig());
  for (let i = 0; i < 8; i++) r.addWorker({ id: "w" + i, address: "127.0.0.1:" + (9000 + i), role: "mixed" });
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: text }] });
  const t: { [phase: string]: number[] } = { parse: [], render: [], encode: [], hash: [], pick: [] };
  for (let k = 0; k < reps; k++) {
    const tok = compactTokenizer(vocab);
    let t0 = Date.now();
    const req = parseRequest("chat", body, body.length, { maxBodyBytes: 1 << 26 });
    t.parse.push(Date.now() - t0);
    t0 = Date.now();
    const rendered = tok.renderChat!(req.chat!);
    t.render.push(Date.now() - t0);
    t0 = Date.now();
    const ids = req.addSpecialTokens && tok.encodeSpecial ? tok.encodeSpecial(rendered) : tok.encode(rendered);
    t.encode.push(Date.now() - t0);
    t0 = Date.now();
    const blocks = blockHashes(ids, 16);
    t.hash.push(Date.now() - t0);
    t0 = Date.now();
    const p = r.pick({ blocks: blocks, inputTokens: ids.length, exact: true, mediaHashes: [], n: 1, model: "m" });
    t.pick.push(Date.now() - t0);
    p.reservation.finish();
  }
  const out: { [phase: string]: number } = {};
  for (const name in t) {
    t[name].sort(function (a, b) {
      return a - b;
    });
    out[name] = t[name][Math.floor(t[name].length / 2)];
  }
  return out;
}

export default {
  encodeAll: encodeAll,
  hashes: hashes,
  timePick: timePick,
  phases: phases,
  blockHashes: blockHashes,
  renderIds: renderIds,
};
