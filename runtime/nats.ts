// KV events over NATS: one subject per worker (its `events` value, e.g.
// infera.kv.w0). Each message is the same msgpack EventBatch vLLM puts on ZMQ,
// with the sequence number in the `Infera-Seq` header. cli/relay.ts moves a
// worker's ZMQ stream onto NATS unchanged.
import { connect, NatsConnection, headers as natsHeaders } from "nats";
import { createSequencer } from "./events";
import { EventSource, Logger } from "./app";
import { natsClientOptions } from "./transport-security";

export const SEQ_HEADER = "Infera-Seq";

/** A worker's subject: its kv_events value when that is a subject, else infera.kv.<id> (the relay's default). */
export function natsSubject(id: string, events: string): string {
  return /^[a-z]+:\/\//.test(events) ? `infera.kv.${id}` : events;
}

export async function natsConnect(url: string, log: Logger, name: string): Promise<NatsConnection> {
  const nc = await connect({
    servers: url,
    name,
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    waitOnFirstConnect: true,
    ...natsClientOptions(),
  });
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect" || s.type === "reconnect")
        log(s.type === "reconnect" ? "info" : "warn", "nats " + s.type, { server: String(s.data) });
    }
  })().catch(() => undefined);
  return nc;
}

/**
 * Batches from NATS go through the same sequencer as ZMQ: with the worker's
 * replay endpoint (the engine's ZMQ ROUTER) a gap is repaired and a late
 * router rebuilds from replay. A NATS reconnect is the relay's link, not the
 * engine's, so it is no restart signal; gaps and sequence resets still are.
 */
export async function natsEventSource(url: string, log: Logger, replayTimeoutMs = 2000): Promise<EventSource> {
  const nc = await natsConnect(url, log, "infera-gate-router");
  // Connection state for readiness: every subscription shares the one connection.
  const watchers = new Set<(up: boolean) => void>();
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") watchers.forEach((f) => f(false));
      if (s.type === "reconnect") watchers.forEach((f) => f(true));
    }
  })().catch(() => undefined);
  return {
    subscribe(w, onBatch, onError, onState) {
      const sub = nc.subscribe(natsSubject(w.id, w.events as string));
      const seqr = createSequencer(
        w.id,
        (_id, seq, evs, info) => onBatch(seq, evs, info),
        (_id, reason) => onError(reason),
        {
          replay: w.replay,
          snapshot: w.snapshot,
          replayTimeoutMs,
          dpRank: w.dpEvents === "tagged" ? w.dpRank : undefined,
          log: (l, line, f) => log(l, line, f),
        },
      );
      if (onState) {
        watchers.add(onState);
        // After subscribe() returns: the caller registers the subscription first.
        queueMicrotask(() => onState(!nc.isClosed()));
      }
      (async () => {
        for await (const m of sub) {
          try {
            const s = m.headers?.get(SEQ_HEADER);
            if (!s || !/^\d+$/.test(s)) throw new Error(`missing or bad ${SEQ_HEADER} header`);
            seqr.frame(Number(s), m.data, { seqText: s });
          } catch (e) {
            onError((e as Error).message);
          }
        }
      })().catch((e) => onError("subscriber stopped: " + (e as Error).message));
      return {
        close: () => {
          seqr.close();
          if (onState) watchers.delete(onState);
          sub.unsubscribe();
        },
      };
    },
    close: async () => {
      await nc.drain().catch(() => undefined);
    },
  };
}

/** Publishes one raw EventBatch payload with its sequence number. */
export function natsPublish(nc: NatsConnection, subject: string, seq: number, payload: Uint8Array): void {
  const h = natsHeaders();
  h.set(SEQ_HEADER, String(seq));
  nc.publish(subject, payload, { headers: h });
}
