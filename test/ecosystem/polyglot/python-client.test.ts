// The Python example (examples/clients/python): its README steps, run word for word (only
// the address differs) in its own directory — a virtualenv from requirements.txt, stubs
// from proto/ by grpc_tools.protoc — against real execserver processes started from the
// demo config examples/execserver.yaml, so the services it uses are the ones a user has.
import { expect } from "chai";
import { execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parse } from "yaml";
import type { ExecserverConfigInput } from "../../../src/execserver/index.js";
import { spawnExecserver, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { closeAll, root } from "../../integration/support.js";
import { requireTool } from "../../../harness/system-tools.js";
import { run, type Run } from "./support.js";

const dir = join(root, "examples/clients/python");
const readme = readFileSync(join(dir, "README.md"), "utf8");
const blocks = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!.trim());
const demoConfig = parse(readFileSync(join(root, "examples/execserver.yaml"), "utf8")) as ExecserverConfigInput;

function demoExecserver(token?: string): Promise<ExecserverProcess> {
  const { listen: _listen, adminListen: _admin, ...config } = demoConfig;
  return spawnExecserver({ ...config, ...(token ? { token } : {}) }, { name: `demo execserver${token ? " with a token" : ""}` });
}

const sha256 = (bytes: Uint8Array | string): string => createHash("sha256").update(bytes).digest("hex");

describe("the Python example client (examples/clients/python)", function () {
  this.timeout(120_000);
  let exec: ExecserverProcess;
  let guarded: ExecserverProcess;
  const python = join(dir, ".venv/bin/python");

  before(async function () {
    this.timeout(600_000);
    expect(blocks, "the README has a setup block and a run block").to.have.length(2);
    requireTool("python3");
    const setup = await run("bash", ["-c", `set -euo pipefail\n${blocks[0]!}`], { cwd: dir, timeoutMs: 540_000 });
    expect(setup.code, `README setup steps failed:\n${setup.stderr}`).to.equal(0);
    exec = await demoExecserver();
    guarded = await demoExecserver("py-secret");
  });

  after(() => closeAll(exec, guarded));

  const client = (args: string[], options: { input?: Buffer; token?: string } = {}): Promise<Run> =>
    runWithInput(python, [join(dir, "broker_client.py"), ...args], options.input ?? Buffer.alloc(0), {
      ...process.env,
      PYTHONPATH: join(dir, "gen"),
      SLOTBROKER_TOKEN: options.token ?? "",
    });

  it("runs the README's command against the demo config: sha256sum of its own stdin", async () => {
    const r = await run("bash", ["-c", blocks[1]!.replaceAll("127.0.0.1:7600", exec.grpcAddress)], { cwd: dir });
    expect(r.stderr).to.equal("");
    expect(r.code).to.equal(0);
    expect(r.stdout).to.equal(`${sha256("hello\n")}  -\n`);
    expect(Number((await exec.status()).waitgroups.find((w) => w.name === "text")!.completed)).to.equal(1);
  });

  it("keeps its docstring's command the same as the README's", () => {
    const doc = readFileSync(join(dir, "broker_client.py"), "utf8");
    expect(doc).to.include(blocks[1]!);
  });

  it("takes output past 4000 bytes through the stdout URL it serves (chunked PUT)", async () => {
    const input = randomBytes(1_500_000);
    const r = await client([exec.grpcAddress, "cat"], { input });
    expect(r.code, r.stderr).to.equal(0);
    expect(sha256(Buffer.from(r.stdout, "latin1"))).to.equal(sha256(input));
  });

  it("exits with the job's exit code and shows its stderr line", async () => {
    const r = await client([exec.grpcAddress, "sleep", "x"]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/sleep/);
    expect(r.stderr).to.not.include("Traceback");
  });

  it("says in one line, without a traceback, that a token is missing or wrong, and nothing runs", async () => {
    for (const token of [undefined, "wrong"]) {
      const r = await client([guarded.grpcAddress, "sha256sum"], { input: Buffer.from("x"), token });
      expect(r.code, `token ${token}`).to.equal(2);
      expect(r.stderr).to.match(/^broker_client\.py: the execserver refused the token \(UNAUTHENTICATED\): set SLOTBROKER_TOKEN/);
      expect(r.stderr.trim().split("\n")).to.have.length(1);
    }
    const ok = await client([guarded.grpcAddress, "sha256sum"], { input: Buffer.from("x"), token: "py-secret" });
    expect(ok.stdout).to.equal(`${sha256("x")}  -\n`);
    expect(Number((await guarded.status()).waitgroups.find((w) => w.name === "text")!.completed)).to.equal(1);
  });

  it("connects over TLS with a client certificate (mTLS) and a token, as docs/clients.md shows", async function () {
    this.timeout(60_000);
    const certs = mkdtempSync(join(tmpdir(), "python-client-tls-"));
    const [server, clientCert] = ["server", "client"].map((name) => selfSigned(certs, name));
    const { listen: _listen, adminListen: _admin, ...config } = demoConfig;
    const tlsExec = await spawnExecserver({ ...config, instanceId: "py-tls-exec", token: "py-secret", tls: { certFile: server!.cert, keyFile: server!.key, clientCaFile: clientCert!.cert } });
    try {
      const env = { ...process.env, PYTHONPATH: join(dir, "gen"), SLOTBROKER_TOKEN: "py-secret", SLOTBROKER_CA_FILE: server!.cert };
      const mtls = await runWithInput(python, [join(dir, "broker_client.py"), tlsExec.grpcAddress, "sha256sum"], Buffer.from("tls\n"), {
        ...env,
        SLOTBROKER_CERT_FILE: clientCert!.cert,
        SLOTBROKER_KEY_FILE: clientCert!.key,
      });
      expect([mtls.code, mtls.stderr]).to.deep.equal([0, ""]);
      expect(mtls.stdout).to.equal(`${sha256("tls\n")}  -\n`);
      // Without the client certificate the handshake is refused: exit 2, saying so (grpc's
      // C core logs its own TLS lines above it).
      const anonymous = await runWithInput(python, [join(dir, "broker_client.py"), tlsExec.grpcAddress, "sha256sum"], Buffer.from("x"), env);
      expect(anonymous.code).to.equal(2);
      expect(anonymous.stderr.trim().split("\n").at(-1)).to.match(/^broker_client\.py: cannot reach the execserver \(UNAVAILABLE\)/);
    } finally {
      await closeAll(tlsExec);
      rmSync(certs, { recursive: true, force: true });
    }
  });

  it("names the services on offer when asked for one the execserver lacks", async () => {
    const r = await client([exec.grpcAddress, "echo", "hi"]);
    expect(r.code).to.equal(2);
    expect(r.stderr).to.match(/^broker_client\.py: execserver demo-exec-1 does not offer 'echo' \(it offers: cat, noop, sha256sum, sleep, wc\)\n$/);
  });
});

// A self-signed certificate for 127.0.0.1, made with the openssl CLI.
function selfSigned(where: string, name: string): { cert: string; key: string } {
  const cert = join(where, `${name}.crt`);
  const key = join(where, `${name}.key`);
  execFileSync(
    requireTool("openssl"),
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", `/CN=${name}`,
      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
    { stdio: "ignore" },
  );
  return { cert, key };
}

/** Runs a program with `input` on its stdin; stdout is kept as latin1 so binary survives. */
function runWithInput(file: string, args: string[], input: Buffer, env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise<Run>((resolve, reject) => {
    const child = spawn(file, args, { cwd: dir, env, stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    let stderr = "";
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.setEncoding("utf8").on("data", (s: string) => (stderr += s));
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? 1, stdout: Buffer.concat(out).toString("latin1"), stderr });
    });
    child.stdin.on("error", () => undefined);
    child.stdin.end(input);
  });
}
