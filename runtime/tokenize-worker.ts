// One tokenizer worker thread (runtime/tokenpool.ts starts them): loads the
// router's tokenizers on first use, encodes prompts with its own piece cache,
// and hashes the blocks too, so a multi-MB prompt costs the main thread a
// message, not seconds of CPU.
import { parentPort, workerData } from "worker_threads";
import { loadTokenizer, LoadedTokenizer, LoadOptions } from "./tokenizer";
import { nativeHasher } from "./hasher";
import { prefixHashes } from "./prefix-hashes";

export interface TokenizeJob {
  id: number;
  /** --router-tokenizer-path entry ("" = the default tokenizer). */
  key: string;
  text: string;
  special: boolean;
  blockSize: number;
  salt: string | null;
  /** Send the ids back too (--send-token-ids), moved across in one typed array. */
  ids?: boolean;
}

export interface TokenizeResult {
  id: number;
  /** Sent once, after the startup loads (id 0). */
  ready?: boolean;
  tokens?: number;
  /** Block hashes concatenated (16 hex digits each): one string crosses threads far cheaper than thousands. */
  blocks?: string;
  ids?: Uint32Array;
  error?: string;
  ms?: number;
  stats?: { hitTokens: number; missTokens: number; pieces: number; chars: number };
}

const opts = workerData as LoadOptions & { keys?: string[] };
const toks = new Map<string, LoadedTokenizer | null>();
const hashes = prefixHashes(nativeHasher);
// Load up front: a job's time bound should measure its encoding, not a vocabulary load.
for (const k of opts.keys || []) toks.set(k, loadTokenizer(k || null, opts));
parentPort!.postMessage({ id: 0, ready: true });

parentPort!.on("message", (job: TokenizeJob) => {
  const t0 = performance.now();
  try {
    let tok = toks.get(job.key);
    if (tok === undefined) {
      tok = loadTokenizer(job.key || null, opts);
      toks.set(job.key, tok);
    }
    if (!tok) throw new Error("no tokenizer");
    const ids = job.special && tok.encodeSpecial ? tok.encodeSpecial(job.text) : tok.encode(job.text);
    const blocks = hashes.hash(ids, job.blockSize, job.salt || undefined).join("");
    const out = job.ids ? Uint32Array.from(ids) : undefined;
    parentPort!.postMessage(
      {
        id: job.id,
        tokens: ids.length,
        blocks,
        ids: out,
        ms: performance.now() - t0,
        stats: tok.cacheStats(),
      } as TokenizeResult,
      out ? [out.buffer] : [],
    );
  } catch (e) {
    parentPort!.postMessage({ id: job.id, error: (e as Error).message } as TokenizeResult);
  }
});
