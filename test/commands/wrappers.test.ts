// A server started through npm (npx, npm start, npm run) sits behind `sh -c`, which dies on
// SIGTERM without passing it on: the server must notice and stop gracefully, not run on
// re-parented to init. Without npm, a server whose shell exits (nohup … &) keeps running.
import { expect } from "chai";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { waitForOutput } from "../../harness/child-output.js";
import { release, track } from "../../harness/resources.js";
import { root } from "../integration/support.js";
import { slotbrokerArgs } from "../../harness/node-children.js";

const config = "listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {a: {processes: 1}}\nservices: {n: {waitgroup: a, builtin: noop}}\n";

/** True while the process exists and is not a zombie. */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

// The server is not our child, so no event reports its end: look until it is gone.
async function gone(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // gone already
  }
}

describe("signals through wrappers", function () {
  this.timeout(60_000);
  let dir: string;
  let file: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-wrap-"));
    file = join(dir, "execserver.yaml");
    writeFileSync(file, config);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  async function start(argv: string[], env: NodeJS.ProcessEnv): Promise<{ wrapper: ChildProcess; server: number; serverHandle: object; log: () => string }> {
    const wrapper = spawn(argv[0]!, argv.slice(1), { cwd: root, env: { ...env, SLOTBROKER_LOG_LEVEL: "info" }, stdio: ["ignore", "pipe", "pipe"] });
    let log = "";
    const listening = /"pid":(\d+),[^\n]*"msg":"execserver listening"/;
    const logged = new Promise<number>((resolve) => {
      wrapper.stderr.setEncoding("utf8").on("data", (s: string) => {
        log += s;
        const m = listening.exec(log);
        if (m) resolve(Number(m[1]));
      });
    });
    track(wrapper, "wrapper process", (w) => void (w.exitCode === null && w.kill("SIGKILL")));
    await waitForOutput(wrapper, /^execserver \S+ listening/m, { timeoutMs: 30_000, context: () => log });
    const server = await logged;
    const serverHandle = track({ server }, "execserver behind a wrapper", ({ server: pid }) => killQuietly(pid));
    return { wrapper, server, serverHandle, log: () => log };
  }

  it("SIGTERM to `npm run` reaches the server behind npm's shell, which drains and exits", async () => {
    const { wrapper, server, serverHandle, log } = await start(["npm", "run", "-s", "slotbroker", "--", "execserver", "--config", file], process.env);
    expect(server).to.not.equal(wrapper.pid);
    const exited = new Promise((done) => wrapper.once("exit", done));
    wrapper.kill("SIGTERM");
    await exited;
    if (!(await gone(server, 15_000))) {
      const { execSync } = await import("node:child_process");
      const tree = execSync(`ps -eo pid,ppid,pgid,stat,cmd | grep -v grep | grep -E "${file}|^ *${server} "`).toString();
      const stat = readFileSync(`/proc/${server}/stat`, "utf8");
      expect.fail(`the server outlived npm\n${tree}\n${stat}\n${log()}`);
    }
    expect(log()).to.contain('"msg":"draining"').and.to.contain('"msg":"execserver stopped"');
    await release(wrapper);
    await release(serverHandle);
  });

  it("outside npm, a server whose shell exits keeps running (nohup … & semantics)", async () => {
    const env = { ...process.env };
    delete env.npm_command;
    const cmd = `${[process.execPath, ...slotbrokerArgs(["execserver", "--config", file])].map((a) => JSON.stringify(a)).join(" ")} & wait`;
    const { wrapper, server, serverHandle, log } = await start(["sh", "-c", cmd], env);
    const exited = new Promise((done) => wrapper.once("exit", done));
    wrapper.kill("SIGTERM");
    await exited;
    expect(await gone(server, 1500), log()).to.equal(false);
    process.kill(server, "SIGTERM");
    expect(await gone(server, 15_000)).to.equal(true);
    await release(wrapper);
    await release(serverHandle);
  });
});
