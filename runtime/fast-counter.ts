// A labelled counter for the request path (each pick's picks, hit-block and
// request-block counts, each request's outcome): prom-client's Counter hashes
// and validates the label set on every inc(); here inc(labels, v) finds its
// series by the label values alone and adds. The registry reads it like a
// prom-client Counter: the same name, help, type, labels and exposition, and a
// series is listed from its first inc() on (an inc by 0 included), the
// unlabelled one from the start.
import * as client from "prom-client";
import { SeriesByLabels } from "./fast-series";

interface Series {
  labels: Record<string, string>;
  value: number;
}

export class FastCounter {
  readonly type = "counter" as const;
  readonly aggregator = "sum" as const;
  readonly name: string;
  readonly help: string;
  readonly labelNames: string[];
  private readonly series: SeriesByLabels<Series>;

  constructor(cfg: { name: string; help: string; labelNames: string[] }, registry: client.Registry) {
    this.name = cfg.name;
    this.help = cfg.help;
    this.labelNames = cfg.labelNames;
    this.series = new SeriesByLabels<Series>(cfg.labelNames);
    registry.registerMetric(this as unknown as client.Metric<string>);
    this.reset();
  }

  /** prom-client's forms: inc(), inc(value), inc(labels), inc(labels, value). */
  inc(labels?: Record<string, string> | number, value?: number): void {
    let v = typeof labels === "number" ? labels : value;
    if (v === undefined || v === null) v = 1;
    if (v && !Number.isFinite(v)) throw new TypeError(`Value is not a valid number: ${v}`);
    if (v < 0) throw new Error("It is not possible to decrease a counter");
    const l = typeof labels === "object" && labels ? labels : {};
    this.series.get(l, (copy) => ({ labels: copy, value: 0 })).value += v;
  }

  /** Every series goes (as prom-client's reset does); the unlabelled one stays at 0. */
  reset(): void {
    this.series.clear();
    if (!this.labelNames.length) this.inc(0);
  }

  async get(): Promise<client.MetricObjectWithValues<client.MetricValue<string>>> {
    return {
      name: this.name,
      help: this.help,
      type: this.type as unknown as client.MetricType,
      aggregator: this.aggregator,
      values: this.series.list.map((s) => ({ value: s.value, labels: s.labels })),
    } as client.MetricObjectWithValues<client.MetricValue<string>>;
  }
}
