// Session affinity: a session's earlier target wins while it is still in the
// pool; otherwise the profile's picker decides (and the binding moves).
import { PickContext, Row } from "./framework";

export function boundRow(ctx: PickContext, rows: Row[]): number {
  const s = ctx.session;
  if (!s) return -1;
  const ek = ctx.profile === "prefill" ? s.prefill : ctx.config.sessionAffinity === "both" ? s.decode : undefined;
  if (!ek) return -1;
  for (let i = 0; i < rows.length; i++) if (rows[i].worker.epochKey === ek) return i;
  return -1;
}
