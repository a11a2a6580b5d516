// A tiny HTTP/2 client that writes frames by hand, so a test can send shapes a
// well-behaved client library never would (HEADERS without END_STREAM followed
// only by TRAILERS, odd frame orders). Prior-knowledge h2c over 127.0.0.1 only.
import * as net from "net";

const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
const DATA = 0x0,
  HEADERS = 0x1,
  RST_STREAM = 0x3,
  SETTINGS = 0x4,
  PING = 0x6,
  GOAWAY = 0x7,
  WINDOW_UPDATE = 0x8,
  CONTINUATION = 0x9;
const END_STREAM = 0x1,
  END_HEADERS = 0x4,
  ACK = 0x1;

function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream & 0x7fffffff, 5);
  return Buffer.concat([h, payload]);
}

// HPACK integer with an N-bit prefix (RFC 7541 5.1).
function hpackInt(n: number, prefixBits: number, first: number): number[] {
  const max = (1 << prefixBits) - 1;
  if (n < max) return [first | n];
  const out = [first | max];
  n -= max;
  while (n >= 128) {
    out.push((n % 128) + 128);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

/** Literal header fields without indexing, new name, no Huffman: the simplest valid HPACK. */
export function hpack(headers: [string, string][]): Buffer {
  const parts: Buffer[] = [];
  for (const [k, v] of headers) {
    const kb = Buffer.from(k.toLowerCase());
    const vb = Buffer.from(v);
    parts.push(
      Buffer.from([0x00]),
      Buffer.from(hpackInt(kb.length, 7, 0)),
      kb,
      Buffer.from(hpackInt(vb.length, 7, 0)),
      vb,
    );
  }
  return Buffer.concat(parts);
}

export interface RawResponse {
  status: number | null;
  body: string;
  /** RST_STREAM or GOAWAY seen for the stream. */
  reset: boolean;
}

/** Minimal HPACK decoding of a response's :status (static-table indexed or literal). */
function statusOf(block: Buffer): number | null {
  const b = block[0];
  // Indexed representations of the static table's :status entries.
  const idx: Record<number, number> = { 8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500 };
  if (b & 0x80) return idx[b & 0x7f] ?? null;
  // Literal with indexed name 8..14 (:status): read the value string.
  const nameIdx = b & 0x40 ? b & 0x3f : b & 0x0f;
  if (nameIdx >= 8 && nameIdx <= 14) {
    const len = block[1] & 0x7f;
    if (block[1] & 0x80) return null; // Huffman: callers fall back to the body
    return Number(block.subarray(2, 2 + len).toString());
  }
  return null;
}

/**
 * Sends one request on stream 1 as the given frame plan and collects the
 * response until END_STREAM, a reset, or the deadline.
 */
export async function rawH2(
  port: number,
  plan: { headers: [string, string][]; data?: Buffer; trailers?: [string, string][] },
  timeoutMs = 5000,
): Promise<RawResponse> {
  const sock = net.connect(port, "127.0.0.1");
  await new Promise<void>((resolve, reject) => {
    sock.once("connect", resolve);
    sock.once("error", reject);
  });
  const out: RawResponse = { status: null, body: "", reset: false };
  let buf = Buffer.alloc(0);
  const done = new Promise<void>((resolve) => {
    const t = setTimeout(resolve, timeoutMs);
    const finish = () => {
      clearTimeout(t);
      resolve();
    };
    sock.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) break;
        const type = buf[3],
          flags = buf[4],
          sid = buf.readUInt32BE(5) & 0x7fffffff;
        const p = buf.subarray(9, 9 + len);
        buf = buf.subarray(9 + len);
        if (type === SETTINGS && !(flags & ACK)) sock.write(frame(SETTINGS, ACK, 0, Buffer.alloc(0)));
        else if (type === PING && !(flags & ACK)) sock.write(frame(PING, ACK, 0, p));
        else if (type === HEADERS && sid === 1) {
          let block = p;
          if (flags & 0x8) block = block.subarray(1, block.length - block[0]); // PADDED
          if (flags & 0x20) block = block.subarray(5); // PRIORITY
          if (out.status === null) out.status = statusOf(block);
          if (flags & END_STREAM) finish();
        } else if (type === DATA && sid === 1) {
          out.body += p.toString();
          if (len)
            sock.write(Buffer.concat([frame(WINDOW_UPDATE, 0, 0, u32(len)), frame(WINDOW_UPDATE, 0, 1, u32(len))]));
          if (flags & END_STREAM) finish();
        } else if ((type === RST_STREAM && sid === 1) || type === GOAWAY) {
          out.reset = true;
          finish();
        }
        void CONTINUATION;
      }
    });
    sock.on("close", finish);
    sock.on("error", finish);
  });
  sock.write(PREFACE);
  sock.write(frame(SETTINGS, 0, 0, Buffer.alloc(0)));
  const endAfterHeaders = !plan.data && !plan.trailers;
  sock.write(frame(HEADERS, END_HEADERS | (endAfterHeaders ? END_STREAM : 0), 1, hpack(plan.headers)));
  if (plan.data) sock.write(frame(DATA, plan.trailers ? 0 : END_STREAM, 1, plan.data));
  if (plan.trailers) sock.write(frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack(plan.trailers)));
  await done;
  sock.destroy();
  return out;
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}
