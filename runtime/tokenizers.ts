// The router's tokenizers: the default one, one per model (--router-tokenizer-path
// model=path,...), a LoRA adapter's base model's, and the tokenizer threads
// that take long prompts off the event loop.
import { loadTokenizer, LoadedTokenizer } from "./tokenizer";
import { addStats, defaultThreads, TokenizerPool } from "./tokenpool";
import { Options } from "./config";
import { Logger } from "./log";
import { CliError } from "./args";

/** --router-tokenizer-path: one path (every model) or "model=path,model=path[,path]" (a bare path is the default). */
export function tokenizerPaths(v: string | null): { byModel: Record<string, string>; dflt: string | null } {
  if (!v || v.indexOf("=") < 0) return { byModel: {}, dflt: v };
  const byModel: Record<string, string> = {};
  let dflt: string | null = null;
  for (const part of v.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) dflt = part.trim();
    else byModel[part.slice(0, eq).trim()] = part.slice(eq + 1).trim();
  }
  return { byModel, dflt };
}

/**
 * A tokenizer the operator named that cannot be loaded (missing, unreadable,
 * not a tokenizer.json) is a bad flag value: one line naming the flag, exit 2
 * like every other flag error, not a crash's exit 1.
 */
function tokenizerFromFlag(p: string | null, lo: Parameters<typeof loadTokenizer>[1]): LoadedTokenizer | null {
  try {
    return loadTokenizer(p, lo);
  } catch (e) {
    const m = (e as Error).message.split("\n")[0];
    throw new CliError(
      /^--(router-tokenizer-path|tokenizer-backend)\b/.test(m)
        ? m
        : `--router-tokenizer-path ${p ?? "(default)"}: ${m}`,
    );
  }
}

export class Tokenizers {
  /** The default tokenizer (models without their own). */
  readonly tokenizer: LoadedTokenizer | null;
  /** Per-model tokenizers from --router-tokenizer-path model=path,... */
  readonly byModel: Record<string, LoadedTokenizer | null> = {};
  /** LoRA adapter -> base model, from the workers' /v1/models (an adapter renders like its base). */
  readonly modelParent: Record<string, string> = {};
  /** The --router-tokenizer-path entry each loaded tokenizer came from (threads load their own copy). */
  private keys = new Map<LoadedTokenizer, string>();
  /** Tokenizer threads for long prompts; started on first need (or by warm). */
  private threads: TokenizerPool | null = null;

  constructor(
    private readonly opts: Options,
    private readonly log: Logger,
  ) {
    const tp = tokenizerPaths(opts.tokenizerPath);
    const lo = { backend: opts.tokenize.backend };
    this.tokenizer = tokenizerFromFlag(tp.dflt, lo);
    if (this.tokenizer) this.keys.set(this.tokenizer, tp.dflt ?? "");
    for (const m of Object.keys(tp.byModel)) {
      const t = (this.byModel[m] = tokenizerFromFlag(tp.byModel[m], lo));
      if (t) this.keys.set(t, tp.byModel[m]);
    }
    for (const t of this.keys.keys())
      log(
        "info",
        `tokenizer ${t.source}: ${t.backend === "fast-bpe" ? "fast byte-level BPE (runtime/fastbpe.ts, the file's own merges; --tokenizer-backend hf for @huggingface/tokenizers)" : "@huggingface/tokenizers (fast BPE not used: " + t.fallbackReason + ")"}`,
      );
  }

  /** The --router-tokenizer-path entry a tokenizer came from (what a thread loads). */
  keyOf(tok: LoadedTokenizer): string | undefined {
    return this.keys.get(tok);
  }

  /** The tokenizer for a model: its own, its base model's (LoRA), else the default. */
  tokenizerFor(model: string): LoadedTokenizer | null {
    if (model in this.byModel) return this.byModel[model];
    const base = this.modelParent[model];
    if (base !== undefined && base in this.byModel) return this.byModel[base];
    return this.tokenizer;
  }

  /** Piece-cache counters of the event loop's tokenizer plus every tokenizer thread. */
  cacheStats(): { hitTokens: number; missTokens: number; pieces: number; chars: number } | null {
    if (!this.tokenizer) return null;
    const s = { ...this.tokenizer.cacheStats() };
    if (this.threads) addStats(s, this.threads.stats());
    return s;
  }

  /** The tokenizer threads (null with --tokenizer-threads 0 or no tokenizer). */
  pool(): TokenizerPool | null {
    if (this.threads) return this.threads;
    const threads = this.opts.tokenize.threads ?? defaultThreads();
    if (!threads || !this.keys.size) return null;
    this.threads = new TokenizerPool(
      {
        keys: [...new Set(this.keys.values())],
        threads,
        queueMax: this.opts.tokenize.queue,
        timeoutMs: this.opts.tokenize.timeoutMs,
        backend: this.opts.tokenize.backend,
      },
      (l, m, f) => this.log(l, m, f),
    );
    return this.threads;
  }

  /** Starts the tokenizer threads and has each load every tokenizer now, not on the first long prompt. */
  async warm(): Promise<void> {
    const pool = this.pool();
    if (!pool) return;
    await pool.ready();
    this.log(
      "info",
      `tokenizer threads: ${pool.threads()} (prompts over ${this.opts.tokenize.inlineChars} chars; bound ${this.opts.tokenize.timeoutMs} ms, queue ${this.opts.tokenize.queue})`,
    );
  }

  async close(): Promise<void> {
    if (this.threads) await this.threads.close();
  }
}
