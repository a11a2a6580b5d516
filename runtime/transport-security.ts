// TLS and credentials for the router's own clients (etcd, NATS). One process
// talks to one etcd cluster and one NATS, so the flags configure this module
// once at start-up and every client built afterwards uses it.
import * as fs from "fs";
import { CliError } from "./args";

type Values = Record<string, unknown>;

interface Files {
  ca: string | null;
  cert: string | null;
  key: string | null;
}

export interface EtcdSecurity extends Files {
  username: string | null;
  password: string | null;
}

export interface NatsSecurity extends Files {
  token: string | null;
  user: string | null;
  password: string | null;
}

let etcd: EtcdSecurity = { ca: null, cert: null, key: null, username: null, password: null };
let nats: NatsSecurity = { ca: null, cert: null, key: null, token: null, user: null, password: null };

function read(flag: string, file: unknown): string | null {
  if (typeof file !== "string" || !file) return null;
  try {
    return fs.readFileSync(file, "utf8").replace(/\r?\n$/, "");
  } catch (e) {
    throw new CliError(`${flag}: cannot read '${file}': ${(e as Error).message}`);
  }
}

function files(prefix: string, v: Values): Files {
  const f = (k: string) =>
    typeof v[`${prefix}-${k}-file`] === "string" && v[`${prefix}-${k}-file`]
      ? (v[`${prefix}-${k}-file`] as string)
      : null;
  const out = { ca: f("ca"), cert: f("cert"), key: f("key") };
  if (!!out.cert !== !!out.key) throw new CliError(`--${prefix}-cert-file and --${prefix}-key-file go together`);
  for (const k of ["ca", "cert", "key"] as const) if (out[k]) read(`--${prefix}-${k}-file`, out[k]);
  return out;
}

/** Reads the --etcd-* and --nats-* security flags (those the command has). */
export function configureTransportSecurity(v: Values): void {
  etcd = {
    ...files("etcd", v),
    username: (v["etcd-username"] as string) || null,
    password: read("--etcd-password-file", v["etcd-password-file"]),
  };
  if (!!etcd.username !== !!etcd.password) throw new CliError("--etcd-username and --etcd-password-file go together");
  nats = {
    ...files("nats", v),
    token: read("--nats-token-file", v["nats-token-file"]),
    user: (v["nats-user"] as string) || null,
    password: read("--nats-password-file", v["nats-password-file"]),
  };
  if (!!nats.user !== !!nats.password) throw new CliError("--nats-user and --nats-password-file go together");
}

/** Options for `new Etcd3(...)` beyond hosts: TLS (https endpoints) and user/password auth. */
export function etcdClientOptions(): {
  credentials?: { rootCertificate: Buffer; certChain?: Buffer; privateKey?: Buffer };
  auth?: { username: string; password: string };
} {
  const o: ReturnType<typeof etcdClientOptions> = {};
  if (etcd.ca)
    o.credentials = {
      rootCertificate: fs.readFileSync(etcd.ca),
      ...(etcd.cert && etcd.key
        ? { certChain: fs.readFileSync(etcd.cert), privateKey: fs.readFileSync(etcd.key) }
        : {}),
    };
  if (etcd.username && etcd.password) o.auth = { username: etcd.username, password: etcd.password };
  return o;
}

/** Options for nats `connect(...)`: TLS files, and a token or user/password. */
export function natsClientOptions(): {
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
  token?: string;
  user?: string;
  pass?: string;
} {
  const o: ReturnType<typeof natsClientOptions> = {};
  if (nats.ca || nats.cert)
    o.tls = {
      ...(nats.ca ? { caFile: nats.ca } : {}),
      ...(nats.cert && nats.key ? { certFile: nats.cert, keyFile: nats.key } : {}),
    };
  if (nats.token) o.token = nats.token;
  if (nats.user && nats.password) {
    o.user = nats.user;
    o.pass = nats.password;
  }
  return o;
}
