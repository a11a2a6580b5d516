// The slice of the njs API infera-gate uses (nginx njs >= 0.8 for shared dicts).
interface NjsSharedDict {
  get(key: string): string | number | undefined;
  set(key: string, value: string | number): NjsSharedDict;
  /** Sets key only when absent: false when it exists (njs >= 0.8). */
  add(key: string, value: string | number): boolean;
  delete(key: string): boolean;
  incr(key: string, delta: number, init?: number): number;
  pop(key: string): string | number | undefined;
  has(key: string): boolean;
  keys(maxCount?: number): string[];
  /** njs >= 0.8: zone size in bytes, and what is left. */
  readonly capacity: number;
  freeSpace(): number;
}
interface NjsRequest {
  uri: string;
  method: string;
  requestText?: string;
  requestBuffer?: { length: number };
  headersIn: { [k: string]: string | undefined };
  headersOut: { [k: string]: string | string[] | undefined };
  variables: { [k: string]: string | undefined };
  status: number;
  return(status: number, body?: string): void;
  internalRedirect(uri: string): void;
  error(msg: string): void;
  warn(msg: string): void;
  log(msg: string): void;
  /** js_body_filter: sends data on to the client in place of the chunk the filter got. */
  sendBuffer(data: string | NjsBuffer, options?: { last?: boolean; flush?: boolean }): void;
}
/** The slice of njs's Buffer the body filter uses (js_body_filter ... buffer_type=buffer). */
interface NjsBuffer {
  length: number;
  indexOf(s: string, from?: number): number;
  slice(start: number, end?: number): NjsBuffer;
  toString(encoding?: string): string;
}

declare const ngx: {
  shared?: { [zone: string]: NjsSharedDict };
  version: string;
  log(level: number, msg: string): void;
  INFO: number;
  WARN: number;
  ERR: number;
  /** Async HTTP client (njs >= 0.5.1); bounded by js_fetch_timeout. */
  fetch(
    url: string,
    init: { method?: string; body?: string; headers?: { [k: string]: string } },
  ): NjsThenable<NjsFetchResponse>;
};
/** The slice of a Promise the njs code uses (lib is ES5: no Promise type). */
interface NjsThenable<T> {
  then<U>(ok: (v: T) => U | NjsThenable<U>, fail?: (e: unknown) => U | NjsThenable<U>): NjsThenable<U>;
}
interface NjsFetchResponse {
  status: number;
  text(): NjsThenable<string>;
}
declare const njs: { version: string };
declare const infera_vocab: import("../core/bpe").CompactTokenizer | undefined;
declare const process: { env: { [k: string]: string | undefined } } | undefined;
/** Set by njs/build.ts: the bundle's sources' hash, and the nginx variables the flags are read from (core/flags.ts nginxFlagVars). */
declare const INFERA_BUILD: string;
declare const INFERA_CONFIG_VARS: string[];
