// A throwaway CA with a server and a client certificate for 127.0.0.1, made
// with openssl, for tests of TLS and mTLS endpoints. The server certificate
// also names the router's Service (what envoy/inferencepool.yaml verifies);
// issue() adds client certificates with chosen names (gateway identities).
import { execFileSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

export interface Pki {
  dir: string;
  ca: string;
  cert: string;
  key: string;
  clientCert: string;
  clientKey: string;
}

/** The router's Service name as the shipped EPP Envoy config (envoy/inferencepool.yaml) verifies it. */
export const ROUTER_SERVICE_NAME = "infera-gate.infera.svc";
/** The gateway's client-certificate name in the shipped EPP config and manifests (--ext-proc-client-identities). */
export const GATEWAY_IDENTITY = "infera-gateway";

export function makePki(): Pki {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-tls-"));
  const o = (...a: string[]) => execFileSync("openssl", a, { cwd: dir, stdio: "pipe" });
  o(
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    "ca.key",
    "-out",
    "ca.pem",
    "-days",
    "1",
    "-subj",
    "/CN=infera-test-ca",
  );
  fs.writeFileSync(
    path.join(dir, "san.ext"),
    `subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:${ROUTER_SERVICE_NAME}\nextendedKeyUsage=serverAuth,clientAuth\n`,
  );
  for (const who of ["server", "client"]) {
    o("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${who}.key`, "-out", `${who}.csr`, "-subj", `/CN=${who}`);
    o(
      "x509",
      "-req",
      "-in",
      `${who}.csr`,
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-out",
      `${who}.pem`,
      "-days",
      "1",
      "-extfile",
      "san.ext",
    );
  }
  const p = (f: string) => path.join(dir, f);
  return {
    dir,
    ca: p("ca.pem"),
    cert: p("server.pem"),
    key: p("server.key"),
    clientCert: p("client.pem"),
    clientKey: p("client.key"),
  };
}

/**
 * A client certificate from the same CA with subject CN `cn` and the given
 * SAN entries (e.g. ["DNS:infera-gateway", "URI:spiffe://x/y"]; none: no SAN).
 */
export function issue(k: Pki, cn: string, san: string[]): { cert: string; key: string } {
  const o = (...a: string[]) => execFileSync("openssl", a, { cwd: k.dir, stdio: "pipe" });
  const name = cn.replace(/[^a-z0-9-]/gi, "_");
  const ext = path.join(k.dir, `${name}.ext`);
  fs.writeFileSync(ext, `${san.length ? `subjectAltName=${san.join(",")}\n` : ""}extendedKeyUsage=clientAuth\n`);
  o("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${cn}`);
  o(
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    "ca.pem",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    `${name}.pem`,
    "-days",
    "1",
    "-extfile",
    ext,
  );
  return { cert: path.join(k.dir, `${name}.pem`), key: path.join(k.dir, `${name}.key`) };
}

/** The gateway's certificate as the shipped configs name it (SAN DNS and CN = GATEWAY_IDENTITY). */
export function gatewayCert(k: Pki): { cert: string; key: string } {
  return issue(k, GATEWAY_IDENTITY, [`DNS:${GATEWAY_IDENTITY}`]);
}

/** Router flags for ext_proc over mTLS admitting only the gateway identity (the shipped EPP setup). */
export function routerMtlsArgs(k: Pki): string[] {
  return [
    "--ext-proc-tls-cert",
    k.cert,
    "--ext-proc-tls-key",
    k.key,
    "--ext-proc-tls-client-ca",
    k.ca,
    "--ext-proc-client-identities",
    GATEWAY_IDENTITY,
  ];
}
