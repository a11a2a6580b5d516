// Routing a request: parse, render, tokenize (on a thread when long), hash,
// pick; then the director (runtime/director.ts) sheds, admits and names the
// fallbacks. Holds prefill admission's queues and the recent prompts' hashes.
import { Pick, Router, Worker } from "../core/router";
import { RouterState } from "../core/state/types";
import { checkSessionId } from "../core/limits";
import { sessionTag } from "../core/session-headers";
import { httpError } from "../core/util";
import {
  computeFeatures,
  Endpoint,
  featuresOf,
  mediaSalt,
  parseRequest,
  ParsedRequest,
  promptTokenIds,
} from "../core/request";
import { Features } from "../core/types";
import { admitsAtOnce, prefillAdmission, PrefillAdmission } from "../core/admission";
import { requestRoot } from "../core/kvevents";
import { prefixHashes } from "./prefix-hashes";
import { nativeHasher } from "./hasher";
import { JobOutcome, TokenizerPool } from "./tokenpool";
import { LoadedTokenizer } from "./tokenizer";
import { Gauge } from "prom-client";
import { Metrics, spec } from "./metrics";
import { Options } from "./config";
import { Logger } from "./log";
import { Tokenizers } from "./tokenizers";
import { Director, DirectorDeps } from "./director";
import { flowMetrics, FlowMetrics, repickers } from "./flow";
import { ParityStatus } from "./probe";

/** A request shedsCold() parsed and did not refuse: its body, as parsed, and its prompt as rendered (undefined: not rendered). */
interface Declined {
  endpoint: Endpoint;
  body: Buffer;
  sessionHeader: string | null;
  req: ParsedRequest;
  text: string | undefined;
}

/** What routing reads of the fleet: discovery's first view, and whether a worker renders unlike us. */
export interface FleetView {
  readonly synced: boolean;
  readonly probes: { anyDiverged(): boolean; state(id: string): { status: ParityStatus } } | null;
}

export class Routing implements DirectorDeps {
  /** Cold prefills in flight per worker (core/admission.ts); kv-aware only: other policies do not know what is cold. */
  readonly admission: PrefillAdmission;
  /** Flow control's counters per band (runtime/flow.ts). */
  readonly flow: FlowMetrics;
  /** Route -> shed -> admit -> fallbacks for each request. */
  readonly director: Director;
  /** Block hashes of recent prompts, so a conversation's next turn hashes only its new blocks. */
  private hashes = prefixHashes(nativeHasher);
  /**
   * The request shedsCold() parsed (and rendered) and then let through: the
   * director routes it on the same turn, and routeNow() takes it from here
   * instead of parsing and rendering the same body again. One entry, taken
   * (or dropped) by the next routeNow().
   */
  private declined: Declined | null = null;

  constructor(
    readonly opts: Options,
    readonly log: Logger,
    readonly metrics: Metrics,
    readonly router: Router,
    private readonly state: RouterState,
    private readonly tok: Tokenizers,
    private readonly fleet: FleetView,
  ) {
    this.admission = prefillAdmission({
      slots: opts.router.policy === "kv-aware" ? opts.admission.slots : 0,
      warmTokens: opts.admission.warmTokens,
      ...opts.flow,
      // The flow reserve's fleet: the workers that prefill (admission's keys).
      workers: () => this.router.workers().flatMap((w) => (w.role === "decode" ? [] : [w.id])),
    });
    const admission = this.admission;
    this.flow = flowMetrics(metrics.registry, admission);
    new Gauge({
      ...spec("infera_router_admission_waiting"),
      registers: [metrics.registry],
      collect() {
        this.reset();
        const w = admission.waitingByPriority();
        for (const p in w) this.set({ priority: p }, w[p]);
      },
    });
    this.director = new Director(this);
  }

  /** The worker's render parity (--send-token-ids); null with the probes off. */
  parity(workerId: string): ParityStatus | null {
    return this.fleet.probes ? this.fleet.probes.state(workerId).status : null;
  }

  private parse(endpoint: Endpoint, body: Buffer, sessionHeader: string | null): ParsedRequest {
    return parseRequest(
      endpoint,
      body.length <= this.opts.maxBodyBytes ? body.toString("utf8") : "",
      body.length,
      {
        maxBodyBytes: this.opts.maxBodyBytes,
        maxMessages: this.opts.maxMessages,
        maxMedia: this.opts.maxImages,
        maxJsonDepth: this.opts.maxJsonDepth,
      },
      sessionHeader,
    );
  }

  /** Features from the estimated token count, no blocks; failure: why tokenizing failed (logged). */
  private estimated(req: ParsedRequest, root: string | null, failure?: Error): Features {
    // A tokenizer failure must not fail the request: fall back to the estimate.
    if (failure) this.log("warn", `tokenize failed (${failure.message}); routing on estimated tokens`);
    return computeFeatures(req, null, this.opts.router.blockSize, nativeHasher, root);
  }

  /** text: the prompt already rendered by the caller (rendering twice costs as much as encoding a short one). */
  private featuresInline(
    req: ParsedRequest,
    root: string | null,
    text?: string,
    keep?: { ids: ArrayLike<number> | null },
  ): Features {
    try {
      const tok = this.tok.tokenizerFor(req.model);
      const ids =
        text !== undefined && tok && !req.promptTokens
          ? req.addSpecialTokens && tok.encodeSpecial
            ? tok.encodeSpecial(text)
            : tok.encode(text)
          : promptTokenIds(req, tok);
      if (!ids) return this.estimated(req, root);
      const ms = mediaSalt(req, nativeHasher, root);
      const f = featuresOf(req, ids.length, this.hashes.hash(ids, this.opts.router.blockSize, ms.salt), ms.mediaHashes);
      if (keep) keep.ids = ids;
      return f;
    } catch (e) {
      return this.estimated(req, root, e as Error);
    }
  }

  /** Parse, tokenize once, pick, all on the caller's turn. Throws httpError(4xx/503) for the caller to render. */
  route(endpoint: Endpoint, body: Buffer, sessionHeader: string | null, allow?: (w: Worker) => boolean): Pick {
    const t0 = process.hrtime.bigint();
    const req = this.parse(endpoint, body, sessionHeader);
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    const keep = this.keepIds(req);
    return this.finishPick(req, this.featuresInline(req, root, undefined, keep), t0, allow, undefined, keep);
  }

  /**
   * --send-token-ids: where the prompt's ids are kept for the director (which
   * may send them instead of the text); null when they are never sent: the
   * flag off, or the client sent ids itself (nothing left to tokenize).
   */
  private keepIds(req: ParsedRequest): { ids: ArrayLike<number> | null } | undefined {
    return this.opts.sendTokenIds !== "off" && !req.promptTokens && !req.media.length ? { ids: null } : undefined;
  }

  /**
   * route(), with a long prompt tokenized and hashed on a tokenizer thread so
   * the event loop keeps serving other picks and KV events meanwhile. A
   * prompt over the time bound or a full queue rejects with 413/503.
   */
  async routeAsync(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
  ): Promise<Pick> {
    return this.routeNow(endpoint, body, sessionHeader, allow, sloTtftMs);
  }

  /**
   * routeAsync() without a promise when none is needed: a prompt tokenized
   * inline is picked on the caller's turn and the Pick returned (an error is
   * thrown); only a prompt that goes to a tokenizer thread returns a promise.
   */
  routeNow(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
  ): Pick | Promise<Pick> {
    const t0 = process.hrtime.bigint();
    // The same body shedsCold() just parsed and let through: its parse (and render) again would be the same.
    const d = this.declined;
    this.declined = null;
    const again = d !== null && d.body === body && d.endpoint === endpoint && d.sessionHeader === sessionHeader;
    const req = again ? d.req : this.parse(endpoint, body, sessionHeader);
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    const tok = req.promptTokens ? null : this.tok.tokenizerFor(req.model);
    const key = tok ? this.tok.keyOf(tok) : undefined;
    let text: string | null = null;
    if (tok && key !== undefined) {
      if (again && d.text !== undefined) text = d.text;
      else
        try {
          text = req.chat ? tok.renderChat(req.chat) : (req.prompt as string);
        } catch (e) {
          text = null; // featuresInline reports it and falls back to the estimate
        }
    }
    const pool = text !== null && text.length > this.opts.tokenize.inlineChars ? this.tok.pool() : null;
    if (!pool || text === null) {
      const keep = this.keepIds(req);
      const feats = this.featuresInline(req, root, text ?? undefined, keep);
      return this.finishPick(req, feats, t0, allow, sloTtftMs, keep);
    }
    return this.onThread(req, root, tok!, key!, text, pool, t0, allow, sloTtftMs);
  }

  /** routeNow()'s long prompt: tokenized and hashed on a tokenizer thread, then picked. */
  private async onThread(
    req: ParsedRequest,
    root: string | null,
    tok: LoadedTokenizer,
    key: string,
    text: string,
    pool: TokenizerPool,
    t0: bigint,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
  ): Promise<Pick> {
    const ms = mediaSalt(req, nativeHasher, root);
    const keep = this.keepIds(req);
    let feats: Features;
    try {
      const job = pool.encode(
        key,
        text,
        !!(req.addSpecialTokens && tok.encodeSpecial),
        this.opts.router.blockSize,
        ms.salt ?? null,
        !!keep,
      );
      this.metrics.tokenizeQueue.set(pool.depth());
      const r = await job;
      this.metrics.tokenizeQueue.set(pool.depth());
      this.metrics.tokenizeJobs.inc({ outcome: "ok" });
      if (keep && r.ids) keep.ids = r.ids;
      feats = featuresOf(req, r.tokens, r.blocks as Features["blocks"], ms.mediaHashes);
    } catch (e) {
      this.metrics.tokenizeQueue.set(pool.depth());
      const status = (e as { status?: number }).status;
      this.metrics.tokenizeJobs.inc({ outcome: (e as { outcome?: JobOutcome }).outcome ?? "error" });
      if (status) throw e;
      feats = this.estimated(req, root, e as Error);
    }
    return this.finishPick(req, feats, t0, allow, sloTtftMs, keep);
  }

  /**
   * Whether a sheddable request can be refused before its prompt is
   * tokenized: true only when the objective shedder would refuse it whatever
   * the pick. That needs (1) every worker it may go to (the gateway's subset,
   * else all; more than the pick's pool, which only makes this stricter) to
   * hold a cold prefill already, so a cold request waits wherever it lands,
   * and (2) the request to be cold everywhere: more than
   * --prefill-admission-warm-tokens of it uncached on every worker, counting
   * hits as the pick does (cache or in flight). Tokenizing only a prefix
   * answers both: a prefix cut at a whitespace tokenizes to the full prompt's
   * leading tokens (the pre-tokenizers split there), so its blocks are the
   * prompt's and its token count a lower bound; when no worker's hits reach
   * the prefix's last block, the whole prompt hits no more than the prefix
   * does. A shared system prompt is fine: its blocks count as hits. Anything
   * unusual (prefill /
   * decode roles, images, a session, an unparsable body, a short prefix)
   * answers false and the request takes the whole path, where the same rule
   * runs after the pick. Why: tokenizing the whole prompt is most of a pick's
   * time, and all of it is wasted on a request that is refused.
   */
  shedsCold(
    endpoint: Endpoint,
    body: Buffer,
    sessionHeader: string | null,
    flow: string,
    allow?: (w: Worker) => boolean,
  ): boolean {
    this.declined = null;
    const adm = this.admission;
    const warm = adm.config.warmTokens;
    if (adm.config.slots <= 0) return false;
    const pool = this.router.workers().filter((w) => !allow || allow(w));
    if (!pool.length) return false;
    for (const w of pool) if (w.role !== "mixed" || !adm.wouldWait(w.id, warm + 1, flow)) return false;
    let req: ParsedRequest;
    try {
      req = this.parse(endpoint, body, sessionHeader);
    } catch {
      return false;
    }
    // Kept for routeNow() unless this refuses it (cleared below when it does).
    const kept: Declined = { endpoint, body, sessionHeader, req, text: undefined };
    this.declined = kept;
    if (req.sessionId || req.media.length) return false;
    const bs = this.opts.router.blockSize;
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    let ids: ArrayLike<number> | null = null;
    if (req.promptTokens) ids = req.promptTokens;
    else {
      const tok = this.tok.tokenizerFor(req.model);
      if (!tok) return false;
      let text: string;
      try {
        text = req.chat ? tok.renderChat(req.chat) : (req.prompt as string);
      } catch {
        return false;
      }
      kept.text = text;
      // A prefix long enough for warm tokens and a margin: first at 2
      // characters a token (code, dense text), then at 6 (prose); a prompt
      // whose prefix still comes out shorter takes the whole path.
      for (const perToken of [2, 6]) {
        const want = perToken * (warm + 3 * bs);
        let cut = text.length;
        if (text.length > want) {
          cut = text.lastIndexOf(" ", want);
          if (cut <= 0) return false;
        }
        const prefix = text.slice(0, cut);
        try {
          ids = req.addSpecialTokens && tok.encodeSpecial ? tok.encodeSpecial(prefix) : tok.encode(prefix);
        } catch {
          return false;
        }
        if (ids.length > warm + 3 * bs || cut === text.length) break;
      }
    }
    if (!ids) return false;
    // The prefix's blocks, less the last two (the tokens nearest the cut are
    // the only ones a tokenizer without pre-splitting could make differently).
    const nb = Math.floor(ids.length / bs) - 2;
    if (nb < 2) return false;
    const blocks = this.hashes.hash(
      Array.prototype.slice.call(ids, 0, nb * bs) as number[],
      bs,
      mediaSalt(req, nativeHasher, root).salt,
    );
    if (blocks.length !== nb) return false;
    const shorter = blocks.slice(0, nb - 1);
    const live: { [ek: string]: boolean } = {};
    const eks = pool.map((w) => w.epochKey);
    for (const ek of eks) live[ek] = true;
    const weights = this.router.config.kvTierWeights;
    const mirror = this.state.mirror;
    const cached = mirror.prefixHits(blocks, live, weights);
    const cachedShort = mirror.prefixHits(shorter, live, weights);
    const inflight = this.state.load.activePrefix(blocks, eks);
    const inflightShort = this.state.load.activePrefix(shorter, eks);
    // Hits as the pick counts them; the last block adding none means the
    // cached prefix ends inside these blocks, so the whole prompt hits no more.
    let most = 0;
    for (const ek of eks) {
      if ((cached[ek] || 0) !== (cachedShort[ek] || 0) || (inflight[ek] || 0) !== (inflightShort[ek] || 0))
        return false;
      most = Math.max(most, cached[ek] || 0, inflight[ek] || 0);
    }
    // Uncached tokens on any worker are at least the prefix's less its hits; a margin of a block over warm.
    const sheds = ids.length - most * bs > warm + bs;
    if (sheds) this.declined = null;
    return sheds;
  }

  /** sloTtftMs: the request's TTFT target (x-slo-ttft-ms, trusted), which the slo-ttft scorer prices. */
  private finishPick(
    req: ParsedRequest,
    feats: Features,
    t0: bigint,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
    keep?: { ids: ArrayLike<number> | null },
  ): Pick {
    const endpoint = req.endpoint;
    if (sloTtftMs) feats = { ...feats, sloTtftMs };
    checkSessionId(req.sessionId, this.opts.maxSessionIdBytes);
    // Before discovery's first view an empty fleet means "not yet", not "none".
    if (!this.fleet.synced && !this.router.workers().length)
      throw httpError(
        503,
        "no workers available: no worker yet (discovery has not delivered the fleet)",
        "service_unavailable",
      );
    // A worker that renders differently counts other tokens than ours: demand is then an estimate.
    if (feats.exact && this.fleet.probes && this.fleet.probes.anyDiverged()) feats = { ...feats, exact: false };
    const pick = this.router.pick(feats, req.sessionId, allow);
    pick.stream = req.stream;
    // Kept only when tokenizing succeeded (a failure routes on an estimate and keeps none).
    if (keep && keep.ids) pick.promptIds = keep.ids;
    // Late binding (--queue-late-binding): the same request picked again on one named worker.
    // Only a request that can wait can move: one admission lets go at once (warm) never needs it.
    if (this.opts.flow.lateBinding && !req.sessionId && !admitsAtOnce(this.admission.config, pick.uncachedTokens))
      repickers.set(pick, (id) => this.router.pick(feats, null, (w) => w.id === id && (!allow || allow(w))));
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    this.metrics.pickLatency.observe(secs);
    // Costs and counts only: prompt text never reaches the logs.
    if (this.opts.logLevel === "debug")
      this.log("debug", "pick", {
        endpoint,
        worker: pick.target.id,
        prefill: pick.prefill?.id ?? null,
        session: req.sessionId ? sessionTag(req.sessionId) : null,
        blocks: feats.blocks.length,
        input_tokens: feats.inputTokens,
        candidates: pick.candidates.map((c) => ({ id: c.id, cost: c.cost, hits: c.hits, active: c.active })),
        decode_candidates:
          pick.decodeCandidates?.map((c) => ({ id: c.id, cost: c.cost, hits: c.hits, active: c.active })) ?? null,
        pick_ms: +(secs * 1000).toFixed(3),
      });
    return pick;
  }
}
