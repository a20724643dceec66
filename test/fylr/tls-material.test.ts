import { expect } from "chai";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, unlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { currentTlsMaterial, readTlsMaterial } from "../../src/fylr/index.js";
import { ConfigError } from "../../src/shared/errors.js";
import { makeCa } from "../support/certificates.js";

describe("the fylr's TLS files", () => {
  let dir: string;
  before(() => (dir = mkdtempSync(join(tmpdir(), "slotbroker-tls-files-"))));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("reads a renewed pair; mid-rotation (mismatched or missing) it keeps the last usable one, where a strict read names the problem", () => {
    const ca = makeCa(dir, "ca");
    const first = ca.client("first");
    const second = ca.client("second");
    const options = { caFile: ca.cert, certFile: join(dir, "tls.crt"), keyFile: join(dir, "tls.key") };
    copyFileSync(first.cert, options.certFile);
    copyFileSync(first.key, options.keyFile);
    expect(currentTlsMaterial(options).cert!.equals(readFileSync(first.cert))).to.equal(true);

    copyFileSync(second.key, options.keyFile); // the key is new, the certificate not yet
    expect(() => readTlsMaterial(options)).to.throw(ConfigError, /^execserver\.tls\.certFile\/keyFile: not usable: .*key values mismatch/);
    expect(currentTlsMaterial(options).key!.equals(readFileSync(first.key))).to.equal(true);
    unlinkSync(options.certFile);
    expect(() => readTlsMaterial(options)).to.throw(ConfigError, /^execserver\.tls\.certFile: cannot read /);
    expect(currentTlsMaterial(options).cert!.equals(readFileSync(first.cert))).to.equal(true);

    copyFileSync(second.cert, options.certFile);
    expect(currentTlsMaterial(options).cert!.equals(readFileSync(second.cert))).to.equal(true);
  });

  it("refuses a certificate without its key, and an unusable file never read before", () => {
    expect(() => currentTlsMaterial({ certFile: join(dir, "tls.crt") })).to.throw(ConfigError, /^execserver\.tls\.keyFile: required with certFile/);
    expect(() => currentTlsMaterial({ caFile: join(dir, "nowhere.crt") })).to.throw(ConfigError, /^execserver\.tls\.caFile: cannot read .*nowhere\.crt/);
  });
});
