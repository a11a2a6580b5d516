// What a real engine adds to its KV events beyond "GPU block stored/removed",
// for the simulator's vLLM-like publisher (sim/kvpublisher.ts):
// - extra_keys per block and lora_name, from the request that made the block
//   (LoRA name on every block, (mm id, offset) tuples and cache_salt on block 0,
//   vLLM's order: lora + mm + salt);
// - a CPU tier: a block evicted from the GPU is first stored on CPU
//   (medium "CPU"), then removed from the GPU; the CPU tier evicts its oldest
//   past --kv-cpu-blocks;
// - a second KV-cache group (hybrid sliding-window models): every store and
//   removal is repeated for group 1 with kv_cache_spec_kind "sliding_window".
import { ModelEvent } from "./model";
import { SimKvEvent } from "./kvpublisher";

export interface KvExtrasOptions {
  blockSize: number;
  /** CPU tier capacity in blocks; 0 = no CPU tier. */
  cpuBlocks: number;
  /** Sliding window of a second KV-cache group; null = one group. */
  slidingWindow: number | null;
}

interface BlockInfo {
  lora: string | null;
  extra: unknown[] | null;
  /** The request's cache_salt: SGLang sends it as BlockStoredWithMetadata.metadata on every salted block. */
  salt: string | null;
}

const MAX_TRACKED = 500000;

export class KvExtras {
  private info = new Map<bigint, BlockInfo>();
  private content = new Map<bigint, { tokens: number[]; parent: bigint | null }>();
  private cpu = new Map<bigint, true>();

  constructor(readonly o: KvExtrasOptions) {}

  /** Remembers what a request folds into each of its blocks, before the engine stores them. */
  noteRequest(hashes: bigint[], lora: string | null, salt: string | null, media: string[]): void {
    for (let i = 0; i < hashes.length; i++) {
      const keys: unknown[] = [];
      if (lora) keys.push(lora);
      if (i === 0) for (const m of media) keys.push([m, 0]);
      if (i === 0 && salt) keys.push(salt);
      if (!this.info.has(hashes[i])) this.info.set(hashes[i], { lora, extra: keys.length ? keys : null, salt });
    }
    while (this.info.size > MAX_TRACKED) this.info.delete(this.info.keys().next().value as bigint);
  }

  private stored(hashes: bigint[], parent: bigint | null, tokens: number[], medium: string): SimKvEvent[] {
    const first = this.info.get(hashes[0]);
    const extra = hashes.map((h) => this.info.get(h)?.extra ?? null);
    const ev: SimKvEvent = {
      type: "BlockStored",
      block_hashes: hashes,
      parent_block_hash: parent,
      token_ids: tokens,
      block_size: this.o.blockSize,
      lora_id: null,
      medium,
      lora_name: first?.lora ?? null,
    };
    if (extra.some((e) => e !== null)) ev.extra_keys = extra;
    if (first?.salt) ev.metadata = { cache_salt: first.salt };
    if (this.o.slidingWindow === null) return [ev];
    return [
      { ...ev, group_idx: 0, kv_cache_spec_kind: "full_attention" },
      { ...ev, group_idx: 1, kv_cache_spec_kind: "sliding_window", kv_cache_spec_sliding_window: this.o.slidingWindow },
    ];
  }

  private removed(hashes: bigint[], medium: string): SimKvEvent[] {
    const ev: SimKvEvent = { type: "BlockRemoved", block_hashes: hashes, medium };
    if (this.o.slidingWindow === null || medium !== "GPU") return [ev];
    return [
      { ...ev, group_idx: 0 },
      { ...ev, group_idx: 1 },
    ];
  }

  /** The model's GPU events as the engine publishes them, with tiers and groups. */
  events(model: ModelEvent[]): SimKvEvent[] {
    const out: SimKvEvent[] = [];
    for (const e of model) {
      if (e.type === "stored") {
        const bs = this.o.blockSize;
        e.hashes.forEach((h, i) =>
          this.content.set(h, {
            tokens: e.tokens.slice(i * bs, (i + 1) * bs),
            parent: i === 0 ? e.parent : e.hashes[i - 1],
          }),
        );
        out.push(...this.stored(e.hashes, e.parent, e.tokens, "GPU"));
        continue;
      }
      if (this.o.cpuBlocks > 0) {
        // Offload, then evict: the CPU copy is stored before the GPU block goes.
        for (const h of e.hashes) {
          const c = this.content.get(h);
          if (!c || this.cpu.has(h)) continue;
          out.push({ ...this.stored([h], c.parent, c.tokens, "CPU")[0] });
          this.cpu.set(h, true);
        }
      }
      out.push(...this.removed(e.hashes, "GPU"));
      const gone: bigint[] = [];
      while (this.cpu.size > this.o.cpuBlocks) {
        const h = this.cpu.keys().next().value as bigint;
        this.cpu.delete(h);
        gone.push(h);
      }
      if (gone.length) out.push(...this.removed(gone, "CPU"));
      for (const h of e.hashes) if (!this.cpu.has(h)) this.content.delete(h);
      for (const h of gone) this.content.delete(h);
    }
    return out;
  }

  /** CPU tier contents (tests compare it with the router's mirror). */
  cpuBlocks(): number {
    return this.cpu.size;
  }

  reset(): void {
    this.info.clear();
    this.content.clear();
    this.cpu.clear();
  }
}
