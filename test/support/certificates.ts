// Certificates made with the openssl CLI for one test run: a CA, server certificates for
// the names a test dials, client certificates for mutual TLS.
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { requireTool } from "../../harness/system-tools.js";

/** PEM files of one certificate. */
export interface CertFiles {
  readonly cert: string;
  readonly key: string;
}

/** A CA and the files it signed, all under `dir`. */
export interface TestCa extends CertFiles {
  readonly dir: string;
  /** A server certificate for `names` (DNS names or IP addresses). */
  server(name: string, names?: readonly string[]): CertFiles;
  /** A client certificate (extendedKeyUsage clientAuth) with this common name. */
  client(name: string): CertFiles;
  /** A certificate with this common name and these openssl extension lines (e.g. subjectAltName=URI:…). */
  sign(name: string, extensions: string): CertFiles;
}

function openssl(args: readonly string[]): void {
  execFileSync(requireTool("openssl"), args, { stdio: ["ignore", "ignore", "pipe"] });
}

/** Makes a CA named `name` in `dir` (EC P-256, valid for a day). */
export function makeCa(dir: string, name: string): TestCa {
  const cert = join(dir, `${name}.crt`);
  const key = join(dir, `${name}.key`);
  openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", `/CN=${name}`,
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", key, "-out", cert]);
  const sign = (leaf: string, extensions: string): CertFiles => {
    const leafKey = join(dir, `${leaf}.key`);
    const csr = join(dir, `${leaf}.csr`);
    const leafCert = join(dir, `${leaf}.crt`);
    const ext = join(dir, `${leaf}.ext`);
    writeFileSync(ext, extensions);
    openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", `/CN=${leaf}`, "-keyout", leafKey, "-out", csr]);
    openssl(["x509", "-req", "-in", csr, "-CA", cert, "-CAkey", key, "-CAcreateserial", "-days", "1", "-extfile", ext, "-out", leafCert]);
    return { cert: leafCert, key: leafKey };
  };
  return {
    dir,
    cert,
    key,
    server: (leaf, names = ["127.0.0.1", "localhost"]) =>
      sign(leaf, `basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=${names.map((n) => (/^[\d.]+$|:/.test(n) ? `IP:${n}` : `DNS:${n}`)).join(",")}\n`),
    client: (leaf) => sign(leaf, "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"),
    sign,
  };
}
