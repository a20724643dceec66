import { expect } from "chai";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { compileExecserverConfig } from "../../src/execserver/index.js";
import { slotbrokerArgs } from "../../harness/node-children.js";
import { track, release } from "../../harness/resources.js";
import { releaseAll, statusClient } from "./support/broker-stream.js";

const base = {
  waitgroups: { text: { processes: 2 } },
  services: { cat: { waitgroup: "text", command: ["cat"] }, nop: { waitgroup: "text", builtin: "noop" } },
};

function compileError(raw: unknown, env: NodeJS.ProcessEnv = {}): string {
  try {
    compileExecserverConfig(raw, "exec.yaml", env);
  } catch (err) {
    return (err as Error).message;
  }
  throw new Error("config was accepted");
}

describe("execserver config", () => {
  it("compiles a minimal config with every default filled in", () => {
    const config = compileExecserverConfig(base, "exec.yaml");
    expect(config).to.deep.include({
      listen: "127.0.0.1:7600",
      adminListen: "127.0.0.1:7601",
      token: undefined,
      offerTimeoutMs: 5000,
      drainTimeoutMs: 30_000,
      maxWantsPerConnection: 100_000,
      jobLauncher: "auto",
    });
    expect(config.instanceId).to.match(/-[0-9a-f]{8}$/);
    expect(config.services.cat).to.deep.equal({ name: "cat", waitgroup: "text", timeoutMs: 600_000, env: [], kind: "command", command: ["cat"] });
    expect(config.services.nop).to.deep.include({ kind: "builtin", builtin: "noop" });
  });

  it("names the bad key in every error", () => {
    expect(compileError({ ...base, offerTimeout: "5" })).to.match(/exec\.yaml: offerTimeout: expected a duration/);
    expect(compileError({ ...base, bogus: 1 })).to.contain('unknown key "bogus"');
    expect(compileError({ ...base, jobLauncher: "yes" })).to.contain('exec.yaml: jobLauncher: expected true, false or "auto"');
    expect(compileError({ ...base, waitgroups: { text: { processes: 0 } } })).to.contain("waitgroups.text.processes");
    expect(compileError({ ...base, services: { x: { waitgroup: "nope", command: ["cat"] } } })).to.contain('services.x.waitgroup: unknown waitgroup "nope"');
    expect(compileError({ ...base, services: { x: { waitgroup: "text", command: [] } } })).to.contain("services.x.command");
    expect(compileError({ ...base, services: { x: { waitgroup: "text" } } })).to.contain("services.x.command: required");
    expect(compileError({ ...base, services: { x: { waitgroup: "text", builtin: "ls" } } })).to.contain("services.x.builtin");
    expect(compileError({ ...base, services: { x: { waitgroup: "text", command: ["a"], env: ["BAD-NAME"] } } })).to.contain("services.x.env.0");
    expect(compileError({ ...base, listen: "nohost" })).to.contain("listen");
  });

  it("refuses a non-loopback listen without a token, and takes one from SLOTBROKER_TOKEN", () => {
    expect(compileError({ ...base, listen: "0.0.0.0:7600" })).to.contain("token: required");
    const config = compileExecserverConfig({ ...base, listen: "0.0.0.0:7600" }, "exec.yaml", { SLOTBROKER_TOKEN: "t0ken" });
    expect(config.token).to.equal("t0ken");
  });

  it("applies the environment overrides", () => {
    const config = compileExecserverConfig(base, "exec.yaml", {
      SLOTBROKER_LISTEN: "127.0.0.1:9000",
      SLOTBROKER_ADMIN_LISTEN: "127.0.0.1:9001",
      SLOTBROKER_INSTANCE_ID: "from-env",
    });
    expect(config).to.deep.include({ listen: "127.0.0.1:9000", adminListen: "127.0.0.1:9001", instanceId: "from-env" });
  });

  it("keeps environment values that look like numbers as strings where the schema wants a string", () => {
    const config = compileExecserverConfig(base, "exec.yaml", { SLOTBROKER_TOKEN: "123456", SLOTBROKER_INSTANCE_ID: "42" });
    expect(config).to.deep.include({ token: "123456", instanceId: "42" });
  });
});

describe("slotbroker execserver (CLI process)", () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "execserver-cli-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));
  afterEach(releaseAll);

  function startCli(configText: string): { child: ChildProcess; exit: Promise<number | null>; stderr: () => string } {
    const file = join(dir, `c${Math.random().toString(36).slice(2)}.yaml`);
    writeFileSync(file, configText);
    const child = spawn(process.execPath, slotbrokerArgs(["execserver", "--config", file]), {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, SLOTBROKER_LOG_LEVEL: "info" },
    });
    track(child, "execserver CLI process", (c) => void (c.exitCode === null && c.kill("SIGKILL")));
    let err = "";
    child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
    const exit = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    return { child, exit, stderr: () => err };
  }

  it("exits non-zero naming the bad key", async () => {
    const { child, exit, stderr } = startCli("waitgroups: {a: {processes: 1}}\nservices: {x: {waitgroup: b, command: [cat]}}\n");
    expect(await exit).to.equal(1);
    expect(stderr()).to.contain("services.x.waitgroup");
    await release(child);
  });

  it("prints where it listens, serves GetStatus, and drains on SIGTERM", async () => {
    const { child, exit, stderr } = startCli(
      "instanceId: cli-test\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {a: {processes: 1}}\nservices: {n: {waitgroup: a, builtin: noop}}\n",
    );
    const lines = createInterface({ input: child.stdout! });
    const line = await new Promise<string>((resolve) => lines.once("line", resolve));
    const m = /^execserver cli-test listening grpc=(127\.0\.0\.1:\d+) admin=(127\.0\.0\.1:\d+)$/.exec(line);
    expect(m, line).to.not.equal(null);
    const status = await statusClient(m![1]!).getStatus();
    expect(status.instanceId).to.equal("cli-test");
    const health = await fetch(`http://${m![2]}/healthz`);
    expect(health.status).to.equal(200);
    await releaseAll();
    child.kill("SIGTERM");
    expect(await exit).to.equal(0);
    expect(stderr()).to.contain('"msg":"execserver listening"');
    await release(child);
  });
});
