// Per-request bounds that protect shared state. A session id is stored in the
// session table (and in nginx's string zone): an unbounded one lets a single
// client grow router memory or fill the zone.
import { httpError } from "./util";
import { utf8 } from "./util";

export const DEFAULT_MAX_SESSION_ID_BYTES = 256;

/** Throws a 400 when the session id is longer than max bytes (UTF-8). */
export function checkSessionId(id: string | null, max: number): void {
  if (id === null) return;
  // Cheap bound first: a JS string of n units is at most 3n UTF-8 bytes.
  if (id.length * 3 <= max) return;
  const n = id.length > max ? id.length : utf8(id).length;
  if (n > max)
    throw httpError(
      400,
      "session id is " + n + " bytes, over the " + max + "-byte limit (--max-session-id-bytes)",
      "invalid_request_error",
    );
}
