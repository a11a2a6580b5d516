// LoRA adapter state per worker, for the lora-slots filter and the
// lora-affinity scorer (scheduling/plugins). vLLM reports it on /metrics as
// one gauge (vllm/v1/metrics/loggers.py):
//   vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7e9
// max_lora is --max-loras (adapters one batch can run); the two lists are the
// adapters of running and of waiting requests, joined by ","; the value is the
// time the engine last recorded that pair of lists. Every new pair is a new
// series and the old ones stay, so the current state is the series with the
// largest value. This is what the Gateway API Inference Extension's LoRA
// affinity reads too. An adapter resident in a GPU slot but with no request
// is in neither list: the router remembers where it sent each adapter
// recently as a weaker sign that it is still loaded there.
// Pure and ES5-safe (njs bundles core/).
import { Store, storedJson } from "./store";

export interface LoraState {
  maxLora: number;
  running: string[];
  waiting: string[];
}

export const LORA_METRIC = "vllm:lora_requests_info";

function labelValue(labels: string, name: string): string | null {
  // Prometheus text format: name="value" with \\, \" and \n escaped.
  let i = 0;
  while (i < labels.length) {
    while (i < labels.length && (labels.charAt(i) === "," || labels.charAt(i) === " ")) i++;
    const eq = labels.indexOf("=", i);
    if (eq < 0) return null;
    const key = labels.slice(i, eq).trim();
    if (labels.charAt(eq + 1) !== '"') return null;
    let j = eq + 2;
    let v = "";
    while (j < labels.length && labels.charAt(j) !== '"') {
      if (labels.charAt(j) === "\\" && j + 1 < labels.length) {
        const c = labels.charAt(j + 1);
        v += c === "n" ? "\n" : c;
        j += 2;
      } else v += labels.charAt(j++);
    }
    if (key === name) return v;
    i = j + 1;
  }
  return null;
}

function names(v: string | null): string[] {
  const out: string[] = [];
  if (!v) return out;
  const parts = v.split(",");
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i].trim();
    if (p && out.indexOf(p) < 0) out.push(p);
  }
  return out;
}

/** The worker's current adapter state from its /metrics text; null when it exports no LoRA gauge. */
export function parseLoraInfo(text: string): LoraState | null {
  let best: LoraState | null = null;
  let bestValue = -Infinity;
  let at = text.indexOf(LORA_METRIC + "{");
  while (at >= 0) {
    const lineStart = at === 0 || text.charAt(at - 1) === "\n";
    const open = at + LORA_METRIC.length;
    const close = text.indexOf("}", open);
    if (close < 0) break;
    const eol = text.indexOf("\n", close);
    const value = parseFloat(text.slice(close + 1, eol < 0 ? text.length : eol).trim());
    if (lineStart && !isNaN(value) && value >= bestValue) {
      const labels = text.slice(open + 1, close);
      const max = parseInt(labelValue(labels, "max_lora") || "", 10);
      best = {
        maxLora: isNaN(max) || max < 0 ? 0 : max,
        running: names(labelValue(labels, "running_lora_adapters")),
        waiting: names(labelValue(labels, "waiting_lora_adapters")),
      };
      bestValue = value;
    }
    at = text.indexOf(LORA_METRIC + "{", close);
  }
  return best;
}

/** How a worker stands for one adapter. */
export type LoraFit = "loaded" | "recent" | "free-slot" | "evicts" | "full" | "unknown";

export interface LoraTable {
  /** A worker's scraped state (null: none, or not a LoRA engine); clears the notes taken since the last one. */
  set(workerId: string, s: LoraState | null): void;
  get(workerId: string): LoraState | null;
  /** The router sent a request for `adapter` to the worker at `now` (ms). */
  note(workerId: string, adapter: string, now: number): void;
  /** Names known to be adapters (workers' /v1/models parents, or seen in a gauge). */
  markAdapter(name: string): void;
  isAdapter(name: string): boolean;
  fit(workerId: string, adapter: string, now: number): LoraFit;
  drop(workerId: string): void;
}

/** Attaches a LoRA table to a router state (adapters call this once). */
export function withLora<S extends { lora?: LoraTable }>(state: S, table: LoraTable): S {
  state.lora = table;
  return state;
}

/** A sent adapter counts as probably still in a slot there for this long after its last request. */
export const LORA_RECENT_MS = 60000;

interface Entry {
  state: LoraState | null;
  /** Adapters sent since the last scrape: they are waiting or running there now. */
  pending: string[];
  /** adapter -> when the router last sent it there (ms). */
  sent: { [adapter: string]: number };
}

function has(list: string[], x: string): boolean {
  return list.indexOf(x) >= 0;
}

/** Where a table keeps its entries and the adapter names it knows. */
interface LoraIO {
  /** The worker's entry (null: none yet). */
  load(id: string): Entry | null;
  /** Writes the entry back (a no-op for entries kept as live objects). */
  save(id: string, e: Entry): void;
  drop(id: string): void;
  mark(name: string): void;
  known(name: string): boolean;
}

/** The table's rules, over any place that keeps the entries (memory in Node, a shared dict in nginx). */
function loraTable(io: LoraIO): LoraTable {
  const entry = (id: string): Entry => io.load(id) || { state: null, pending: [], sent: {} };
  return {
    set(id, s) {
      const e = entry(id);
      e.state = s;
      e.pending = [];
      io.save(id, e);
      if (s) {
        for (let i = 0; i < s.running.length; i++) io.mark(s.running[i]);
        for (let i = 0; i < s.waiting.length; i++) io.mark(s.waiting[i]);
      }
    },
    get(id) {
      const e = io.load(id);
      return e ? e.state : null;
    },
    note(id, adapter, now) {
      const e = entry(id);
      if (!has(e.pending, adapter)) e.pending.push(adapter);
      e.sent[adapter] = now;
      // The engine keeps max_lora adapters in its slots, least recently used
      // out first: so does this memory, or an adapter evicted there would
      // still look resident and draw requests that load it again.
      const max = e.state ? e.state.maxLora : 0;
      if (max > 0)
        for (;;) {
          let n = 0;
          let oldest: string | null = null;
          for (const k in e.sent) {
            if (!Object.prototype.hasOwnProperty.call(e.sent, k)) continue;
            n++;
            if (oldest === null || e.sent[k] < e.sent[oldest]) oldest = k;
          }
          if (n <= max || oldest === null) break;
          delete e.sent[oldest];
        }
      io.save(id, e);
    },
    markAdapter(name) {
      io.mark(name);
    },
    isAdapter: (name) => io.known(name),
    fit(id, adapter, now) {
      const e = io.load(id);
      if (!e) return "unknown";
      const s = e.state;
      if (!s) return "unknown";
      if (has(s.running, adapter) || has(s.waiting, adapter) || has(e.pending, adapter)) return "loaded";
      const sent = e.sent[adapter];
      const recent = sent !== undefined && now - sent < LORA_RECENT_MS;
      // Slots taken: distinct adapters with requests there, by the gauge or sent since.
      const busy: string[] = [];
      const lists = [s.running, s.waiting, e.pending];
      for (let l = 0; l < lists.length; l++)
        for (let i = 0; i < lists[l].length; i++) if (!has(busy, lists[l][i])) busy.push(lists[l][i]);
      if (s.maxLora > 0 && busy.length >= s.maxLora) return "full";
      if (recent) return "recent";
      // A slot is free, but other adapters sent here lately probably fill them: loading this one evicts one of theirs.
      let resident = busy.length;
      for (const k in e.sent)
        if (Object.prototype.hasOwnProperty.call(e.sent, k) && !has(busy, k) && now - e.sent[k] < LORA_RECENT_MS)
          resident++;
      return s.maxLora > 0 && resident >= s.maxLora ? "evicts" : "free-slot";
    },
    drop(id) {
      io.drop(id);
    },
  };
}

/** Node: plain objects in memory. */
export function memoryLoraTable(): LoraTable {
  const t: { [id: string]: Entry } = {};
  const adapters: { [name: string]: true } = {};
  return loraTable({
    load: (id) => (Object.prototype.hasOwnProperty.call(t, id) ? t[id] : null),
    save(id, e) {
      t[id] = e;
    },
    drop(id) {
      delete t[id];
    },
    mark(name) {
      adapters[name] = true;
    },
    known: (name) => Object.prototype.hasOwnProperty.call(adapters, name),
  });
}

/**
 * nginx: the entries in the shared dict, one JSON value per worker ("LR:<id>"),
 * the adapter names as keys ("LA:<name>"), so every nginx worker process sees
 * the bridge's scrapes and every process's sends. A note is a read, change and
 * write: two processes noting at once on one worker may lose one of the two
 * sends from the memory, which the next scrape's gauge puts right.
 */
export function storeLoraTable(st: Store): LoraTable {
  return loraTable({
    load(id) {
      const e = storedJson(st, "LR:" + id) as Entry | null;
      return e && typeof e === "object" && e.sent && e.pending ? e : null;
    },
    save(id, e) {
      st.set("LR:" + id, JSON.stringify(e));
    },
    drop(id) {
      st.del("LR:" + id);
    },
    mark(name) {
      if (st.get("LA:" + name) === undefined) st.set("LA:" + name, "1");
    },
    known: (name) => st.get("LA:" + name) !== undefined,
  });
}
