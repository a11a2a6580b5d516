// A diagnostic: with INFERA_TIMING_DUMP=<file> in its environment, the router
// appends (to <file>.<pid>) one JSON line per first token the speed model learns from (worker,
// the model's inputs, its prediction beforehand, the time it took, the
// request's x-request-id and what the scheduler replica assumed), so where
// the TTFT prediction error sits can be read off a real run
// (docs/benchmarks/2026-12-06-prediction-error.md). Off (one property read)
// without the variable.
import * as fs from "node:fs";
import { TimingInputs } from "../core/latency";
import { currentRequestId } from "./log";

const file = process.env.INFERA_TIMING_DUMP || "";
let fd: number | null = null;

export function timingDump(worker: string, predicted: number | null, ms: number, inputs: TimingInputs): void {
  if (!file) return;
  // One file per router process: a bench starts one router per workload.
  if (fd === null) fd = fs.openSync(`${file}.${process.pid}`, "a");
  const e = inputs.twin;
  // The replica's entry without its block hashes: what it assumed when the request left (core/twin.ts).
  const twin = e
    ? {
        predicted: e.predicted,
        own: e.own,
        cached: e.cached,
        sentAt: e.at,
        ahead: e.ahead,
        pendingAhead: e.pendingAhead,
        decoding: e.decoding,
      }
    : null;
  const line = { at: Date.now(), rid: currentRequestId() ?? null, worker, predicted, ms, ...inputs, twin };
  fs.writeSync(fd, JSON.stringify(line) + "\n");
}
