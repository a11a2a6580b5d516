// What the KV-transfer A/B benches (conditional-pd.ts, kv-source.ts) share:
// their numeric flags, the simulator model with KV transfer, streamed
// requests timed to the first chunk, and sides run in ABBA order on fresh
// fleets. Each bench keeps its own fleet, clients and table.

/** `--name N` from the command line, else def. */
export function numArg(name: string, def: number): number {
  const i = process.argv.indexOf("--" + name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}

/**
 * Simulator flags for an 8B-class model: 32 layers x 8 KV heads x 128 dims x
 * K,V x 2 bytes = 128 KiB of KV per token, moved over 100 Gbit/s (see
 * docs/simulator.md). timeScale below 1 runs engine time slower than wall
 * time, so the simulated work dwarfs the CPU noise of a shared machine.
 */
export function transferSim(timeScale: number, extra: string[] = []): string[] {
  return [
    "--prefill-us-per-token",
    "60",
    "--decode-ms-per-token",
    "12",
    "--kv-bytes-per-token",
    "131072",
    "--kv-link-gbps",
    "100",
    ...extra,
    "--time-scale",
    String(timeScale),
  ];
}

export interface Timed {
  status: number;
  headers: Headers;
  /** ms from the request to the first chunk (-1: none came). */
  ttft: number;
  /** ms between each later chunk and the one before it. */
  gaps: number[];
  /** The streamed body. */
  text: string;
}

/** POSTs a chat completion body (stream: true) and times its chunks. */
export async function timedChat(base: string, body: Record<string, unknown>): Promise<Timed> {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let ttft = -1;
  let last = 0;
  let text = "";
  const gaps: number[] = [];
  for (let i = 0; i < 100000; i++) {
    const c = await reader.read();
    if (c.done) break;
    const now = performance.now();
    if (ttft < 0) ttft = now - t0;
    else gaps.push(now - last);
    last = now;
    text += dec.decode(c.value);
  }
  return { status: r.status, headers: r.headers, ttft, gaps, text };
}

/** Runs n clients at once; the wall ms until the last is done. */
export async function clientsWall(n: number, client: (k: number) => Promise<void>): Promise<number> {
  const t0 = performance.now();
  await Promise.all(Array.from({ length: n }, (_, k) => client(k)));
  return performance.now() - t0;
}

/**
 * Each mode's side once a round, in ABBA order (ABC CBA with three sides: odd
 * rounds reversed), so a drift in the machine's load hits all sides alike.
 * Returns each mode's sides, one a round, in round order.
 */
export async function abbaRounds<M extends string, S>(
  modes: M[],
  rounds: number,
  side: (mode: M) => Promise<S>,
): Promise<Record<M, S[]>> {
  const all = {} as Record<M, S[]>;
  for (const m of modes) all[m] = [];
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 ? modes.slice().reverse() : modes;
    for (const m of order) all[m].push(await side(m));
  }
  return all;
}

const VOCAB = (
  "the of and to in is that for it as with was on be by this are or from at which an but not have has " +
  "file function return value error test code line change build request worker cache token model step " +
  "read write open close call check update list index name type field config path server client agent " +
  "tool result output input data time first last next more less each other only also then when where " +
  "because while after before should could would will can may must use used using run runs running " +
  "add remove fix bug issue patch commit branch merge review note plan task goal state event queue"
).split(" ");

/**
 * `words` English words picked by a generator seeded from `seed` (about one
 * token a word, as prose and code comments tokenize), unlike test/harness's
 * longText whose made-up words are ~10 tokens each.
 */
export function naturalText(seed: string, words: number): string {
  let h = 2166136261;
  for (let i = 0; i < seed.length; i++) h = Math.imul(h ^ seed.charCodeAt(i), 16777619) >>> 0;
  const out: string[] = [];
  for (let i = 0; i < words; i++) {
    h = (Math.imul(h, 1664525) + 1013904223) >>> 0;
    out.push(VOCAB[h % VOCAB.length]);
  }
  return out.join(" ");
}

/** The generated text and usage of a streamed chat completion body (SSE). */
export function streamedAnswer(sse: string): { content: string; prompt: number; cached: number } {
  let content = "";
  let prompt = 0;
  let cached = 0;
  for (const line of sse.split("\n")) {
    if (!line.startsWith("data: {")) continue;
    const j = JSON.parse(line.slice(6));
    const d = j.choices && j.choices[0] && j.choices[0].delta;
    if (d && typeof d.content === "string") content += d.content;
    if (j.usage) {
      prompt = j.usage.prompt_tokens;
      cached = (j.usage.prompt_tokens_details && j.usage.prompt_tokens_details.cached_tokens) || 0;
    }
  }
  return { content, prompt, cached };
}
