// A vLLM-like engine model, pure (no I/O, no clock): the caller feeds requests,
// asks for the next step, waits the step's duration and applies it.
//
// What it models, after vLLM's V1 scheduler and KV cache manager:
// - continuous batching in steps under a token budget (max_num_batched_tokens)
//   with chunked prefill: running requests are served first (decodes take one
//   token, unfinished prefills a chunk), then waiting requests in FCFS order;
// - KV memory as a fixed number of blocks; a waiting request is admitted only
//   if its blocks fit (head-of-line waits otherwise), a running request that
//   cannot grow preempts the newest running one (recompute);
// - the prefix cache: full prompt blocks are registered under their hash when
//   the step that computes them is scheduled, as vLLM V1's allocate_slots does
//   (cache_blocks before the forward pass), so a request scheduled later in the
//   same step, or in any step after, reuses a prefix still being computed
//   instead of computing it again (attention layers write KV before reading
//   it; vLLM holds back only Mamba layers, PR 29387); a freed block stays
//   cached in an LRU free queue until its memory is needed;
//   BlockStored/BlockRemoved are emitted exactly when a hash starts/stops being
//   held, and published when the step ends (vLLM publishes a step's events in
//   update_from_output), so a subscriber's mirror equals what the engine holds;
// - step time = linear layers (fixed cost and the batch's tokens, joined by
//   the step model: knee by default) + attention over the prefill's context +
//   per decode sequence + KV tokens read by decodes;
// - LoRA adapters (maxLoras > 0): at most maxLoras distinct adapters run in
//   one batch, as vLLM's --max-loras; a waiting request whose adapter does not
//   fit is skipped for this step and later requests may go first (vLLM V1
//   does the same). maxLoras GPU slots hold adapters in LRU order; a step
//   that activates an adapter not in a slot pays loraLoadMs for it (the
//   load into the slot), evicting the least recently used idle adapter.
import * as ref from "../core/step-reference";

export interface CostModel {
  /** Every forward pass: weights streamed once, kernel launches, sampling (ms). */
  stepBaseMs: number;
  /** Linear layers per prefill token (µs). */
  prefillUsPerToken: number;
  /** Attention per prefill token per 1k tokens of context before it (µs). */
  prefillAttnUsPerKCtx: number;
  /** Per running decode sequence (µs): its share of matmuls, sampling, bookkeeping. */
  decodeUsPerSeq: number;
  /** Reading 1k tokens of KV cache in a decode step (µs). */
  kvReadUsPerKToken: number;
  /** Added to a step that has any prefill (ms), e.g. host-side input prep. */
  prefillStepMs: number;
  /**
   * How a step's linear layers are priced, from the fixed cost F (stepBaseMs:
   * streaming the weights once) and the batch's tokens N (prefill + decode)
   * at c = prefillUsPerToken each:
   * - "knee" (the default): (F^p + (N c)^p)^(1/p), p = stepKneeExp. Flat at F
   *   for a few tokens, N c for many, and a gradual bend between: a prefill
   *   chunk of ~100 tokens in a decode step costs part of its tokens, not all
   *   (additive) and not nothing (roofline). p is fitted to per-operator GPU
   *   timings of the linear layers against batch tokens (Vidur's published
   *   profiles, microsoft/vidur data/profiling/compute; the fit is in
   *   docs/simulator.md). p = 1 is F + N c, a large p is the roofline.
   * - "additive": F + every prefill token x c (decodes pay decodeUsPerSeq only).
   * - "roofline": max(F, N c): prefill tokens under the weight-read floor ride
   *   along with the decodes free, as SARATHI describes hybrid batches
   *   (Agrawal et al., arXiv 2308.16369); the GPU timings above show the bend
   *   is not that sharp.
   * Attention, per-sequence and KV-read terms are added in every model.
   */
  stepModel?: "additive" | "roofline" | "knee";
  /** Exponent p of the "knee" step model (>= 1). */
  stepKneeExp?: number;
}

export interface ModelConfig extends CostModel {
  blockSize: number;
  numBlocks: number;
  maxNumBatchedTokens: number;
  maxNumSeqs: number;
  /** Distinct LoRA adapters per batch and GPU adapter slots; 0 = no limit, loads free. */
  maxLoras?: number;
  /** Cost of loading an adapter that is not in a slot (ms). */
  loraLoadMs?: number;
}

/**
 * Llama-3.1-8B-Instruct, BF16, one H100 80GB SXM, vLLM V1 defaults (see
 * docs/simulator.md for the published figures behind these).
 */
export function llama8bH100(): ModelConfig {
  return {
    stepBaseMs: ref.STEP_BASE_MS,
    prefillUsPerToken: ref.PREFILL_US_PER_TOKEN,
    prefillAttnUsPerKCtx: ref.PREFILL_ATTN_US_PER_KCTX,
    decodeUsPerSeq: ref.DECODE_US_PER_SEQ,
    kvReadUsPerKToken: ref.KV_READ_US_PER_KTOKEN,
    prefillStepMs: 0,
    stepModel: "knee",
    stepKneeExp: ref.STEP_KNEE_EXP,
    blockSize: 16,
    // (80 GB * 0.9 - 16 GB weights - ~4 GB activations/graphs) / 128 KiB per token
    numBlocks: 26000,
    maxNumBatchedTokens: 8192,
    maxNumSeqs: 256,
    maxLoras: 0,
    loraLoadMs: 0,
  };
}

/** An engine at a share of `c`'s speed: every cost term takes 1/speed as long (bench:policy-sim's --speeds). */
export function atSpeed(c: ModelConfig, speed: number): ModelConfig {
  return {
    ...c,
    stepBaseMs: c.stepBaseMs / speed,
    prefillUsPerToken: c.prefillUsPerToken / speed,
    prefillAttnUsPerKCtx: c.prefillAttnUsPerKCtx / speed,
    decodeUsPerSeq: c.decodeUsPerSeq / speed,
    kvReadUsPerKToken: c.kvReadUsPerKToken / speed,
    prefillStepMs: c.prefillStepMs / speed,
  };
}

/**
 * The linear layers of a step of prefillTokens + decodeSeqs tokens (ms), as
 * cfg.stepModel prices them (CostModel.stepModel); under "additive" the
 * prefill tokens' cost is included here too.
 */
export function linearMs(c: CostModel, prefillTokens: number, decodeSeqs: number): number {
  const batchMs = ((prefillTokens + decodeSeqs) * c.prefillUsPerToken) / 1000;
  if (c.stepModel === "roofline") return Math.max(c.stepBaseMs, batchMs);
  if (c.stepModel === "knee") {
    return ref.kneeMs(c.stepBaseMs, batchMs, c.stepKneeExp ?? ref.STEP_KNEE_EXP);
  }
  return c.stepBaseMs + (prefillTokens * c.prefillUsPerToken) / 1000;
}

export type ModelEvent =
  { type: "stored"; hashes: bigint[]; parent: bigint | null; tokens: number[] } | { type: "removed"; hashes: bigint[] };

export interface ModelRequest {
  id: string;
  /** Prompt token ids. */
  tokens: number[];
  /** Engine hash of every full prompt block, chained. */
  hashes: bigint[];
  maxTokens: number;
  /** KV arrives from elsewhere (PD decode): no prefill compute, only memory. */
  preloaded?: boolean;
  /** LoRA adapter the request runs with (null/absent: the base model). */
  lora?: string | null;
  /** Leading prompt tokens whose KV was pulled from a peer (a KV source hint): cached here without compute. */
  pulledTokens?: number;
}

interface Block {
  id: number;
  hash: bigint | null;
  ref: number;
}

interface Seq {
  r: ModelRequest;
  /** Tokens whose KV exists (or is being computed). */
  computed: number;
  /** Tokens generated so far. */
  outputs: number;
  blocks: Block[];
  /** Prompt blocks already registered in the prefix cache. */
  registered: number;
  /** Prompt tokens found in the prefix cache at first admission; -1 before. */
  cachedTokens: number;
  arrivedStep: number;
}

export interface StepPlan {
  items: { s: Seq; n: number }[];
  ms: number;
  prefillTokens: number;
  decodeSeqs: number;
  /** Adapters this step loaded into a slot. */
  loraLoads: number;
}

export interface TokenOut {
  id: string;
  /** 0-based index of the generated token. */
  index: number;
  done: boolean;
  cachedTokens: number;
  promptTokens: number;
}

export class EngineModel {
  readonly cfg: ModelConfig;
  private blocks: Block[] = [];
  /** Free blocks, least recently used first (insertion order). */
  private free = new Map<number, Block>();
  /** hash -> blocks holding it (a hash can be computed twice concurrently). */
  private byHash = new Map<bigint, Block[]>();
  private waiting: Seq[] = [];
  private running: Seq[] = [];
  private seqs = new Map<string, Seq>();
  private events: ModelEvent[] = [];
  /** Events of the step being run: published when it completes. */
  private staged: ModelEvent[] = [];
  private stepNo = 0;
  stats = {
    steps: 0,
    preemptions: 0,
    promptTokens: 0,
    cachedTokens: 0,
    generated: 0,
    queries: 0,
    hits: 0,
    loraLoads: 0,
  };
  /** Adapters in GPU slots, least recently used first. */
  private loraSlots: string[] = [];

  constructor(cfg: ModelConfig) {
    this.cfg = cfg;
    for (let i = 0; i < cfg.numBlocks; i++) {
      const b = { id: i, hash: null, ref: 0 };
      this.blocks.push(b);
      this.free.set(i, b);
    }
  }

  add(r: ModelRequest): void {
    if (this.seqs.has(r.id)) throw new Error(`duplicate request id ${r.id}`);
    const need = Math.ceil((r.tokens.length + r.maxTokens) / this.cfg.blockSize);
    if (need > this.cfg.numBlocks)
      throw Object.assign(new Error(`request needs ${need} KV blocks, engine has ${this.cfg.numBlocks}`), {
        status: 400,
      });
    const s: Seq = {
      r,
      computed: 0,
      outputs: 0,
      blocks: [],
      registered: 0,
      cachedTokens: -1,
      arrivedStep: this.stepNo,
    };
    this.seqs.set(r.id, s);
    this.waiting.push(s);
  }

  abort(id: string): void {
    const s = this.seqs.get(id);
    if (!s) return;
    this.seqs.delete(id);
    this.waiting = this.waiting.filter((x) => x !== s);
    this.running = this.running.filter((x) => x !== s);
    this.release(s);
  }

  has(id: string): boolean {
    return this.seqs.has(id);
  }

  numRunning(): number {
    return this.running.length;
  }

  /** Prompt tokens not yet computed, of requests without their first token (diagnostics; a waiting request's cached prefix counts until it is admitted). */
  pendingPrefill(): number {
    let n = 0;
    for (const s of this.running) if (s.outputs === 0) n += s.r.tokens.length - s.computed;
    for (const s of this.waiting) if (s.outputs === 0) n += s.r.tokens.length - s.computed;
    return n;
  }
  numWaiting(): number {
    return this.waiting.length;
  }

  /** Fraction of KV blocks held by requests (cached-but-free blocks count as free, as in vLLM). */
  usage(): number {
    return 1 - this.free.size / this.cfg.numBlocks;
  }

  /** Distinct block hashes the engine holds: what a KV-event subscriber should mirror. */
  cachedBlocks(): number {
    return this.byHash.size;
  }

  holds(hash: bigint): boolean {
    return this.byHash.has(hash);
  }

  drainEvents(): ModelEvent[] {
    const e = this.events;
    this.events = [];
    return e;
  }

  /**
   * Forgets every cached hash, also those of blocks running requests hold (they
   * stay allocated, just no longer shareable); the caller publishes AllBlocksCleared.
   */
  clearCache(): void {
    for (const b of this.blocks) b.hash = null;
    this.byHash.clear();
    // The step in flight registered its blocks already: they are forgotten too.
    this.staged = [];
    for (const s of this.seqs.values()) s.registered = Math.max(s.registered, s.blocks.length);
  }

  /** Longest cached prefix of s's prompt in whole blocks, leaving at least one token to compute. */
  private lookup(s: Seq): Block[] {
    const maxBlocks = Math.floor((s.r.tokens.length - 1) / this.cfg.blockSize);
    const hit: Block[] = [];
    for (let i = 0; i < Math.min(maxBlocks, s.r.hashes.length); i++) {
      const copies = this.byHash.get(s.r.hashes[i]);
      if (!copies) break;
      hit.push(copies[0]);
    }
    return hit;
  }

  private takeFree(): Block | null {
    const first = this.free.values().next();
    if (first.done) return null;
    const b = first.value;
    this.free.delete(b.id);
    if (b.hash !== null) this.unregister(b, true);
    return b;
  }

  private unregister(b: Block, emit: boolean): void {
    const h = b.hash!;
    const copies = this.byHash.get(h);
    b.hash = null;
    if (!copies) return;
    const rest = copies.filter((x) => x !== b);
    if (rest.length) this.byHash.set(h, rest);
    else {
      this.byHash.delete(h);
      if (emit) this.staged.push({ type: "removed", hashes: [h] });
    }
  }

  private touch(b: Block): void {
    if (b.ref === 0) this.free.delete(b.id);
    b.ref++;
  }

  /** Frees s's blocks; tail blocks go to the LRU end first so a prefix outlives its suffix. */
  private release(s: Seq): void {
    for (let i = s.blocks.length - 1; i >= 0; i--) {
      const b = s.blocks[i];
      b.ref--;
      if (b.ref === 0) this.free.set(b.id, b);
    }
    s.blocks = [];
    s.registered = 0;
  }

  /** Grows s to hold `tokens` tokens of KV; false (and nothing taken) if memory is short. */
  private grow(s: Seq, tokens: number): boolean {
    const need = Math.ceil(tokens / this.cfg.blockSize) - s.blocks.length;
    if (need <= 0) return true;
    if (need > this.free.size) return false;
    for (let i = 0; i < need; i++) {
      const b = this.takeFree()!;
      b.ref = 1;
      s.blocks.push(b);
    }
    return true;
  }

  private preempt(s: Seq): void {
    this.running = this.running.filter((x) => x !== s);
    this.release(s);
    s.computed = 0;
    this.waiting.unshift(s);
    this.stats.preemptions++;
  }

  /** Tokens s still has to run before it can sample its next token. */
  private pending(s: Seq): number {
    return s.r.tokens.length + s.outputs - s.computed;
  }

  /** Plans the next step, or null when there is nothing to run. */
  schedule(): StepPlan | null {
    const c = this.cfg;
    let budget = c.maxNumBatchedTokens;
    const items: { s: Seq; n: number }[] = [];
    let preempted = false;
    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const s = this.running[i];
      const n = Math.min(this.pending(s), budget);
      while (!this.grow(s, s.computed + n)) {
        // Out of memory: recompute the newest running request (vLLM's default).
        const victim = this.running[this.running.length - 1];
        preempted = true;
        this.preempt(victim);
        if (victim === s) break;
      }
      if (!this.running.includes(s)) break;
      items.push({ s, n });
      this.register(s, s.computed + n);
      budget -= n;
    }
    // LoRA: the adapters of the batch so far, and the ones this step must load.
    const maxLoras = c.maxLoras ?? 0;
    const active: string[] = [];
    const loads: string[] = [];
    if (maxLoras > 0) for (const x of this.running) if (x.r.lora && active.indexOf(x.r.lora) < 0) active.push(x.r.lora);
    let w = 0;
    while (!preempted && budget > 0 && w < this.waiting.length && this.running.length < c.maxNumSeqs) {
      const s = this.waiting[w];
      const lora = maxLoras > 0 ? s.r.lora || null : null;
      if (lora && active.indexOf(lora) < 0 && active.length >= maxLoras) {
        w++; // its adapter does not fit in this batch: later requests may go first
        continue;
      }
      let hit: Block[] = [];
      if (s.r.preloaded && s.cachedTokens < 0) {
        // PD decode: the KV was computed elsewhere; only the last prompt token runs here.
        if (!this.grow(s, s.r.tokens.length)) break;
        s.computed = s.r.tokens.length - 1;
        s.cachedTokens = 0;
      } else {
        hit = this.lookup(s);
        // Hit blocks that sit in the free queue are not free for this request.
        let hitFree = 0;
        for (const b of hit) if (b.ref === 0) hitFree++;
        const local = hit.length * c.blockSize;
        // Blocks pulled from a peer arrive on first admission only (after a preemption they are recomputed).
        const pulled =
          s.r.pulledTokens && s.cachedTokens < 0
            ? Math.min(s.r.pulledTokens, Math.floor((s.r.tokens.length - 1) / c.blockSize) * c.blockSize)
            : 0;
        const base = Math.max(local, pulled);
        const n0 = Math.min(s.r.tokens.length + s.outputs - base, budget);
        const need = Math.ceil((base + n0) / c.blockSize) - hit.length;
        if (need > this.free.size - hitFree) break;
        for (const b of hit) this.touch(b);
        s.blocks = hit.slice();
        s.registered = hit.length;
        s.computed = base;
        this.grow(s, base + n0);
        this.stats.queries += s.r.tokens.length;
        this.stats.hits += local;
        if (s.cachedTokens < 0) s.cachedTokens = base;
      }
      this.waiting.splice(w, 1);
      this.running.push(s);
      if (lora) {
        if (active.indexOf(lora) < 0) active.push(lora);
        this.useSlot(lora, active, loads);
      }
      const n = Math.min(this.pending(s), budget);
      this.grow(s, s.computed + n);
      items.push({ s, n });
      this.register(s, s.computed + n);
      budget -= n;
    }
    if (!items.length) {
      this.publishStaged();
      return null;
    }
    const plan = this.cost(items);
    if (loads.length) {
      plan.loraLoads = loads.length;
      plan.ms += loads.length * (c.loraLoadMs ?? 0);
      this.stats.loraLoads += loads.length;
    }
    return plan;
  }

  /** Marks an adapter used; loads it into a slot (LRU eviction of an idle one) when it is not in one. */
  private useSlot(lora: string, active: string[], loads: string[]): void {
    const at = this.loraSlots.indexOf(lora);
    if (at >= 0) {
      this.loraSlots.splice(at, 1);
      this.loraSlots.push(lora);
      return;
    }
    if (this.loraSlots.length >= (this.cfg.maxLoras ?? 0)) {
      let victim = -1;
      for (let i = 0; i < this.loraSlots.length && victim < 0; i++)
        if (active.indexOf(this.loraSlots[i]) < 0) victim = i;
      this.loraSlots.splice(victim < 0 ? 0 : victim, 1);
    }
    this.loraSlots.push(lora);
    loads.push(lora);
  }

  /** Distinct adapters of running and of waiting requests, as vLLM's lora_requests_info labels list them. */
  loraInfo(): { running: string[]; waiting: string[] } {
    const running: string[] = [];
    const waiting: string[] = [];
    for (const s of this.running) if (s.r.lora && running.indexOf(s.r.lora) < 0) running.push(s.r.lora);
    for (const s of this.waiting) if (s.r.lora && waiting.indexOf(s.r.lora) < 0) waiting.push(s.r.lora);
    return { running, waiting };
  }

  private cost(items: { s: Seq; n: number }[]): StepPlan {
    const c = this.cfg;
    let us = 0;
    let prefillTokens = 0;
    let decodeSeqs = 0;
    for (const { s, n } of items) {
      const decode = n === 1 && s.outputs > 0;
      if (decode) {
        decodeSeqs++;
        us += c.decodeUsPerSeq + (c.kvReadUsPerKToken * s.computed) / 1000;
      } else {
        prefillTokens += n;
        us += (c.prefillAttnUsPerKCtx * n * (s.computed + n / 2)) / 1000;
      }
    }
    // The linear layers run prefill and decode tokens as one matmul (one pass
    // over the weights): priced once for the whole batch.
    const linear = linearMs(c, prefillTokens, decodeSeqs);
    const ms = linear + (prefillTokens ? c.prefillStepMs : 0) + us / 1000;
    return { items, ms, prefillTokens, decodeSeqs, loraLoads: 0 };
  }

  /** Applies a planned step (its time has passed): KV computed, tokens sampled, blocks cached. */
  complete(plan: StepPlan): TokenOut[] {
    this.stepNo++;
    this.stats.steps++;
    this.publishStaged();
    const out: TokenOut[] = [];
    for (const { s, n } of plan.items) {
      if (!this.seqs.has(s.r.id) || !this.running.includes(s)) continue; // aborted or preempted meanwhile
      s.computed += n;
      if (this.pending(s) > 0) continue; // prefill chunk, no token yet
      s.outputs++;
      this.stats.generated++;
      if (s.outputs === 1) {
        this.stats.promptTokens += s.r.tokens.length;
        this.stats.cachedTokens += Math.max(0, s.cachedTokens);
      }
      const done = s.outputs >= s.r.maxTokens;
      out.push({
        id: s.r.id,
        index: s.outputs - 1,
        done,
        cachedTokens: Math.max(0, s.cachedTokens),
        promptTokens: s.r.tokens.length,
      });
      if (done) {
        this.seqs.delete(s.r.id);
        this.running = this.running.filter((x) => x !== s);
        this.release(s);
      }
    }
    return out;
  }

  private publishStaged(): void {
    for (const e of this.staged) this.events.push(e);
    this.staged = [];
  }

  /**
   * Registers the full prompt blocks of s up to `upto` tokens (computed, or
   * being computed by the step just scheduled); a hash already held by
   * another block is a second copy, not a new store.
   */
  private register(s: Seq, upto: number): void {
    const bs = this.cfg.blockSize;
    const full = Math.min(Math.floor(Math.min(upto, s.r.tokens.length) / bs), s.r.hashes.length);
    let run: { hashes: bigint[]; parent: bigint | null; tokens: number[] } | null = null;
    for (let i = s.registered; i < full; i++) {
      const b = s.blocks[i];
      const h = s.r.hashes[i];
      if (b.hash === h) continue;
      const copies = this.byHash.get(h);
      b.hash = h;
      if (copies) {
        copies.push(b);
        if (run) this.staged.push({ type: "stored", ...run });
        run = null;
        continue;
      }
      this.byHash.set(h, [b]);
      if (!run) run = { hashes: [], parent: i > 0 ? s.r.hashes[i - 1] : null, tokens: [] };
      run.hashes.push(h);
      for (let k = i * bs; k < (i + 1) * bs; k++) run.tokens.push(s.r.tokens[k]);
    }
    if (run) this.staged.push({ type: "stored", ...run });
    s.registered = Math.max(s.registered, full);
  }
}
