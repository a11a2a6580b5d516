// The series lookup FastCounter and FastHistogram share: a series per label
// set, found by the label values alone (joined in the metric's label order),
// so the request path never hashes or validates a label object. Listing order
// is creation order, as prom-client's exposition lists its series.

export class SeriesByLabels<S> {
  readonly list: S[] = [];
  private byKey: Record<string, S> = {};

  constructor(private readonly labelNames: string[]) {}

  /** The series of `labels`, made by `make` (given a copy of the labels) the first time. */
  get(labels: Record<string, string>, make: (labels: Record<string, string>) => S): S {
    let key = "";
    for (let i = 0; i < this.labelNames.length; i++) key += (labels[this.labelNames[i]] ?? "") + "\u0000";
    const known = this.byKey[key];
    if (known) return known;
    const s = make({ ...labels });
    this.list.push(s);
    return (this.byKey[key] = s);
  }

  clear(): void {
    this.list.length = 0;
    this.byKey = {};
  }
}
