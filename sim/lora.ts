// vLLM's LoRA gauge, as its Prometheus logger writes it
// (vllm/v1/metrics/loggers.py): vllm:lora_requests_info with the labels
// max_lora, waiting_lora_adapters and running_lora_adapters (adapter names
// joined by ","), set to the current time. Each new pair of adapter lists is a
// new series and the old ones stay with their last time, so the current state
// is the series with the largest value. The simulator records the state when
// it is scraped (vLLM records it every engine step).

export class LoraInfoSeries {
  private series = new Map<string, number>();
  constructor(private maxLora: number) {}

  record(running: string[], waiting: string[], nowSec: number): void {
    const key = `max_lora="${this.maxLora}",running_lora_adapters="${running.join(",")}",waiting_lora_adapters="${waiting.join(",")}"`;
    this.series.delete(key);
    this.series.set(key, nowSec);
    // vLLM never drops a series; a bound keeps a long simulator run small.
    while (this.series.size > 256) this.series.delete(this.series.keys().next().value as string);
  }

  text(): string {
    let out = "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n";
    for (const [k, v] of this.series) out += `vllm:lora_requests_info{${k}} ${v}\n`;
    return out;
  }
}
