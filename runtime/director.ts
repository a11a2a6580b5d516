// The request director: one place that turns a request into a decision, in
// the order route (pick) -> shed -> admit -> fallbacks, for every ext_proc
// stream whether or not an Endpoint Picker gateway sends a candidate subset.
// Shedding and admission are plugins (core/scheduling/plugins/admission/,
// registered in core/scheduling/plugins.ts); the director runs them and owns
// what core cannot: the wait timer, the metrics and the log lines.
//
// The decision is plain data: the worker and the headers, body and metadata
// values naming it, or the answer to send instead; plus the reservation the
// adapter releases at the first byte and at the end. The adapter encodes it
// (extproc/processor.ts into protobuf) and knows nothing of the pipeline.
import { Endpoint } from "../core/request";
import { Guard, Pick, Reservation, Router, Worker } from "../core/router";
import { asHttpError, httpError } from "../core/util";
import { Objective, objectiveOf } from "../core/objectives";
import { sessionFromHeaders } from "../core/session-headers";
import { KV_SOURCE_HEADER } from "../core/scheduling/kv-source";
import { PrefillAdmission, protectedBand, Refusal as FlowRefusalReason, Ticket } from "../core/admission";
import { FlowMetrics, FlowRefusal, refusalOf, repickers } from "./flow";
import { AdmissionContext, admitters, Refusal as ShedRefusal, shedders } from "../core/scheduling/framework";
import { sheddableRefusal } from "../core/scheduling/plugins/admission/objective-shed";
import { DP_RANK_HEADER, dpBodyFields, prefillRankHeader, withBodyFields } from "../core/dprank";
import { Options } from "./config";
import { Metrics, RequestOutcome } from "./metrics";
import { Logger } from "./log";
import { ParityStatus } from "./probe";
import { tokenIdRequest } from "./token-ids";
import { engineIdOf } from "../core/fleet";

/** Dynamic-metadata namespace and key the gateway's ORIGINAL_DST cluster reads the pick from (GIE convention). */
export const DEST_NAMESPACE = "envoy.lb";
export const DEST_KEY = "x-gateway-destination-endpoint";
/**
 * Set (true) in the pick's metadata when the request asked for a streamed
 * answer: the shipped Envoy configs select a route by it, a short idle timeout
 * for streams (tokens keep flowing) and a long one for answers that arrive
 * whole at the end of the generation.
 */
export const STREAM_KEY = "x-infera-stream";
/** The llm-d P/D routing sidecar reads the prefill peer (host:port) from this header. */
export const LLMD_PREFILL_HEADER = "x-prefiller-host-port";

/**
 * The outcome label of a refused request (infera_router_requests_total). A 503
 * carrying a tokenizer-pool outcome (queue_full, timeout) means the router was
 * overloaded; any other 503 means no worker could take the request.
 */
export function outcomeOf(e: { status: number; outcome?: string }): RequestOutcome {
  if (e.status === 413) return "too_large";
  if (e.status === 429) return "shed";
  if (e.status === 499) return "client_closed";
  if (e.status === 503) return e.outcome === undefined ? "no_worker" : e.outcome === "error" ? "error" : "overloaded";
  return e.status >= 500 ? "error" : "bad_request";
}

/** What the director needs of the app: the routing piece, its settings, counters and log. */
export interface DirectorDeps {
  readonly opts: Options;
  readonly log: Logger;
  readonly metrics: Metrics;
  readonly router: Router;
  /** Prefill admission's slots and queues, shared with the admission gauge. */
  readonly admission: PrefillAdmission;
  /** Flow control's counters per band (runtime/flow.ts). */
  readonly flow: FlowMetrics;
  /** Parse, tokenize (on a thread when long), pick; throws an httpError to answer with. */
  routeAsync(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
  ): Promise<Pick>;
  /**
   * routeAsync(), answered on the caller's turn when the prompt is tokenized
   * inline (a promise only when it goes to a tokenizer thread); optional.
   */
  routeNow?(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
  ): Pick | Promise<Pick>;
  /** The worker's render-parity status (runtime/probe.ts); absent or null: never probed (probes off). */
  parity?(workerId: string): ParityStatus | null;
  /** Whether a sheddable request is refused whatever the pick, decided before tokenizing (runtime/routing.ts). */
  shedsCold?(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    flow: string,
    allow?: (w: Worker) => boolean,
  ): boolean;
}

export interface RouteInput {
  /** What the allowlist (core/paths.ts) made of the path: routed by prompt cache, or by load alone (null). */
  endpoint: Endpoint | null;
  body: Buffer;
  /** The request headers, lower-case, the client's routing headers already removed. */
  headers: Record<string, string>;
  /** The gateway's candidate subset (Endpoint Picker Protocol), or null when it sent none. */
  subset: string[] | null;
  /** Set when the stream ends: a request waiting for admission gives its load back and gets 499. */
  end?: StreamEnd;
}

/**
 * The stream's end as the director sees it: ended once the client, Envoy or a
 * reset closed it; onEnd (set by the director while a request waits) runs then.
 * A plain object rather than an AbortSignal: one is made per request.
 */
export interface StreamEnd {
  ended: boolean;
  onEnd: (() => void) | null;
}

/** Answer the request here: nothing was sent to a worker and nothing is held. */
export interface Refused {
  kind: "refuse";
  status: number;
  message: string;
  type: string;
  param?: string;
  /** Response headers beyond content-type. */
  headers: Record<string, string>;
  outcome: RequestOutcome;
}

/** Send the request to pick.target; the reservation goes back at its first byte and its end. */
export interface Routed {
  kind: "route";
  pick: Pick;
  /** The pick's reservation, with any admission slot's release wrapped in. */
  reservation: Reservation;
  /** The target then the fallbacks a retrying gateway walks, comma-separated (the metadata value). */
  destination: string;
  /** The request asked for a streamed answer. */
  stream: boolean;
  /** Request headers to set (upstream, worker id, destination, prefill peer, data-parallel ranks). */
  headers: Record<string, string>;
  /** Router-owned request headers to remove unless set above (only the router names prefill peers). */
  remove: string[];
  /** The body the engine must get when the pick rewrote it (SGLang rank fields, token ids), else null. */
  body: Buffer | null;
  /**
   * --send-token-ids: a chat request went to the engine's completions
   * endpoint as ids; its answer is rewritten back to the chat shape
   * (runtime/token-ids.ts). False otherwise.
   */
  chatFromCompletions: boolean;
  outcome: "routed";
}

export type Decision = Refused | Routed;

const NO_FEATURES = { blocks: [], inputTokens: 0, exact: false, mediaHashes: [], n: 1 };

function refuse(
  status: number,
  message: string,
  type: string,
  outcome: RequestOutcome,
  headers: Record<string, string> = {},
  param?: string,
): Refused {
  return { kind: "refuse", status, message, type, param, headers, outcome };
}

/** Whether every admitter would let the request go at once holding nothing (Admitter.passes). */
function passesAll(ctx: AdmissionContext): boolean {
  const list = admitters();
  for (let i = 0; i < list.length; i++) {
    const p = list[i].passes;
    if (!p || !p(ctx)) return false;
  }
  return true;
}

function nothing(): void {}

/**
 * Enters every admitter when each one says it admits the request at once
 * (Admitter.passes / admitsNow); returns their tickets, or null (nothing
 * entered) when one might make it wait. A ticket that does wait after all
 * (an admitter whose admitsNow disagrees with its enter) is left, and null
 * returned: the request then takes admitWith's path.
 */
function enterAtOnce(ctx: AdmissionContext): Ticket[] | null {
  const list = admitters();
  for (let i = 0; i < list.length; i++) {
    const a = list[i];
    if (!(a.passes && a.passes(ctx)) && !(a.admitsNow && a.admitsNow(ctx))) return null;
  }
  const tickets: Ticket[] = [];
  for (let i = 0; i < list.length; i++) {
    const t = list[i].enter(ctx, nothing, nothing);
    tickets.push(t);
    if (!t.admitted) {
      for (const x of tickets) x.leave();
      return null;
    }
  }
  return tickets;
}

/**
 * The reservation held now (`inner()`: late binding can move it), with the
 * admitters' tickets given back at its first token or its end, whichever comes
 * first. `ending` runs at finish before anything is given back (admitWith ends
 * its wait and timer there); `ended` after.
 */
function releasing(inner: () => Reservation, tickets: Ticket[], ending = nothing, ended = nothing): Reservation {
  const leave = () => {
    for (const t of tickets) t.leave();
  };
  return {
    get open() {
      return inner().open;
    },
    guards: () => inner().guards(),
    dispatched: () => inner().dispatched(),
    // The pick's own hooks before the tickets are given back: leaving can
    // send the next waiting request at once, and speed learning times it
    // against the prefill still in the engine, which must no longer count
    // this one (its prefill is done, or it is gone).
    firstToken() {
      inner().firstToken();
      leave();
    },
    chunk: () => inner().chunk(),
    finish() {
      ending();
      inner().finish();
      leave();
      ended();
    },
  };
}

/** Late binding: the reservation a moved pick holds now (its original one was finished at the move). */
const movedTo = new WeakMap<Pick, Reservation>();

export class Director {
  constructor(private readonly d: DirectorDeps) {}

  /** Route -> shed -> admit -> fallbacks. Never throws for a request's own fault: a refusal says why. */
  async decide(inp: RouteInput): Promise<Decision> {
    return this.decideNow(inp);
  }

  /**
   * decide(), answered on the caller's turn when nothing has to wait: a
   * prompt tokenized inline and admitted at once holding nothing (a warm
   * request, or admission off) gets its decision back directly, with no
   * promise, closure or timer made for it; a prompt on a tokenizer thread, or
   * one that takes an admission slot or queues, gets a promise. The steps and
   * their order are the same either way.
   */
  decideNow(inp: RouteInput): Decision | Promise<Decision> {
    const { opts } = this.d;
    const headers = inp.headers;
    const subset = inp.subset;
    let allow: ((w: Worker) => boolean) | undefined;
    if (subset) {
      const set: Record<string, true> = Object.fromEntries(subset.map((a) => [a, true as const]));
      allow = (w) => set[w.address] === true;
    }
    // Read before the pick: a TTFT SLO (x-slo-ttft-ms, trusted) is one of the pick's inputs (slo-ttft scorer).
    const objective = objectiveOf((n) => headers[n], opts.objectives.table, opts.objectives.trust);
    let pick: Pick | Promise<Pick>;
    try {
      if (subset && !subset.length)
        throw httpError(503, "the gateway's endpoint subset is empty", "service_unavailable");
      if (inp.endpoint) {
        const session = sessionFromHeaders((n) => headers[n], opts.sessionHeader, opts.sessionHeaders);
        // A sheddable request that would be refused whatever the pick is refused before its prompt is tokenized.
        if (objective.priority < 0 && this.d.shedsCold?.(inp.endpoint, inp.body, session, objective.flow, allow))
          return this.refuseShed(sheddableRefusal(objective.priority));
        pick = this.d.routeNow
          ? this.d.routeNow(inp.endpoint, inp.body, session, allow, objective.sloTtftMs)
          : this.d.routeAsync(inp.endpoint, inp.body, session, allow, objective.sloTtftMs);
      } else {
        // An allowed path that is not a prompt (GET /v1/models, embeddings, --extra-paths): any worker can answer; route by load alone.
        pick = this.d.router.pick(NO_FEATURES, null, allow);
      }
    } catch (e) {
      return this.routeFailed(e, subset);
    }
    if (pick instanceof Promise)
      return pick.then(
        (p) => this.afterPick(inp, p, objective),
        (e) => this.routeFailed(e, subset),
      );
    return this.afterPick(inp, pick, objective);
  }

  /** Routing threw (a bad request, no worker, a full tokenizer queue): the refusal to answer. */
  private routeFailed(e: unknown, subset: string[] | null): Refused {
    const err = asHttpError(e);
    this.d.metrics.badRequests.inc({ status: String(err.status) });
    if (err.status >= 500)
      this.d.log(
        "warn",
        `routing failed: ${err.message}${subset ? ` (gateway subset: ${subset.join(",") || "empty"})` : ""}`,
      );
    return refuse(
      err.status,
      err.message,
      err.type,
      outcomeOf(err as { status: number; outcome?: string }),
      {},
      err.param,
    );
  }

  /** Shed -> admit -> fallbacks, once the pick is made. */
  private afterPick(inp: RouteInput, pick: Pick, objective: Objective): Decision | Promise<Decision> {
    const { opts } = this.d;
    const headers = inp.headers;
    // The target's pool, cheapest first: the pick, then the fallbacks a retrying gateway walks.
    const pool = (pick.decodeCandidates ?? pick.candidates)
      .slice()
      .sort((a, b) => a.cost - b.cost || a.active - b.active);
    const ctx: AdmissionContext = {
      worker: (pick.prefill ?? pick.target).id,
      uncachedTokens: pick.uncachedTokens,
      pool,
      objective,
      header: (n) => headers[n],
      settings: { eppShedActiveBlocks: opts.eppShedActiveBlocks, eppSheddableObjectives: opts.eppSheddableObjectives },
      queue: this.d.admission,
      bytes: inp.body.length,
      // Set below, when the request enters admission (only a waiting request moves).
      move: undefined,
    };
    const shed = this.shed(pick, ctx);
    if (shed) return shed;
    const end = inp.end;
    if (end?.ended) return this.clientGone(pick);
    // Every admitter lets it go at once holding nothing (a warm prompt, or
    // admission off): what admitWith does then, without its clock or wrapper.
    if (passesAll(ctx)) {
      pick.reservation.dispatched();
      return this.routed(inp, pick, pool);
    }
    // Admitted at once holding a slot (a cold prompt, its worker free): the
    // slot goes back with the reservation; no clock, no promise.
    const held = enterAtOnce(ctx);
    if (held) {
      pick.reservation.dispatched();
      const r = pick.reservation;
      pick.reservation = releasing(() => r, held);
      return this.routed(inp, pick, pool);
    }
    ctx.move = this.mover(pick);
    return this.admitThenRoute(inp, pick, ctx, pool);
  }

  /** Admission that may take a slot or wait: the pick goes once admitted, or is refused. */
  private admitThenRoute(
    inp: RouteInput,
    pick: Pick,
    ctx: AdmissionContext,
    pool: { id: string }[],
  ): Decision | Promise<Decision> {
    const end = inp.end;
    // Prefill admission: a cold prompt waits here while another cold one is
    // prefilling on its worker. A stream that ends meanwhile finishes it.
    if (end) end.onEnd = () => pick.reservation.finish();
    let a: Refused | null | Promise<Refused | null>;
    try {
      a = this.admitWith(pick, ctx);
    } catch (e) {
      if (end) end.onEnd = null;
      throw e;
    }
    // Admitted (or refused) at once: nothing waited, so the stream cannot have ended meanwhile.
    if (!(a instanceof Promise)) {
      if (end) end.onEnd = null;
      return this.admitted(inp, pick, pool, a);
    }
    return a.then(
      (r) => {
        if (end) end.onEnd = null;
        return this.admitted(inp, pick, pool, r);
      },
      (e) => {
        if (end) end.onEnd = null;
        throw e;
      },
    );
  }

  /** After admission: 499 if the stream ended while it waited, the refusal if flow control refused it, else routed. */
  private admitted(inp: RouteInput, pick: Pick, pool: { id: string }[], refused: Refused | null): Decision {
    if (inp.end?.ended) return this.clientGone(pick);
    // Flow control refused it while it waited (queue full, a higher band took its place, its TTL ran out).
    if (refused) {
      pick.reservation.finish();
      this.d.metrics.badRequests.inc({ status: String(refused.status) });
      return refused;
    }
    return this.routed(inp, pick, pool);
  }

  /**
   * The gateway reports it served the request from another endpoint (it fell
   * back down the list, or past it): the load moves to where the request went,
   * when that is a known worker. Returns the guard now held there (the caller
   * releases it at the end), or null.
   */
  served(d: Routed, address: string): Guard | null {
    const picked = d.pick.target;
    if (address === picked.address) return null;
    const w = this.d.router.workers().find((x) => x.address === address);
    const g = d.reservation.guards().main;
    const again = w && !g.done ? this.d.router.holdOn(w.id, g) : null;
    if (again) {
      this.d.router.releaseGuard(g);
      g.done = true;
    }
    this.d.metrics.eppFallbacks.inc({ known: String(!!again) });
    this.d.log(
      "info",
      `gateway served from ${address} instead of ${picked.address}${again ? `: load moved to ${w!.id}` : " (not a known worker)"}`,
    );
    return again;
  }

  /** Runs the shedders in order; the first refusal gives the pick's load back and answers. */
  private shed(pick: Pick, ctx: AdmissionContext): Refused | null {
    const list = shedders();
    for (let i = 0; i < list.length; i++) {
      const r = list[i].shed(ctx);
      if (!r) continue;
      pick.reservation.finish();
      return this.refuseShed(r);
    }
    return null;
  }

  /** A shedder's refusal: counted, logged, answered. */
  private refuseShed(r: ShedRefusal): Refused {
    this.d.metrics.badRequests.inc({ status: String(r.status) });
    if (r.shedPriority !== undefined) {
      this.d.metrics.shed.inc({ priority: String(r.shedPriority) });
      this.d.flow.refused.inc({ priority: String(r.shedPriority), reason: "saturated" });
    }
    if (r.log) this.d.log("info", r.log);
    return refuse(r.status, r.message, r.type, outcomeOf(r), r.headers ?? {});
  }

  /** Nobody is left to answer: the load the pick holds goes back now. */
  private clientGone(pick: Pick): Refused {
    pick.reservation.finish();
    return refuse(499, "client went away while the request was being routed", "client_closed", "client_closed");
  }

  /**
   * Resolves when the pick may be sent (null: every admitter let it go) or
   * with the refusal to answer instead (queue full, evicted by a higher band,
   * expired): see admitWith.
   */
  async admit(pick: Pick, objective?: Objective, bytes?: number): Promise<Refused | null> {
    const pool = pick.decodeCandidates ?? pick.candidates;
    return this.admitWith(pick, {
      worker: (pick.prefill ?? pick.target).id,
      uncachedTokens: pick.uncachedTokens,
      pool,
      objective: objective ?? { name: "", priority: 0, flow: "" },
      header: () => undefined,
      settings: {
        eppShedActiveBlocks: this.d.opts.eppShedActiveBlocks,
        eppSheddableObjectives: this.d.opts.eppSheddableObjectives,
      },
      queue: this.d.admission,
      bytes: bytes ?? 0,
      move: this.mover(pick),
    });
  }

  /**
   * Late binding (--queue-late-binding): a waiting pick that no worker holds
   * any of (a cold prompt costs the same anywhere), and that is one worker's
   * request (not a prefill/decode pair), may go to whichever worker frees a
   * slot first: its pick is made again there and its load moves with it.
   */
  private mover(pick: Pick): ((worker: string) => boolean) | undefined {
    const repick = repickers.get(pick);
    if (!repick || pick.prefill || pick.decodeCandidates || !pick.candidates.every((c) => c.hits === 0)) return;
    const original = pick.reservation;
    return (id) => {
      let next: Pick;
      try {
        next = repick(id);
      } catch {
        return false;
      }
      if ((next.prefill ?? next.target).id !== id) {
        next.reservation.finish();
        return false;
      }
      // Its load moves: the reservation held so far is finished, the new one held.
      const old = movedTo.get(pick) ?? original;
      movedTo.set(pick, next.reservation);
      old.finish();
      pick.target = next.target;
      pick.candidates = next.candidates;
      pick.uncachedTokens = next.uncachedTokens;
      pick.mmImages = next.mmImages;
      pick.mmAffinityHits = next.mmAffinityHits;
      return true;
    };
  }

  /**
   * Flow control's clock around the admitters (core/admission.ts holds the
   * queues): resolves when the pick may be sent, or with a refusal; the rules
   * (bounds, eviction, TTL and SLO expiry, cancellation) are in runtime/flow.ts's
   * header. The pick's reservation is wrapped so whatever the admitters hold is
   * given back at the first token or at the end, whichever comes first.
   */
  private admitWith(pick: Pick, ctx: AdmissionContext): Refused | null | Promise<Refused | null> {
    const { metrics, flow } = this.d;
    const list = admitters();
    const band = String(ctx.objective.priority);
    const t0 = performance.now();
    const waited = () => performance.now() - t0;
    const tickets: Ticket[] = [];
    let timer: NodeJS.Timeout | null = null;
    let admitted = false;
    let queued = false;
    let forced = false;
    let over = false;
    // The outcome, the first time it is known; a promise is made only for a
    // request still waiting when this returns (one settled at once is returned as is).
    let settled = false;
    let outcome: Refused | null = null;
    let wake: ((r: Refused | null) => void) | null = null;
    const resolve = (r: Refused | null) => {
      if (settled) return;
      settled = true;
      outcome = r;
      if (wake) wake(r);
    };
    const ready = () => (settled ? outcome : new Promise<Refused | null>((r) => (wake = r)));
    // The wait ended (once): its time and how it ended, per band.
    const ended = (outcome: string) => {
      if (over) return;
      over = true;
      if (timer) {
        clearTimeout(timer);
        timer = null;
      }
      if (queued) flow.wait.observe({ priority: band, outcome }, waited() / 1000);
    };
    const refused = (reason: Exclude<FlowRefusalReason, "">) => {
      if (reason === "expired") flow.expired.inc({ priority: band });
      else {
        flow.refused.inc({ priority: band, reason });
        metrics.shed.inc({ priority: band });
      }
      const r = refusalOf(reason, waited()) as FlowRefusal;
      resolve(refuse(r.status, r.message, r.type, outcomeOf(r), r.headers));
    };
    // Each admitter in turn, the next once the one before lets the request go.
    const from = (i: number): void => {
      if (i < list.length) {
        const t = list[i].enter(
          ctx,
          () => from(i + 1),
          () => {
            ended("evicted");
            refused("evicted");
          },
        );
        tickets.push(t);
        return;
      }
      admitted = true;
      // Its worker's first token is timed from here, not from the pick, on
      // the reservation held now: late binding can move a newcomer to a free
      // slot inside enter() (flow reserve), before pick.reservation is wrapped
      // below, and the one it held until then is finished.
      (movedTo.get(pick) ?? pick.reservation).dispatched();
      if (queued) {
        metrics.admissionWait.observe(waited() / 1000);
        ended(forced ? "forced" : "dispatched");
      }
      resolve(null);
    };
    from(0);
    const last = tickets[tickets.length - 1];
    if (last && last.refused) {
      refused(last.refused);
      return ready();
    }
    // Went at once, holding nothing: no slot to give back, nothing to wrap.
    if (admitted && !tickets.some((t) => t.slot)) return ready();
    if (!admitted) {
      queued = true;
      // A protected band (priority above 0) never expires: it goes at the wait bound like any request without a TTL.
      let expireMs = protectedBand(ctx.objective.priority) ? 0 : this.d.opts.flow.ttlMs;
      if (expireMs > 0 && ctx.objective.sloTtftMs) expireMs = Math.min(expireMs, ctx.objective.sloTtftMs);
      if (expireMs > 0)
        timer = setTimeout(() => {
          timer = null;
          if (!tickets[tickets.length - 1].expire()) return;
          ended("expired");
          refused("expired");
        }, expireMs);
      else
        timer = setTimeout(() => {
          timer = null;
          metrics.admissionForced.inc();
          this.d.log("info", "prefill admission: waited past the limit; sent", {
            worker: ctx.worker,
            max_wait_ms: this.d.opts.admission.maxWaitMs,
          });
          forced = true;
          // Past the bound: every admitter still holding it lets it go (forcing one may reach the next).
          for (let n = 0; !admitted && n <= list.length; n++) tickets[tickets.length - 1].force();
        }, this.d.opts.admission.maxWaitMs);
      timer.unref();
    }
    const outer = pick.reservation;
    // Late binding moved the pick: the reservation held now is the new one's.
    const inner = () => movedTo.get(pick) ?? outer;
    pick.reservation = releasing(
      inner,
      tickets,
      () => {
        if (!admitted && !over) ended("cancelled");
        if (timer) clearTimeout(timer);
      },
      () => resolve(null),
    );
    return ready();
  }

  /** The routed decision: the fallback list, and the headers and body that name the pick. */
  private routed(inp: RouteInput, pick: Pick, pool: { id: string }[]): Routed {
    const opts = this.d.opts;
    const fallbacks: string[] = [];
    for (const c of pool) {
      if (fallbacks.length >= opts.eppFallbackCount) break;
      const w = c.id === pick.target.id ? null : this.d.router.worker(c.id);
      if (w && !fallbacks.includes(w.address) && w.address !== pick.target.address) fallbacks.push(w.address);
    }
    const destination = [pick.target.address, ...fallbacks].join(",");
    // The gateway connects to the metadata value; the header carries the same
    // value (the protocol forbids the two differing) for header-driven gateways.
    const headers: Record<string, string> = {
      [opts.upstreamHeader]: pick.target.address,
      "x-infera-worker": pick.target.id,
      [DEST_KEY]: destination,
    };
    if (pick.prefill) {
      headers[opts.prefillHeader] = pick.prefill.address;
      headers[LLMD_PREFILL_HEADER] = pick.prefill.address;
      // A prefill engine with DP ranks: its address alone does not name the rank the pick scored.
      if (pick.prefill.dpRank !== undefined)
        headers[prefillRankHeader(opts.prefillHeader)] = String(pick.prefill.dpRank);
    }
    // --kv-source-hint: the busy cache holder the picked worker can pull the prompt's KV from.
    if (pick.kvSource) headers[KV_SOURCE_HEADER] = pick.kvSource.address;
    // A data-parallel rank target: vLLM (and SGLang's OpenAI routes) pin the request to that rank by this header.
    if (pick.target.dpRank !== undefined) headers[DP_RANK_HEADER] = String(pick.target.dpRank);
    // --send-token-ids exact: the prompt's ids instead of its text, to a worker that renders as we do.
    let src = inp.body;
    let chatFromCompletions = false;
    if (pick.promptIds && opts.sendTokenIds === "exact") {
      const plan = this.tokenIds(inp, pick, pick.promptIds);
      if (plan) {
        src = plan.body;
        chatFromCompletions = plan.chat;
        if (plan.path) headers[":path"] = plan.path;
      }
    }
    // SGLang reads the ranks from the body: appended as its last members, the rest byte for byte.
    const fields = dpBodyFields(inp.endpoint, pick.target, pick.prefill);
    const rewritten = fields ? withBodyFields(src.toString("utf8"), fields) : null;
    let body: Buffer | null = src === inp.body ? null : src;
    if (rewritten !== null) body = Buffer.from(rewritten, "utf8");
    if (body) headers["content-length"] = String(body.length);
    return {
      kind: "route",
      pick,
      reservation: pick.reservation,
      destination,
      stream: !!pick.stream,
      headers,
      // (A client's x-infera-kv-source is already gone: the processor strips it with the headers.)
      remove: [opts.prefillHeader, prefillRankHeader(opts.prefillHeader), LLMD_PREFILL_HEADER, "x-prefiller-url"],
      body,
      chatFromCompletions,
      outcome: "routed",
    };
  }

  /**
   * The request as ids for its worker, or null (text): only to a worker whose
   * render parity is exact, and only a request the completions endpoint can
   * answer the way the client asked (runtime/token-ids.ts). Not under P/D:
   * the prefill hop is made from the same body by the decode side. Counted
   * per outcome.
   */
  private tokenIds(
    inp: RouteInput,
    pick: Pick,
    ids: ArrayLike<number>,
  ): { body: Buffer; path: string | null; chat: boolean } | null {
    const count = this.d.metrics.tokenIds;
    if (pick.prefill) {
      count.inc({ outcome: "text_ineligible" });
      return null;
    }
    // A data-parallel rank target is probed as its engine (one render for every rank).
    const engine = engineIdOf(pick.target.id);
    if ((this.d.parity ? this.d.parity(engine) : null) !== "exact") {
      count.inc({ outcome: "text_not_exact" });
      return null;
    }
    const plan = tokenIdRequest(inp.endpoint, inp.body, ids);
    if ("text" in plan) {
      count.inc({ outcome: "text_ineligible" });
      if (this.d.opts.logLevel === "debug")
        this.d.log("debug", "token ids: sent as text", { worker: pick.target.id, reason: plan.text });
      return null;
    }
    count.inc({ outcome: "ids" });
    return plan;
  }
}
