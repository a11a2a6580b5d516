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
import { prefillAdmission, PrefillAdmission } from "../core/admission";
import { requestRoot } from "../core/kvevents";
import { prefixHashes } from "./prefix-hashes";
import { nativeHasher } from "./hasher";
import { JobOutcome } from "./tokenpool";
import { Gauge } from "prom-client";
import { Metrics, spec } from "./metrics";
import { Options } from "./config";
import { Logger } from "./log";
import { Tokenizers } from "./tokenizers";
import { Director, DirectorDeps } from "./director";
import { flowMetrics, FlowMetrics, repickers } from "./flow";

/** What routing reads of the fleet: discovery's first view, and whether a worker renders unlike us. */
export interface FleetView {
  readonly synced: boolean;
  readonly probes: { anyDiverged(): boolean } | null;
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
  private featuresInline(req: ParsedRequest, root: string | null, text?: string): Features {
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
      return featuresOf(req, ids.length, this.hashes.hash(ids, this.opts.router.blockSize, ms.salt), ms.mediaHashes);
    } catch (e) {
      return this.estimated(req, root, e as Error);
    }
  }

  /** Parse, tokenize once, pick, all on the caller's turn. Throws httpError(4xx/503) for the caller to render. */
  route(endpoint: Endpoint, body: Buffer, sessionHeader: string | null, allow?: (w: Worker) => boolean): Pick {
    const t0 = process.hrtime.bigint();
    const req = this.parse(endpoint, body, sessionHeader);
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    return this.finishPick(req, this.featuresInline(req, root), t0, allow);
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
    const t0 = process.hrtime.bigint();
    const req = this.parse(endpoint, body, sessionHeader);
    const root = requestRoot(this.state.mirror, req.model, req.cacheSalt, nativeHasher);
    const tok = req.promptTokens ? null : this.tok.tokenizerFor(req.model);
    const key = tok ? this.tok.keyOf(tok) : undefined;
    let text: string | null = null;
    if (tok && key !== undefined) {
      try {
        text = req.chat ? tok.renderChat(req.chat) : (req.prompt as string);
      } catch (e) {
        text = null; // featuresInline reports it and falls back to the estimate
      }
    }
    const pool = text !== null && text.length > this.opts.tokenize.inlineChars ? this.tok.pool() : null;
    if (!pool || text === null)
      return this.finishPick(req, this.featuresInline(req, root, text ?? undefined), t0, allow, sloTtftMs);
    const ms = mediaSalt(req, nativeHasher, root);
    let feats: Features;
    try {
      const job = pool.encode(
        key!,
        text,
        !!(req.addSpecialTokens && tok!.encodeSpecial),
        this.opts.router.blockSize,
        ms.salt ?? null,
      );
      this.metrics.tokenizeQueue.set(pool.depth());
      const r = await job;
      this.metrics.tokenizeQueue.set(pool.depth());
      this.metrics.tokenizeJobs.inc({ outcome: "ok" });
      feats = featuresOf(req, r.tokens, r.blocks as Features["blocks"], ms.mediaHashes);
    } catch (e) {
      this.metrics.tokenizeQueue.set(pool.depth());
      const status = (e as { status?: number }).status;
      this.metrics.tokenizeJobs.inc({ outcome: (e as { outcome?: JobOutcome }).outcome ?? "error" });
      if (status) throw e;
      feats = this.estimated(req, root, e as Error);
    }
    return this.finishPick(req, feats, t0, allow, sloTtftMs);
  }

  /** sloTtftMs: the request's TTFT target (x-slo-ttft-ms, trusted), which the slo-ttft scorer prices. */
  private finishPick(
    req: ParsedRequest,
    feats: Features,
    t0: bigint,
    allow?: (w: Worker) => boolean,
    sloTtftMs?: number,
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
    // Late binding (--queue-late-binding): the same request picked again on one named worker.
    if (this.opts.flow.lateBinding && !req.sessionId)
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
