// How a picked data-parallel rank reaches the engine, for the ext_proc server
// and njs alike.
//
// vLLM reads the rank from the X-data-parallel-rank request header. SGLang
// reads it from the body: routed_dp_rank (since its 2026-02 rename; the older
// data_parallel_rank stays a deprecated alias and is what SGLang read from
// 2025-06 until then), and under PD disaggregation a decode server learns
// which prefill rank holds the KV from disagg_prefill_dp_rank (else it asks
// its bootstrap server). SGLang's OpenAI chat/completions routes also read
// the header since 2026-03, its native /generate and /v1/messages do not read
// both, so for an SGLang worker we send the header and the body fields.
import { Endpoint } from "./request";
import { Worker } from "./types";

export const DP_RANK_HEADER = "x-data-parallel-rank";

/** The header naming the picked prefill target's rank, beside the prefill address header. */
export function prefillRankHeader(prefillHeader: string): string {
  return prefillHeader + "-dp-rank";
}

/**
 * Body fields carrying the picked ranks to an engine that reads them there
 * (SGLang), or null. Only OpenAI chat/completions bodies get them: SGLang's
 * /v1/messages ignores body rank fields (the header reaches it).
 */
export function dpBodyFields(
  ep: Endpoint | null,
  target: Worker,
  prefill: Worker | null | undefined,
): { [field: string]: number } | null {
  if (target.engine !== "sglang" || (ep !== "chat" && ep !== "completions")) return null;
  const out: { [field: string]: number } = {};
  let any = false;
  if (target.dpRank !== undefined) {
    out.routed_dp_rank = target.dpRank;
    out.data_parallel_rank = target.dpRank;
    any = true;
  }
  if (prefill && prefill.dpRank !== undefined) {
    out.disagg_prefill_dp_rank = prefill.dpRank;
    any = true;
  }
  return any ? out : null;
}

/**
 * The body with the fields added as the last members of its top-level object,
 * every other byte unchanged (re-serialising would turn 1.0 into 1 and change
 * the prompt the engine renders). Last, because Python's json keeps the last
 * of duplicate keys: a client-sent routed_dp_rank cannot override the pick.
 * null when the body is not a JSON object.
 */
export function withBodyFields(body: string, fields: { [field: string]: number }): string | null {
  let end = body.length - 1;
  while (
    end >= 0 &&
    (body.charAt(end) === " " || body.charAt(end) === "\n" || body.charAt(end) === "\r" || body.charAt(end) === "\t")
  )
    end--;
  let start = 0;
  while (
    start < end &&
    (body.charAt(start) === " " ||
      body.charAt(start) === "\n" ||
      body.charAt(start) === "\r" ||
      body.charAt(start) === "\t" ||
      body.charAt(start) === "\ufeff")
  )
    start++;
  if (end <= start || body.charAt(start) !== "{" || body.charAt(end) !== "}") return null;
  let inner = end - 1;
  while (
    inner > start &&
    (body.charAt(inner) === " " ||
      body.charAt(inner) === "\n" ||
      body.charAt(inner) === "\r" ||
      body.charAt(inner) === "\t")
  )
    inner--;
  const empty = inner === start;
  let add = "";
  const names = Object.keys(fields);
  for (let i = 0; i < names.length; i++)
    add += (empty && i === 0 ? "" : ",") + JSON.stringify(names[i]) + ":" + String(fields[names[i]]);
  return body.substring(0, end) + add + body.substring(end);
}
