// Mutual TLS between real processes: an execserver whose gRPC port requires a client
// certificate signed by its clientCaFile, and `slotbroker fylr` processes with and without
// execserver.tls.certFile/keyFile. Certificates come from the openssl CLI.
import { expect } from "chai";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stringify } from "yaml";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { fetchExecserverStatus } from "../../src/app/index.js";
import { tlsHandshakeProblem } from "../../src/fylr/index.js";
import { makeCa, type CertFiles, type TestCa } from "../support/certificates.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { inState, watchUntil } from "../support/watch-item.js";
import { fastFylrConfig, slotbroker, spawnFylr } from "../integration/support.js";

describe("execserver mutual TLS with a slotbroker fylr", function () {
  this.timeout(120_000);
  let dir: string;
  let ca: TestCa;
  let serverCert: CertFiles;
  let fylrCert: CertFiles;
  let rogueCert: CertFiles;
  let exec: ExecserverProcess;
  let databaseUrl: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-mtls-"));
    ca = makeCa(dir, "slotbroker-ca");
    serverCert = ca.server("execserver");
    fylrCert = ca.client("fylr");
    // Signed by a CA the execserver does not trust.
    rogueCert = makeCa(dir, "other-ca").client("rogue");
    databaseUrl = await createTestDatabase("mtls");
    // One execserver for the file: no test changes it, each brings its own fylr.
    exec = await spawnExecserver({
      tls: { certFile: serverCert.cert, keyFile: serverCert.key, clientCaFile: ca.cert },
      waitgroups: { text: { processes: 2 } },
      services: { sha256sum: { waitgroup: "text", command: ["sha256sum"] } },
    });
  });
  after(async () => {
    await release(exec);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const fylrConfig = (tls: Record<string, string>) =>
    fastFylrConfig(databaseUrl, [exec.grpcAddress], { execserver: { addresses: [exec.grpcAddress], tls: { caFile: ca.cert, ...tls } } });
  const readyz = async (url: string): Promise<{ status: number; body: string }> => {
    const res = await fetch(`${url}/readyz`);
    return { status: res.status, body: await res.text() };
  };

  it("a fylr that presents its client certificate is accepted and runs an item end to end", async () => {
    const fylr = await spawnFylr(fylrConfig({ certFile: fylrCert.cert, keyFile: fylrCert.key }), "mtls-ok");
    await waitFor("the fylr ready", async () => (await readyz(fylr.url)).status === 200);
    const { item } = await fylr.client.submit({ calls: [{ service: "sha256sum", stdin: { case: "stdinData", value: Buffer.from("over mutual TLS\n") } }] });
    const done = await watchUntil(fylr.client, item!.id, "the item done", inState(ItemState.SUCCEEDED, ItemState.FAILED));
    expect(done.item!.state, done.item!.error).to.equal(ItemState.SUCCEEDED);
    // sha256 of "over mutual TLS\n"
    expect(Buffer.from((await fylr.client.get({ id: item!.id })).item!.output).toString()).to.match(/^[0-9a-f]{64} {2}-\n$/);
    expect((await readyz(fylr.url)).body).to.match(/^ready\n.*\[\+\]execservers ok: 1 execserver instance\(s\) connected/s);
    // GetStatus (queue positions, `slotbroker status`) presents the certificate too.
    const status = await fetchExecserverStatus(exec.grpcAddress, { tls: { caFile: ca.cert, certFile: fylrCert.cert, keyFile: fylrCert.key } });
    expect(status.instanceId).to.equal(exec.instanceId);
    const anonymous = await fetchExecserverStatus(exec.grpcAddress, { tls: { caFile: ca.cert } }).catch((e: unknown) => e as Error);
    expect(anonymous).to.be.instanceOf(Error);
    expect(await fylr.stop()).to.equal(0);
    await release(fylr);
  });

  for (const [title, tls] of [
    ["without a client certificate", {}],
    ["with a certificate the execserver's CA did not sign", "rogue"],
  ] as const) {
    it(`a fylr ${title} is refused, keeps running and says why in its log and /readyz`, async () => {
      const certs: Record<string, string> = tls === "rogue" ? { certFile: rogueCert.cert, keyFile: rogueCert.key } : {};
      const fylr = await spawnFylr(fylrConfig(certs), "mtls-refused");
      const report = await waitFor("/readyz naming the refusal", async () => {
        const r = await readyz(fylr.url);
        if (r.status === 503 && /refused this fylr's TLS client certificate/.test(r.body)) return r;
        throw new Error(`${r.status} ${r.body}`);
      });
      expect(report.body).to.match(/^not ready: execservers\n/);
      expect(report.body).to.contain(`[-]execservers failed: no execserver connected (${exec.grpcAddress}: `);
      // The operator's hint, at warn level, in the log.
      const warned = await waitFor("the warning in the log", () => /execserver\.tls\.certFile/.test(fylr.stderr()) && fylr.stderr());
      expect(warned).to.match(/"level":"?(warn|40)/);
      // Liveness and the database are fine: nothing restarts it, nothing hides the reason.
      expect((await fetch(`${fylr.url}/livez`)).status).to.equal(200);
      expect(report.body).to.match(/\[\+\]database ok/);
      expect(fylr.child.exitCode).to.equal(null);
      expect(await fylr.stop()).to.equal(0);
      await release(fylr);
    });
  }

  it("a fylr picks up a certificate replaced on disk (a renewal, a fix) with its next connection, without a restart", async () => {
    // The files the fylr names start out as the foreign certificate.
    const volume = join(dir, "renewed");
    mkdirSync(volume, { recursive: true });
    copyFileSync(rogueCert.cert, join(volume, "tls.crt"));
    copyFileSync(rogueCert.key, join(volume, "tls.key"));
    const fylr = await spawnFylr(fylrConfig({ certFile: join(volume, "tls.crt"), keyFile: join(volume, "tls.key") }), "mtls-renewed");
    await waitFor("/readyz naming the refusal", async () => /refused this fylr's TLS client certificate/.test((await readyz(fylr.url)).body));
    // As cert-manager does: the key first, then the certificate.
    copyFileSync(fylrCert.key, join(volume, "tls.key"));
    copyFileSync(fylrCert.cert, join(volume, "tls.crt"));
    await waitFor("the fylr ready", async () => (await readyz(fylr.url)).status === 200, 30_000);
    expect(fylr.child.exitCode).to.equal(null);
    expect(await fylr.stop()).to.equal(0);
    await release(fylr);
  });

  it("one diagnostic handshake tells an untrusted server certificate from a refused client certificate, and a working pair from both", async () => {
    const other = makeCa(dir, "third-ca");
    const good = { caFile: ca.cert, certFile: fylrCert.cert, keyFile: fylrCert.key };
    expect(await tlsHandshakeProblem(exec.grpcAddress, good)).to.equal(undefined);
    expect(await tlsHandshakeProblem(exec.grpcAddress, { ...good, caFile: other.cert })).to.match(
      new RegExp(`^this fylr does not trust the TLS certificate of the execserver at ${exec.grpcAddress} \\(.+\\): check execserver\\.tls\\.caFile and serverName$`),
    );
    expect(await tlsHandshakeProblem(exec.grpcAddress, { caFile: ca.cert })).to.match(/refused this fylr's TLS client certificate \(.*certificate required.*\)/);
  });

  it("a certificate without its key, an unreadable file or a key of another certificate stops the start with the key named", async () => {
    const cases: [Record<string, string>, RegExp][] = [
      [{ certFile: fylrCert.cert }, /invalid config: .*execserver: tls\.keyFile: required with tls\.certFile/],
      [{ certFile: join(dir, "missing.crt"), keyFile: fylrCert.key }, /invalid config: execserver\.tls\.certFile: cannot read .*missing\.crt/],
      [{ certFile: fylrCert.cert, keyFile: rogueCert.key }, /invalid config: execserver\.tls\.certFile\/keyFile: not usable: .*key values mismatch/],
    ];
    for (const [tls, message] of cases) {
      const path = join(dir, "fylr.yaml");
      writeFileSync(path, stringify({ name: "bad-tls", ...fylrConfig(tls) }));
      const ran = await slotbroker(["fylr", "--config", path], { timeoutMs: 60_000 });
      expect(ran.code, ran.stderr).to.equal(1);
      expect(ran.stderr).to.match(message);
    }
  });
});
