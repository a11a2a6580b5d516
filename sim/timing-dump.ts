// A diagnostic, the simulator's half of the router's INFERA_TIMING_DUMP
// (runtime/timing-dump.ts): with INFERA_TIMING_DUMP=<file> in its environment
// the simulator appends (to <file>.sim.<pid>) one JSON line per request at its
// first token, keyed by the x-request-id the gateway sent, with wall-clock
// times (ms since the epoch, sub-millisecond) of its arrival, of its submission
// to the engine (after parsing, rendering and tokenizing), of the end the step
// that produced it was scheduled for and of the token's emission, the cached
// prefix the engine found, and the engine's queue when it was submitted; and
// one line per cache clear. bench/twin-dump.ts joins both halves. Off (one
// property read) without the variable.
import * as fs from "node:fs";

const file = process.env.INFERA_TIMING_DUMP || "";
let fd: number | null = null;

/** Wall-clock ms since the epoch with performance.now()'s resolution (comparable across processes on one machine). */
export function wallMs(perfNow: number = performance.now()): number {
  return performance.timeOrigin + perfNow;
}

export function simDumpOn(): boolean {
  return !!file;
}

export function simTimingDump(line: Record<string, unknown>): void {
  if (!file) return;
  if (fd === null) fd = fs.openSync(`${file}.sim.${process.pid}`, "a");
  fs.writeSync(fd, JSON.stringify(line) + "\n");
}
