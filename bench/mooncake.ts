// The public Mooncake conversation trace as bench:trace and bench:policy-sim
// replay it: the same sample, the same arrival times, the same token ids.
import * as fs from "fs";
import * as path from "path";

const NAME = "mooncake_conversation_trace.jsonl";

/**
 * The trace file: `given` (relative to the repository) or ../shared/traces
 * beside the checkout, else the machine's shared copy.
 */
export function traceFile(given?: string): string {
  const want = path.resolve(__dirname, "..", given || path.join("..", "..", "shared", "traces", NAME));
  const shared = path.join("/work/shared/traces", NAME);
  const found = [want, shared].find((f) => fs.existsSync(f));
  if (!found) throw new Error(`no Mooncake trace at ${want} or ${shared}`);
  return found;
}

export interface TraceRow {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
}

/**
 * One in `every` conversations (requests sharing their first two block ids),
 * so the reuse of the full trace survives the sampling; a window of
 * consecutive requests would see almost none (turns are minutes apart). The
 * trace's span is compressed into `seconds`; `at` is the arrival in ms.
 */
export function sampleTrace(file: string, every: number, seconds: number): { at: number; row: TraceRow }[] {
  const rows = fs
    .readFileSync(file, "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as TraceRow);
  const groups = new Map<string, number[]>();
  rows.forEach((r, i) => {
    const k = r.hash_ids.length > 1 ? r.hash_ids.slice(0, 2).join(",") : `single${i}`;
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k)!.push(i);
  });
  const keep: number[] = [];
  let g = 0;
  for (const idx of groups.values()) if (g++ % every === 0) keep.push(...idx);
  keep.sort((a, b) => a - b);
  const scale = (seconds * 1000) / (rows[rows.length - 1].timestamp - rows[0].timestamp);
  return keep.map((i) => ({ at: (rows[i].timestamp - rows[0].timestamp) * scale, row: rows[i] }));
}

/** Deterministic 512-token id block for a Mooncake hash id. */
export function idBlock(h: number): number[] {
  const out: number[] = [];
  let s = (h * 2654435761 + 12345) >>> 0;
  for (let k = 0; k < 512; k++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    out.push(1000 + (s % 140000));
  }
  return out;
}

/** A row's prompt as token ids: its blocks' ids, cut to its input length. */
export function traceIds(r: TraceRow): number[] {
  const ids: number[] = [];
  for (const h of r.hash_ids) ids.push(...idBlock(h));
  return ids.slice(0, r.input_length);
}
