// How each simulator step model (sim/model.ts linearMs: knee, additive,
// roofline) prices the published step timings below, as a multiple of the
// step of one token (or of the decode step the row names). Two ways: with
// llama8bH100()'s constants (or the A100 ones of docs/simulator.md), and with
// each source's own fixed cost F (its one-token step) and per-token cost c
// (its slope from 2048 to 4096 tokens), which tests the shape alone.
//
// Usage: npm run bench:step-model [-- --knee-exp 1.4]
// The figures are typed in from the public sources named beside them; nothing
// is measured here.
import { CostModel, linearMs, llama8bH100 } from "../sim/model";
import { optionReader } from "./args";

const opt = optionReader(process.argv.slice(2));
const KNEE_EXP = Number(opt("--knee-exp", String(llama8bH100().stepKneeExp)));
const MODELS: NonNullable<CostModel["stepModel"]>[] = ["additive", "roofline", "knee"];

interface Source {
  title: string;
  /** Step time (ms) by tokens in the batch. */
  ms: { [tokens: number]: number };
  /** Constants of the simulator's model for this GPU. */
  sim: { F: number; c: number; label: string };
  /** Decodes in the step each row is compared with (rows are that many decodes plus N - decodes prefill tokens). */
  decodes: number;
}

// Vidur's published GPU profiles (microsoft/vidur, data/profiling/compute/<gpu>/<model>/mlp.csv, tensor
// parallel 1): median time of the per-layer token-wise operators (QKV and output projections, MLP up and
// down, norms, rotary, activation, residual add) by tokens in the batch, x 32 layers. No attention kernel.
const vidurH100: Source = {
  title: "Vidur, H100, Llama-2-7B: linear layers and norms of one step (32 layers) by batch tokens",
  ms: {
    1: 5.6,
    8: 5.5,
    32: 5.79,
    64: 5.86,
    104: 6.35,
    128: 6.37,
    192: 7.41,
    256: 9.15,
    384: 11.04,
    512: 11.98,
    1024: 21.02,
    2048: 40.32,
    4096: 83.47,
  },
  sim: { F: 6.3, c: 0.035, label: "llama8bH100(): F 6.3 ms, c 35 us" },
  decodes: 0,
};
const vidurA100: Source = {
  title: "Vidur, A100, Meta-Llama-3-8B: linear layers and norms of one step (32 layers) by batch tokens",
  ms: {
    1: 9.7,
    8: 9.98,
    32: 10.91,
    64: 11.23,
    104: 12.74,
    128: 13.18,
    192: 16.77,
    256: 19.49,
    384: 27.74,
    512: 34.64,
    1024: 75.14,
    2048: 145.57,
    4096: 273.57,
  },
  sim: { F: 13, c: 0.11, label: "docs/simulator.md A100 40GB: F 13 ms, c 110 us" },
  decodes: 0,
};
// Sarathi-Serve's OSDI artifact (microsoft/sarathi-serve osdi-experiments/figure-2/{decode,prefill}.csv):
// whole batch execution time, Yi-34B, tensor parallel 2 on A100 80GB PCIe: a decode batch of one, prefill-only
// batches of N tokens.
const sarathi: Source = {
  title: "Sarathi-Serve artifact, Yi-34B TP-2 A100: whole batch time, a decode of one vs prefill-only batches",
  ms: { 1: 46.8, 128: 48.09, 512: 105.58, 1024: 214.3, 2048: 366.03, 4096: 757.6 },
  sim: { F: 6.3, c: 0.035, label: "llama8bH100(): F 6.3 ms, c 35 us" },
  decodes: 0,
};

function table(src: Source, own: boolean): number[] {
  const ns = Object.keys(src.ms)
    .map(Number)
    .sort((a, b) => a - b);
  const F = own ? src.ms[1] : src.sim.F;
  const c = own ? (src.ms[4096] - src.ms[2048]) / 2048 : src.sim.c;
  const cm = (stepModel: CostModel["stepModel"]): CostModel => ({
    ...llama8bH100(),
    stepBaseMs: F,
    prefillUsPerToken: c * 1000,
    stepModel,
    stepKneeExp: KNEE_EXP,
  });
  console.log(
    `\n${src.title}; models with ${own ? `the source's own F ${F.toFixed(2)} ms, c ${(c * 1000).toFixed(1)} us` : src.sim.label}\n`,
  );
  console.log(`| batch tokens | published ms | x step of 1 | ${MODELS.map((m) => `${m} x (error)`).join(" | ")} |`);
  console.log(`|---:|---:|---:|${MODELS.map(() => "---:").join("|")}|`);
  const err = MODELS.map(() => 0);
  let rows = 0;
  for (const n of ns) {
    if (n === 1 || n === 4096) continue;
    const meas = src.ms[n] / src.ms[1];
    const cells = MODELS.map((m, i) => {
      // Prefill tokens: a decode-only step prices its one token as a decode, every other row as prefill.
      const pred = linearMs(cm(m), n, 0) / linearMs(cm(m), 0, 1);
      const e = pred / meas - 1;
      err[i] += Math.abs(e);
      return `${pred.toFixed(2)} (${e >= 0 ? "+" : ""}${(e * 100).toFixed(0)}%)`;
    });
    rows++;
    console.log(`| ${n} | ${src.ms[n].toFixed(2)} | ${meas.toFixed(2)} | ${cells.join(" | ")} |`);
  }
  console.log(`| mean abs error | | | ${err.map((e) => `${((100 * e) / rows).toFixed(0)}%`).join(" | ")} |`);
  return err.map((e) => e / rows);
}

console.log(`knee exponent p = ${KNEE_EXP}`);
const summary: [string, number[]][] = [];
for (const src of [vidurH100, vidurA100, sarathi]) {
  summary.push([`${src.title.split(":")[0]}, simulator constants`, table(src, false)]);
  summary.push([`${src.title.split(":")[0]}, the source's own F and c`, table(src, true)]);
}

// A hybrid step against the prefill alone (Sarathi-Serve artifact, osdi-experiments/table-2/results.csv,
// Yi-34B TP-2 A100): 1021 prefill tokens + 3 decodes 217.65 ms, the 1024-token prefill alone 217.24 ms,
// 4 decodes alone 68.12 ms. The simulator's models with llama8bH100()'s constants:
console.log("\nHybrid step (Sarathi-Serve table 2, Yi-34B TP-2 A100) against llama8bH100()'s constants\n");
console.log(`| batch | published ms | x prefill alone | ${MODELS.map((m) => `${m} x`).join(" | ")} |`);
console.log(`|---|---:|---:|${MODELS.map(() => "---:").join("|")}|`);
const c8 = llama8bH100();
const perDecode = c8.decodeUsPerSeq / 1000;
const step = (m: CostModel["stepModel"], p: number, d: number) =>
  linearMs({ ...c8, stepModel: m, stepKneeExp: KNEE_EXP }, p, d) + d * perDecode;
for (const [label, ms, p, d] of [
  ["1024 prefill", 217.24, 1024, 0],
  ["1021 prefill + 3 decodes", 217.65, 1021, 3],
  ["4 decodes", 68.12, 0, 4],
] as [string, number, number, number][]) {
  console.log(
    `| ${label} | ${ms.toFixed(2)} | ${(ms / 217.24).toFixed(3)} | ${MODELS.map((m) => (step(m, p, d) / step(m, 1024, 0)).toFixed(3)).join(" | ")} |`,
  );
}

// The case conditional disaggregation turns on: a decode step of 8 streams that also carries a warm turn's
// ~100 new tokens, against the same step without them (Vidur's H100 profile: 104 + 8 tokens ~ 112 interpolated
// between its rows at 104 and 128; the decodes' per-sequence and KV terms are left out on both sides).
console.log("\nA decode step of 8 carrying 100 prefill tokens, x the decode step of 8 (linear layers)\n");
console.log(`| | published x | ${MODELS.map((m) => `${m} x`).join(" | ")} |`);
console.log(`|---|---:|${MODELS.map(() => "---:").join("|")}|`);
for (const src of [vidurH100, vidurA100]) {
  const t108 = src.ms[104] + ((src.ms[128] - src.ms[104]) * 4) / 24;
  const meas = t108 / src.ms[8];
  for (const own of [false, true]) {
    const F = own ? src.ms[1] : src.sim.F;
    const c = own ? (src.ms[4096] - src.ms[2048]) / 2048 : src.sim.c;
    const cm = (m: CostModel["stepModel"]): CostModel => ({
      ...llama8bH100(),
      stepBaseMs: F,
      prefillUsPerToken: c * 1000,
      stepModel: m,
      stepKneeExp: KNEE_EXP,
    });
    console.log(
      `| ${src.title.split(":")[0]}, ${own ? "own F, c" : "simulator constants"} | ${meas.toFixed(2)} | ${MODELS.map((m) => (linearMs(cm(m), 100, 8) / linearMs(cm(m), 0, 8)).toFixed(2)).join(" | ")} |`,
    );
  }
}

console.log("\nMean abs error by source\n");
console.log(`| source | ${MODELS.join(" | ")} |`);
console.log(`|---|${MODELS.map(() => "---:").join("|")}|`);
for (const [label, e] of summary) console.log(`| ${label} | ${e.map((x) => `${(100 * x).toFixed(0)}%`).join(" | ")} |`);
