// Render-parity probe: when a worker joins and every --render-probe-interval,
// a few fixed conversations (tools, parallel tool calls, tool results,
// reasoning) go to the worker's tokenize endpoint and the ids are compared
// with the router's own. A worker whose engine renders differently (another
// chat template, tokenizer or preprocessing) would make kv-aware routing
// silently miss; this makes it visible: status exact | diverged | unchecked
// in GET /v1/admin/workers and infera_router_render_parity{worker,status}.
//   vLLM:   POST /tokenize {model, messages, tools, add_generation_prompt, ...} -> {tokens}
//   SGLang: POST /tokenize {prompt, add_special_tokens} -> {tokens}: it takes
//           text only, so the router sends its own rendered prompt and the
//           probe checks the tokenizer, not the chat template.
import * as client from "prom-client";
import { spec } from "./metrics";
import { parseRequest, promptTokenIds, Tokenizer } from "../core/request";

export type ParityStatus = "exact" | "diverged" | "unchecked";

export interface ParityState {
  status: ParityStatus;
  /** ISO time of the last probe, null before the first. */
  checked_at: string | null;
  /** diverged: which probe and the first differing token position (never prompt text). */
  probe?: string;
  position?: number;
  /** unchecked: why (no tokenizer, endpoint missing, unreachable ...). */
  reason?: string;
  api: "vllm" | "sglang";
}

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather for a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string" }, unit: { type: "string", enum: ["c", "f"] } },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "lookup_order",
      description: "Order status by id",
      parameters: { type: "object", properties: { order_id: { type: "integer" } }, required: ["order_id"] },
    },
  },
];

/** Fixed probe conversations. Only token ids and positions are ever logged. */
export const PROBES: { name: string; body: Record<string, unknown> }[] = [
  {
    name: "tools-parallel-calls",
    body: {
      messages: [
        { role: "system", content: "You are a helpful assistant." },
        { role: "user", content: "Weather in Zürich and 東京?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            {
              id: "p1",
              type: "function",
              function: { name: "get_weather", arguments: '{"city": "Zürich", "unit": "c"}' },
            },
            { id: "p2", type: "function", function: { name: "get_weather", arguments: '{"city": "東京"}' } },
          ],
        },
        { role: "tool", tool_call_id: "p1", content: '{"temp": 7}' },
        { role: "tool", tool_call_id: "p2", content: '{"temp": 14}' },
      ],
      tools: TOOLS,
    },
  },
  {
    name: "multi-turn-reasoning",
    body: {
      messages: [
        { role: "user", content: "Where is order 42?" },
        {
          role: "assistant",
          content: "Let me check.",
          reasoning: "Need lookup_order.",
          tool_calls: [
            { id: "p3", type: "function", function: { name: "lookup_order", arguments: '{"order_id": 42}' } },
          ],
        },
        { role: "tool", tool_call_id: "p3", content: "shipped" },
        { role: "assistant", content: "It has shipped." },
        { role: "user", content: "Thanks — and the weather at the depot?" },
      ],
      tools: TOOLS,
    },
  },
  { name: "plain", body: { messages: [{ role: "user", content: "Say hello." }] } },
];

function firstDiff(a: number[], b: number[]): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i === a.length && i === b.length ? -1 : i;
}

/** Probes one worker. Never throws: failures are `unchecked` with a reason. */
export async function probeWorker(
  address: string,
  tok: Tokenizer | null,
  api: "vllm" | "sglang",
  model: string | null,
  timeoutMs: number,
): Promise<ParityState> {
  const now = () => new Date().toISOString();
  if (!tok) return { status: "unchecked", checked_at: now(), reason: "router has no tokenizer", api };
  for (const p of PROBES) {
    // vLLM checks `model` against what it serves; without a known name it is left out.
    const body: Record<string, unknown> = model
      ? { model, add_generation_prompt: true, ...p.body }
      : { add_generation_prompt: true, ...p.body };
    const text = JSON.stringify({ model: model ?? "probe", ...body });
    let mine: number[];
    let payload: unknown;
    try {
      const req = parseRequest("chat", text, text.length, { maxBodyBytes: 1 << 24 });
      mine = promptTokenIds(req, tok) as number[];
      payload =
        api === "vllm"
          ? body
          : { ...(model ? { model } : {}), prompt: tok.renderChat(req.chat!), add_special_tokens: false };
    } catch (e) {
      return {
        status: "unchecked",
        checked_at: now(),
        reason: "router cannot render probe " + p.name + ": " + (e as Error).message,
        api,
      };
    }
    let theirs: number[];
    try {
      const r = await fetch(`http://${address}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(payload),
        signal: AbortSignal.timeout(timeoutMs),
      });
      if (!r.ok) {
        await r.arrayBuffer().catch(() => undefined);
        return { status: "unchecked", checked_at: now(), reason: `POST /tokenize answered ${r.status}`, api };
      }
      const j = (await r.json()) as { tokens?: unknown };
      if (!Array.isArray(j.tokens))
        return { status: "unchecked", checked_at: now(), reason: "POST /tokenize returned no token list", api };
      theirs = j.tokens as number[];
    } catch (e) {
      return { status: "unchecked", checked_at: now(), reason: "POST /tokenize failed: " + (e as Error).message, api };
    }
    const d = firstDiff(mine, theirs);
    if (d >= 0) return { status: "diverged", checked_at: now(), probe: p.name, position: d, api };
  }
  return { status: "exact", checked_at: now(), api };
}

export interface ProbeOptions {
  intervalMs: number;
  api: "vllm" | "sglang";
  timeoutMs: number;
}

/** Keeps every worker's parity state; probes on join and on the interval. */
export class RenderProbes {
  private states: Record<string, ParityState> = {};
  private addresses: Record<string, string> = {};
  private timer: NodeJS.Timeout | null = null;

  constructor(
    /** The worker's tokenizer and a model name it serves (null: unknown). */
    private readonly target: (id: string) => { tok: Tokenizer | null; model: string | null },
    private readonly o: ProbeOptions,
    private readonly log: (level: "info" | "warn", msg: string, fields?: Record<string, string | number>) => void,
    registry: client.Registry,
    /** A worker's status changed (the nginx bridge pushes it to njs). */
    private readonly onChange?: (id: string, status: ParityStatus) => void,
  ) {
    const self = this;
    new client.Gauge({
      ...spec("infera_router_render_parity"),
      registers: [registry],
      collect() {
        this.reset();
        for (const id of Object.keys(self.addresses))
          for (const s of ["exact", "diverged", "unchecked"] as const)
            this.set({ worker: id, status: s }, self.state(id).status === s ? 1 : 0);
      },
    });
  }

  state(id: string): ParityState {
    return this.states[id] ?? { status: "unchecked", checked_at: null, reason: "not probed yet", api: this.o.api };
  }

  /** A worker joined (or changed address): probe it now. */
  join(id: string, address: string): Promise<void> {
    const changed = this.addresses[id] !== address;
    this.addresses[id] = address;
    return changed ? this.check(id) : Promise.resolve();
  }

  /** Some worker renders differently from the router: its token counts are not ours. */
  anyDiverged(): boolean {
    for (const id of Object.keys(this.states)) if (this.states[id].status === "diverged") return true;
    return false;
  }

  leave(id: string): void {
    delete this.addresses[id];
    delete this.states[id];
  }

  async check(id: string): Promise<void> {
    const address = this.addresses[id];
    if (!address) return;
    const t = this.target(id);
    const s = await probeWorker(address, t.tok, this.o.api, t.model, this.o.timeoutMs);
    if (this.addresses[id] !== address) return; // left or moved meanwhile
    const prev = this.states[id];
    this.states[id] = s;
    if (s.status === "diverged")
      this.log(
        "warn",
        `render parity: worker ${id} diverged at token ${s.position} of probe ${s.probe}; its prompts hash to blocks the router cannot match`,
        { worker: id, position: s.position ?? -1, probe: s.probe ?? "" },
      );
    else if (s.status === "exact" && prev?.status !== "exact") this.log("info", "render parity: exact", { worker: id });
    else if (s.status === "unchecked" && prev?.status !== "unchecked")
      this.log("info", "render parity: unchecked", { worker: id, reason: s.reason ?? "" });
    if (this.onChange && prev?.status !== s.status) this.onChange(id, s.status);
  }

  start(): void {
    if (this.timer || !(this.o.intervalMs > 0)) return;
    this.timer = setInterval(
      () => void Promise.all(Object.keys(this.addresses).map((id) => this.check(id))),
      this.o.intervalMs,
    );
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}

/** "10m", "30s", "500ms", "1h" or plain seconds; "off" or 0 = no periodic probes. */
export function parseInterval(flag: string, v: string): number {
  if (v === "off") return 0;
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(v.trim());
  if (!m) throw new Error(`${flag}: expected a duration like 10m, 30s or 500ms, got '${v}'`);
  const n = Number(m[1]);
  const unit = m[2] ?? "s";
  return Math.round(n * (unit === "ms" ? 1 : unit === "s" ? 1000 : unit === "m" ? 60000 : 3600000));
}
