// A labelled histogram for the request path: the per-plugin timer (every
// filter, scorer, picker and lifecycle hook of every pick), the pick and
// decision latencies and the TTFT prediction error at each first token.
// prom-client's Histogram checks and hashes the label set on every observe(),
// even through a bound child; here a child is a plain record of bucket counts,
// so an observation is a bucket search and three additions, and observe(labels,
// v) finds its child by the label values alone. The registry reads it like any
// prom-client metric: the same name, help, type, labels, buckets and
// exposition (cumulative buckets, +Inf, _sum, _count per label set), so scrapes
// and getMetricsAsJSON() see no difference.
import * as client from "prom-client";
import { SeriesByLabels } from "./fast-series";

/** One label set's counts: per bucket (not cumulative), then the total and the sum. */
interface Series {
  labels: Record<string, string>;
  counts: Float64Array;
  count: number;
  sum: number;
  /** Listed in the exposition: observed since the last reset, or the unlabelled series before any reset (as prom-client does). */
  listed: boolean;
}

export interface FastChild {
  observe(value: number): void;
}

export class FastHistogram {
  readonly type = "histogram" as const;
  readonly aggregator = "sum" as const;
  readonly name: string;
  readonly help: string;
  readonly labelNames: string[];
  /** The finite upper bounds, as prom-client's Histogram names them (the metric-table test reads them). */
  readonly upperBounds: number[];
  private readonly series: SeriesByLabels<{ s: Series; child: FastChild }>;

  constructor(
    cfg: { name: string; help: string; labelNames: string[]; buckets?: number[] },
    registry: client.Registry,
  ) {
    this.name = cfg.name;
    this.help = cfg.help;
    this.labelNames = cfg.labelNames;
    this.series = new SeriesByLabels<{ s: Series; child: FastChild }>(cfg.labelNames);
    this.upperBounds = (cfg.buckets ?? [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]).slice();
    registry.registerMetric(this as unknown as client.Metric<string>);
    if (!this.labelNames.length) this.labels({});
    if (this.series.list.length) this.series.list[0].s.listed = true;
  }

  /** The child for one label set; keep it: every observe() through it is allocation-free. */
  labels(labels: Record<string, string>): FastChild {
    return this.series.get(labels, (copy) => this.makeSeries(copy)).child;
  }

  private makeSeries(labels: Record<string, string>): { s: Series; child: FastChild } {
    const s: Series = { labels, counts: new Float64Array(this.upperBounds.length), count: 0, sum: 0, listed: false };
    const bounds = this.upperBounds;
    const child: FastChild = {
      observe(v: number) {
        if (!Number.isFinite(v)) return;
        for (let i = 0; i < bounds.length; i++)
          if (v <= bounds[i]) {
            s.counts[i]++;
            break;
          }
        s.count++;
        s.sum += v;
        s.listed = true;
      },
    };
    return { s, child };
  }

  /** prom-client's two forms: observe(value) without labels, observe(labels, value) with them. */
  observe(labels: Record<string, string> | number, value?: number): void {
    if (typeof labels === "number") this.labels({}).observe(labels);
    else this.labels(labels).observe(value as number);
  }

  /** Children stay bound; their counts start again from zero. */
  reset(): void {
    for (const { s } of this.series.list) {
      s.counts.fill(0);
      s.count = 0;
      s.sum = 0;
      s.listed = false;
    }
  }

  async get(): Promise<client.MetricObjectWithValues<client.MetricValueWithName<string>>> {
    const values: client.MetricValueWithName<string>[] = [];
    const bucket = `${this.name}_bucket`;
    for (const { s } of this.series.list) {
      if (!s.listed) continue;
      let acc = 0;
      for (let i = 0; i < this.upperBounds.length; i++) {
        acc += s.counts[i];
        values.push({ labels: { le: this.upperBounds[i], ...s.labels }, value: acc, metricName: bucket });
      }
      values.push({ labels: { le: "+Inf", ...s.labels }, value: s.count, metricName: bucket });
      values.push({ labels: { ...s.labels }, value: s.sum, metricName: `${this.name}_sum` });
      values.push({ labels: { ...s.labels }, value: s.count, metricName: `${this.name}_count` });
    }
    return {
      name: this.name,
      help: this.help,
      type: this.type as unknown as client.MetricType,
      aggregator: this.aggregator,
      values,
    } as client.MetricObjectWithValues<client.MetricValueWithName<string>>;
  }
}
