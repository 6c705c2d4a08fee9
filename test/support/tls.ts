/**
 * A throwaway certificate authority and a server certificate it signed for 127.0.0.1 and
 * localhost (openssl, two days), for tests of TLS on loopback.
 */
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

export interface TestCertificates {
  /** The CA's certificate (what a client trusts). */
  readonly ca: string;
  /** The server's certificate and key. */
  readonly cert: string;
  readonly key: string;
}

/** Writes ca.pem, server.pem and server-key.pem into `dir`. */
export function makeTestCertificates(dir: string): TestCertificates {
  const openssl = (...args: string[]) =>
    execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
  openssl(
    ...["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"],
    ...["-keyout", "ca-key.pem", "-out", "ca.pem", "-subj", "/CN=kvedge-test-ca"],
  );
  openssl(
    ...["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server-key.pem"],
    ...["-out", "server.csr", "-subj", "/CN=localhost"],
  );
  writeFileSync(join(dir, "san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  openssl(
    ...["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem"],
    ...["-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext"],
  );
  return {
    ca: join(dir, "ca.pem"),
    cert: join(dir, "server.pem"),
    key: join(dir, "server-key.pem"),
  };
}
