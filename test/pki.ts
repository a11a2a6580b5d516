// A throwaway CA with a server and a client certificate for 127.0.0.1, made
// with openssl, for tests of TLS and mTLS endpoints.
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

export function makePki(): Pki {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-tls-"));
  const o = (...a: string[]) => execFileSync("openssl", a, { cwd: dir, stdio: "pipe" });
  o("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=infera-test-ca");
  fs.writeFileSync(path.join(dir, "san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n");
  for (const who of ["server", "client"]) {
    o("req", "-newkey", "rsa:2048", "-nodes", "-keyout", `${who}.key`, "-out", `${who}.csr`, "-subj", `/CN=${who}`);
    o("x509", "-req", "-in", `${who}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", `${who}.pem`, "-days", "1", "-extfile", "san.ext");
  }
  const p = (f: string) => path.join(dir, f);
  return { dir, ca: p("ca.pem"), cert: p("server.pem"), key: p("server.key"), clientCert: p("client.pem"), clientKey: p("client.key") };
}
