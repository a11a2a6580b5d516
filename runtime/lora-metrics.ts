// Scrapes each worker's /metrics for vLLM's LoRA gauge (core/lora.ts parses
// it) every --lora-metrics-interval-ms and keeps the router's LoRA table
// current. One request per address per round (data-parallel ranks share one),
// never two rounds at once, each bounded by a timeout. A worker that does not
// answer, or exports no LoRA gauge, gets no state: the LoRA plugins then treat
// it as unknown rather than as full or loaded.
import { LoraTable, parseLoraInfo } from "../core/lora";

export interface LoraScrapeTarget {
  id: string;
  address: string;
}

export class LoraScraper {
  private timer: NodeJS.Timeout | null = null;
  private busy = false;

  constructor(
    private readonly table: LoraTable,
    private readonly targets: () => LoraScrapeTarget[],
    private readonly intervalMs: number,
    private readonly timeoutMs = 2000,
  ) {}

  start(): void {
    if (this.timer || !(this.intervalMs > 0)) return;
    void this.scrapeOnce();
    this.timer = setInterval(() => void this.scrapeOnce(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** One round over the fleet; resolves when every worker answered or timed out. */
  async scrapeOnce(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const byAddress: Record<string, string[]> = {};
      for (const t of this.targets()) (byAddress[t.address] ??= []).push(t.id);
      await Promise.all(
        Object.keys(byAddress).map(async (address) => {
          let text: string | null = null;
          try {
            const r = await fetch(`http://${address}/metrics`, { signal: AbortSignal.timeout(this.timeoutMs) });
            if (r.ok) text = await r.text();
          } catch {
            text = null; // down or slow: no state this round
          }
          const s = text === null ? null : parseLoraInfo(text);
          for (const id of byAddress[address]) this.table.set(id, s);
        }),
      );
    } finally {
      this.busy = false;
    }
  }
}
