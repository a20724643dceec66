// The Go example (examples/clients/go): its README steps, run word for word (only the
// address differs), generate stubs from proto/ with the committed buf template and local
// plugins, build it with Go and run it against a real execserver process: HELLO, WANT,
// OFFER, JOB with its own one-time pipe URLs, a half-close, DONE, and the digest of 8 MiB.
import { expect } from "chai";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { requireTool } from "../../../harness/system-tools.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { closeAll, root } from "../../integration/support.js";
import { goTools, run, type Run } from "./support.js";

const readme = readFileSync(join(root, "examples/clients/go/README.md"), "utf8");
const blocks = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!.trim());
const token = "go-secret";

describe("the Go example client (examples/clients/go)", function () {
  this.timeout(120_000);
  let exec: ExecserverProcess;
  const fylrBin = join(root, "tools/bin/slotbroker-go-fylr");

  before(async function () {
    this.timeout(900_000);
    expect(blocks, "the README has a build block and a run block").to.have.length(2);
    await goTools();
    const build = await run("bash", ["-c", `set -euo pipefail\n${blocks[0]!}`], { timeoutMs: 600_000 });
    expect(build.code, `README build steps failed:\n${build.stderr}`).to.equal(0);
    exec = await spawnExecserver({
      instanceId: "go-exec",
      token,
      waitgroups: { text: { processes: 2 } },
      services: { cat: { waitgroup: "text", command: ["cat"] }, sha256sum: { waitgroup: "text", command: ["sha256sum"] } },
    });
  });

  after(() => closeAll(exec));

  const runReadme = (env: Record<string, string>): Promise<Run> =>
    run("bash", ["-c", blocks[1]!.replaceAll("127.0.0.1:7600", exec.grpcAddress)], { env: { ...process.env, ...env } });

  it("runs the README's command: 8 MiB through its own pipe URLs, digest checked, after a half-close", async () => {
    expect(blocks[1]).to.include("-addr 127.0.0.1:7600");
    const r = await runReadme({ SLOTBROKER_TOKEN: token });
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^ok: cat on go-exec, 8388608 bytes in, 8388608 bytes out, sha256 [0-9a-f]{64}, /);
    const status = await exec.status();
    expect(Number(status.waitgroups[0]!.completed)).to.equal(1);
    expect(status.connections).to.deep.equal([]);
  });

  it("checks a digest the execserver computed (short output, in the receipt)", async () => {
    const r = await run(fylrBin, ["-addr", exec.grpcAddress, "-service", "sha256sum", "-size", "3000000"], { env: { ...process.env, SLOTBROKER_TOKEN: token } });
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^ok: sha256sum on go-exec, 3000000 bytes in, 68 bytes out/);
  });

  it("says what is wrong, without a trace, for a wrong token and for a service the execserver lacks", async () => {
    const wrong = await runReadme({ SLOTBROKER_TOKEN: "nope" });
    expect(wrong.code).to.equal(2);
    expect(wrong.stderr).to.match(/^slotbroker-go-fylr: the execserver refused the token \(UNAUTHENTICATED\): set SLOTBROKER_TOKEN/);
    const missing = await run(fylrBin, ["-addr", exec.grpcAddress, "-service", "ffmpeg"], { env: { ...process.env, SLOTBROKER_TOKEN: token } });
    expect(missing.code).to.equal(2);
    expect(missing.stderr).to.equal('slotbroker-go-fylr: execserver go-exec does not offer "ffmpeg" (it offers: cat, sha256sum)\n');
  });

  it("connects over TLS with a client certificate (mTLS) and a token, as docs/clients.md shows", async function () {
    this.timeout(60_000);
    const dir = mkdtempSync(join(tmpdir(), "go-client-tls-"));
    const [server, client] = ["server", "client"].map((name) => selfSigned(dir, name));
    const tlsExec = await spawnExecserver({
      instanceId: "go-tls-exec",
      token,
      tls: { certFile: server!.cert, keyFile: server!.key, clientCaFile: client!.cert },
      waitgroups: { text: { processes: 1 } },
      services: { cat: { waitgroup: "text", command: ["cat"] } },
    });
    try {
      const env = { ...process.env, SLOTBROKER_TOKEN: token, SLOTBROKER_CA_FILE: server!.cert };
      const mtls = await run(fylrBin, ["-addr", tlsExec.grpcAddress, "-size", "100000"], { env: { ...env, SLOTBROKER_CERT_FILE: client!.cert, SLOTBROKER_KEY_FILE: client!.key } });
      expect(mtls.code, mtls.stderr).to.equal(0);
      expect(mtls.stdout).to.match(/^ok: cat on go-tls-exec, 100000 bytes in, 100000 bytes out/);
      // Without the client certificate the handshake is refused.
      const anonymous = await run(fylrBin, ["-addr", tlsExec.grpcAddress, "-size", "10", "-timeout", "10s"], { env });
      expect(anonymous.code).to.equal(2);
    } finally {
      await closeAll(tlsExec);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// A self-signed certificate for 127.0.0.1, made with the openssl CLI.
function selfSigned(dir: string, name: string): { cert: string; key: string } {
  const cert = join(dir, `${name}.crt`);
  const key = join(dir, `${name}.key`);
  execFileSync(
    requireTool("openssl"),
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", `/CN=${name}`,
      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
    { stdio: "ignore" },
  );
  return { cert, key };
}
