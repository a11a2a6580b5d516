import * as assert from "node:assert/strict";
import { createRouter, defaultConfig, Router, RouterConfig, WorkerSpec } from "../../core/router";
import { memoryState } from "../../core/state/memory";
import { RouterState } from "../../core/state/types";
import { BlockHash, Features } from "../../core/types";
import { logfmt } from "../../core/log";

export function mk(specs: Partial<WorkerSpec>[], cfg: Partial<RouterConfig> = {}, logs?: string[]) {
  const st: RouterState = memoryState();
  const demand: unknown[] = [];
  const r: Router = createRouter(
    st,
    { ...defaultConfig(), ...cfg },
    {
      log: (_l, msg, fields) => logs?.push(logfmt(msg, fields)),
      onDemand: (d) => demand.push(d),
      random: () => 0.99,
    },
  );
  for (const [i, s] of specs.entries())
    r.addWorker({
      id: s.id ?? `w${i}`,
      address: s.address ?? `127.0.0.1:${8000 + i}`,
      role: s.role ?? "mixed",
      blockSize: s.blockSize,
      events: s.events,
    });
  return { st, r, demand };
}

export const blocks = (prefix: string, n: number) =>
  Array.from({ length: n }, (_, i) => `${prefix}${i.toString(16).padStart(14, "0")}`.slice(-16) as BlockHash);

/** Marks the first blocks as cached on worker id (through the mirror, as events would). */
export function cache(st: RouterState, r: Router, id: string, bs: BlockHash[]): void {
  const w = r.worker(id)!;
  for (const b of bs) st.mirror.store(w.epochKey, "eng-" + b, b);
}

export function feats(bs: BlockHash[], extra: Partial<Features> = {}): Features {
  return { blocks: bs, inputTokens: bs.length * 16, exact: true, mediaHashes: [], n: 1, ...extra };
}

/** A CLI refusal: exit 2, one line on stderr matching re, no stack trace. */
export function oneLine(r: { status: number | null; stderr: string }, re: RegExp) {
  assert.equal(r.status, 2, r.stderr);
  const lines = r.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `one line, got:\n${r.stderr}`);
  assert.match(lines[0], re);
  assert.doesNotMatch(r.stderr, /^\s+at /m, "no stack trace");
}
