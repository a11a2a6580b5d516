// Model eligibility: a request goes only to workers that serve its `model`
// (a base model or a LoRA adapter, as the worker's GET /v1/models lists them).
// Pure and njs-safe. The table hangs off the router state (state.models, set
// by the adapter: memory in Node, shared dict in njs) and the "model" filter
// plugin (scheduling/plugins/filter/model.ts) applies the rules:
// - a worker that never reported models, or reported none, serves anything
//   (static fleets without /v1/models keep working);
// - a model some worker reports -> only the workers reporting it;
// - a model no worker reports -> the workers with no list, if any; else 404
//   in vLLM's shape ("The model `x` does not exist.", NotFoundError, param model).
import { hasOwn, httpError, HttpError } from "./util";
import { RouterState } from "./state/types";

export interface ModelTable {
  /** The models a worker reported, or null when it never did (or reported none). */
  get(workerId: string): string[] | null;
  set(workerId: string, models: string[] | null): void;
}

/** Node: a plain object. */
export function memoryModelTable(): ModelTable {
  const t: { [id: string]: string[] } = {};
  return {
    get: (id) => (hasOwn(t, id) && t[id].length ? t[id] : null),
    set: (id, models) => {
      if (models === null) delete t[id];
      else t[id] = models.slice();
    },
  };
}

/** Attaches a model table to a router state (adapters call this once). */
export function withModels<S extends RouterState>(state: S, table: ModelTable): S {
  state.models = table;
  return state;
}

export function modelNotFound(model: string): HttpError {
  const e = httpError(404, "The model `" + model + "` does not exist.", "NotFoundError");
  e.param = "model";
  return e;
}

function split<W extends { id: string }>(table: ModelTable, list: W[], model: string): { serving: W[]; unknown: W[] } {
  const yes: W[] = [];
  const unknown: W[] = [];
  for (let i = 0; i < list.length; i++) {
    const ms = table.get(list[i].id);
    if (ms === null) unknown.push(list[i]);
    else if (ms.indexOf(model) >= 0) yes.push(list[i]);
  }
  return { serving: yes, unknown: unknown };
}

/**
 * The workers of `pool` eligible for `model`. Throws the 404 when no worker of
 * the whole fleet can serve it (an empty pool otherwise means "busy elsewhere").
 */
export function eligible<W extends { id: string }>(
  table: ModelTable | undefined,
  pool: W[],
  fleet: W[],
  model: string | undefined,
): W[] {
  if (!table || model === undefined || model === null) return pool;
  const all = split(table, fleet, model);
  if (!all.serving.length && !all.unknown.length && fleet.length) throw modelNotFound(model);
  const s = split(table, pool, model);
  return all.serving.length ? s.serving : s.unknown;
}
