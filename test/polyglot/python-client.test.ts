import { expect } from "chai";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import type { ExecserverHandle } from "../../src/app/execserver.js";
import { startTestServer } from "../execserver/support/server.js";
import { release } from "../support/resources.js";
import { requireTool } from "../support/system-tools.js";

const run = promisify(execFile);
const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

describe("a Python client generated from the proto", function () {
  this.timeout(240_000);
  let python: string;
  let stubs: string;
  let server: ExecserverHandle | undefined;

  before(async () => {
    requireTool("python3");
    python = (await run(join(root, "scripts/python-env.sh"), { timeout: 220_000 })).stdout.trim();
    stubs = mkdtempSync(join(tmpdir(), "slotbroker-py-stubs-"));
    await run(python, ["-m", "grpc_tools.protoc", "-I", "proto", `--python_out=${stubs}`, `--grpc_python_out=${stubs}`, "proto/slotbroker/v1/broker.proto"], {
      cwd: root,
    });
  });

  after(() => rmSync(stubs, { recursive: true, force: true }));

  afterEach(async () => {
    await release(server);
    server = undefined;
  });

  async function client(address: string, args: string[], token: string): Promise<{ code: number; stdout: string; stderr: string }> {
    try {
      const out = await run(python, [join(root, "examples/clients/python/broker_client.py"), address, ...args], {
        env: { ...process.env, PYTHONPATH: stubs, SLOTBROKER_TOKEN: token },
        timeout: 60_000,
      });
      return { code: 0, ...out };
    } catch (err) {
      const e = err as { code?: number; stdout?: string; stderr?: string };
      return { code: e.code ?? 1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
    }
  }

  it("runs a job through WANT, OFFER, JOB and DONE against a real execserver", async () => {
    server = await startTestServer({
      token: "py-secret",
      waitgroups: { text: { processes: 1 } },
      services: { echo: { waitgroup: "text", command: ["echo"] } },
    });
    const result = await client(server.grpcAddress, ["echo", "hello", "from", "python"], "py-secret");
    expect(result.stderr).to.equal("");
    expect(result.code).to.equal(0);
    const receipt = JSON.parse(result.stdout) as { exitCode: number; stdoutPrefix: string; instanceId: string };
    expect(receipt.exitCode).to.equal(0);
    expect(Buffer.from(receipt.stdoutPrefix, "base64").toString()).to.equal("hello from python\n");
    expect(receipt.instanceId).to.equal("test-exec");
    const text = server.status().waitgroups.find((w) => w.name === "text");
    expect(Number(text?.completed)).to.equal(1);
  });

  it("is refused with UNAUTHENTICATED for a wrong token, and nothing runs", async () => {
    server = await startTestServer({
      token: "py-secret",
      waitgroups: { text: { processes: 1 } },
      services: { echo: { waitgroup: "text", command: ["echo"] } },
    });
    const result = await client(server.grpcAddress, ["echo", "nope"], "wrong");
    expect(result.code).to.not.equal(0);
    expect(result.stderr).to.match(/UNAUTHENTICATED/);
    expect(Number(server.status().waitgroups[0]?.completed)).to.equal(0);
  });
});
