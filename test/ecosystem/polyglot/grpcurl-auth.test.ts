// grpcurl (built from source with Go) against a fylr whose API needs credentials: bearer
// tokens of each scope over cleartext h2c, and client certificates over TLS. The same calls
// over Connect, grpc-js and curl run in test/integration/api-auth.test.ts and api-tls.test.ts.
import { expect } from "chai";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeCa, type CertFiles, type TestCa } from "../../support/certificates.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { createTestDatabase } from "../../support/postgres.js";
import { closeAll, fastFylrConfig, spawnFylr, type FylrProcess } from "../../integration/support.js";
import { goTools, run, type Run } from "./support.js";

const tokens = { reader: "reader-7f3c9a1b2d4e5f60", submitter: "submitter-0a1b2c3d4e5f6071", ci: "ci-token-5e4d3c2b1a0f9e8d" } as const;

describe("grpcurl against a fylr that needs credentials", function () {
  this.timeout(600_000);
  let grpcurl: string;
  let dir: string;
  let ca: TestCa;
  let ops: CertFiles;
  let exec: ExecserverProcess;
  let plain: FylrProcess;
  let tls: FylrProcess;
  const host = (f: FylrProcess): string => f.url.replace(/^https?:\/\//, "");

  before(async function () {
    grpcurl = join(await goTools(), "grpcurl");
    dir = mkdtempSync(join(tmpdir(), "slotbroker-grpcurl-auth-"));
    ca = makeCa(dir, "test-ca");
    const server = ca.server("fylr");
    ops = ca.client("ops-client");
    exec = await spawnExecserver({ waitgroups: { text: { processes: 2 } }, services: { wc: { waitgroup: "text", command: ["wc", "-c"] } } });
    const auth = {
      tokens: [
        { name: "reader", token: tokens.reader, scopes: ["read" as const] },
        { name: "submitter", token: tokens.submitter, scopes: ["submit" as const] },
      ],
    };
    plain = await spawnFylr(fastFylrConfig(await createTestDatabase("grpcurl_auth"), [exec.grpcAddress], { auth }), "grpcurl-auth", {
      credentials: { token: tokens.submitter },
    });
    tls = await spawnFylr(
      fastFylrConfig(await createTestDatabase("grpcurl_tls"), [exec.grpcAddress], {
        tls: { certFile: server.cert, keyFile: server.key, clientCaFile: ca.cert },
        auth: { tokens: [{ name: "ci", token: tokens.ci, scopes: ["submit", "read"] }], clients: [{ subject: "ops-client", scopes: ["admin"] }] },
      }),
      "grpcurl-tls",
      { credentials: { token: tokens.ci, ca: readFileSync(ca.cert) } },
    );
  });

  after(async () => {
    await closeAll(plain, tls, exec);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("reflection and health stay open; QueueService needs the token of the right scope", async () => {
    const grpcurlRun = (args: string[]): Promise<Run> => run(grpcurl, ["-plaintext", ...args]);
    const address = host(plain);
    const listed = await grpcurlRun([address, "list"]);
    expect(listed.code, listed.stderr).to.equal(0);
    expect(listed.stdout).to.include("slotbroker.v1.QueueService");
    const health = await grpcurlRun(["-d", '{"service":"slotbroker.v1.QueueService"}', address, "grpc.health.v1.Health/Check"]);
    expect(health.stdout).to.include("SERVING");
    const submit = (token?: string): Promise<Run> =>
      grpcurlRun([...(token ? ["-H", `authorization: Bearer ${token}`] : []), "-d", '{"calls":[{"service":"wc","stdinData":"aGk="}]}', address, "slotbroker.v1.QueueService/Submit"]);
    const anonymous = await submit();
    expect(anonymous.code).to.not.equal(0);
    expect(anonymous.stderr).to.match(/Code: Unauthenticated\s+Message: no credential/);
    const reader = await submit(tokens.reader);
    expect(reader.stderr).to.match(/Code: PermissionDenied\s+Message: token "reader" has read; this call needs the submit scope/);
    const ok = await submit(tokens.submitter);
    expect(ok.code, ok.stderr).to.equal(0);
    expect(ok.stdout).to.include('"id"');
  });

  it("over TLS with -cacert, -cert and -key; without the certificate it is refused; a token still works", async () => {
    const address = host(tls);
    const tlsArgs = ["-cacert", ca.cert];
    const withCert = [...tlsArgs, "-cert", ops.cert, "-key", ops.key];
    const stats = await run(grpcurl, [...withCert, address, "slotbroker.v1.QueueService/Stats"]);
    expect(stats.code, stats.stderr).to.equal(0);
    expect(stats.stdout).to.include('"fylrId"');
    const anonymous = await run(grpcurl, [...tlsArgs, address, "slotbroker.v1.QueueService/Stats"]);
    expect(anonymous.stderr).to.match(/Code: Unauthenticated/);
    const token = await run(grpcurl, [...tlsArgs, "-H", `authorization: Bearer ${tokens.ci}`, address, "slotbroker.v1.QueueService/Stats"]);
    expect(token.code, token.stderr).to.equal(0);
  });
});
