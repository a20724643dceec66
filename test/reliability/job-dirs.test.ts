// Issue 28 finding 2, with real processes: a SIGKILLed execserver left its jobs' working
// directories in the temp directory, dozens over a soak. Its reaper now removes them when
// it dies; an execserver that starts removes what a dead one left when nothing did (its
// reaper died too); and two execservers on one host never remove each other's live ones.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import { spawnExecserver, waitFor, type ExecserverProcess, type SpawnExecserverConfig } from "../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";
import { jobDirsUnder } from "../../harness/job-dirs.js";
import { livingMembers } from "../support/process-group.js";
import { processesWhere, reaperOf } from "../support/process-liveness.js";
import { closeAll, root } from "../integration/support.js";
import { slotbrokerArgs } from "../../harness/node-children.js";

interface Run {
  readonly pid: number;
  readonly cwd: string;
}

// "start ITEM PID CWD" lines a job wrote.
function runs(ledger: string): Run[] {
  try {
    return readFileSync(ledger, "utf8")
      .split("\n")
      .filter(Boolean)
      .map((l) => {
        const [, , pid, cwd] = l.split(" ");
        return { pid: Number(pid), cwd: cwd! };
      });
  } catch {
    return [];
  }
}

describe("reliability: job directories an execserver leaves", function () {
  this.timeout(120_000);
  let dir: string;
  let tmp: string;
  let execs: ExecserverProcess[] = [];
  let replicas: FylrReplica[] = [];
  const groups = new Set<number>();

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "slotbroker-job-dirs-"));
    // TMPDIR of the execservers: where their jobs' directories go.
    tmp = join(dir, "tmp");
    mkdirSync(tmp);
  });
  afterEach(async () => {
    for (const g of groups) {
      try {
        process.kill(-g, "SIGKILL");
      } catch {
        // gone, as it should be
      }
    }
    groups.clear();
    for (const r of replicas) await stopReplica(r);
    replicas = [];
    await closeAll(...execs);
    execs = [];
    rmSync(dir, { recursive: true, force: true });
  });

  function config(name: string, ledger: string): SpawnExecserverConfig {
    const script = `echo "start $1 $$ $PWD" >> ${ledger}; sleep 60 & sleep 60`;
    return { instanceId: name, waitgroups: { w: { processes: 2 } }, services: { hold: { waitgroup: "w", command: ["sh", "-c", script, "hold"] } } };
  }

  async function start(name: string, ledger: string): Promise<ExecserverProcess> {
    const exec = await spawnExecserver(config(name, ledger), { env: { TMPDIR: tmp } });
    execs.push(exec);
    return exec;
  }

  /** Starts `n` jobs that run for a minute on `exec`; resolves with them once they run. */
  async function hold(exec: ExecserverProcess, ledger: string, n: number): Promise<Run[]> {
    const replica = await startReplica({ addresses: [exec.grpcAddress], connectTimeout: "30s" }, `holder-${exec.instanceId}`);
    replicas.push(replica);
    for (let i = 0; i < n; i++) void replica.exec.run({ service: "hold", args: [String(i)] }).catch(() => undefined);
    await waitFor(`${n} jobs running on ${exec.instanceId}`, () => runs(ledger).length >= n, 30_000);
    const started = runs(ledger);
    for (const r of started) groups.add(r.pid);
    return started;
  }

  /** Kills the execserver together with its reaper, as if both died in one blow. */
  async function killWithReaper(exec: ExecserverProcess): Promise<void> {
    const reaper = await reaperOf(exec.child.pid!);
    expect(reaper, "the execserver's reaper").to.not.equal(undefined);
    process.kill(reaper!.pid, "SIGSTOP"); // so it cannot act on the EOF
    await exec.kill("SIGKILL");
    process.kill(reaper!.pid, "SIGKILL");
    await waitFor("the reaper to be gone", async () => (await processesWhere((c) => c.includes("slotbroker-job-reaper"))).every((p) => p.pid !== reaper!.pid));
  }

  const alive = async (rs: readonly Run[]): Promise<number[]> => (await Promise.all(rs.map((r) => livingMembers(r.pid)))).flat();

  it("issue 28 finding 2: the job directories of a SIGKILLed execserver go with it", async () => {
    const ledger = join(dir, "ledger");
    const exec = await start("exec-dirs", ledger);
    const jobs = await hold(exec, ledger, 2);
    expect(jobDirsUnder(tmp)).to.deep.equal(jobs.map((j) => j.cwd).sort());
    await exec.kill("SIGKILL");
    await waitFor("the killed execserver's job directories to be gone", () => jobDirsUnder(tmp).length === 0, 5_000);
    await waitFor("its jobs to be gone", async () => (await alive(jobs)).length === 0, 2_000);
  });

  it("issue 28 finding 2: an execserver that starts removes the job directories an earlier instance of itself left", async () => {
    const ledger = join(dir, "ledger");
    const exec = await start("exec-dirs", ledger);
    const jobs = await hold(exec, ledger, 2);
    await killWithReaper(exec);
    expect(jobDirsUnder(tmp), "left behind (nothing removed them)").to.deep.equal(jobs.map((j) => j.cwd).sort());
    await exec.restart();
    // Its banner says it serves: by then the directories (and their jobs) are gone.
    expect(jobDirsUnder(tmp)).to.deep.equal([]);
    expect(await alive(jobs)).to.deep.equal([]);
    expect(exec.stderr()).to.contain("removed what an execserver that is gone left");
  });

  it("issue 28 finding 2: two execservers on one host, or one config started twice, never remove each other's live job directories nor kill each other's jobs", async () => {
    const ledgerA = join(dir, "ledger-a");
    const ledgerB = join(dir, "ledger-b");
    const a = await start("exec-a", ledgerA);
    const b = await start("exec-b", ledgerB);
    const jobsA = await hold(a, ledgerA, 2);
    const jobsB = await hold(b, ledgerB, 2);
    expect(jobDirsUnder(tmp)).to.have.length(4);
    const processesA = await alive(jobsA);

    // B dies with its reaper and starts again: it removes its own leftovers, not A's.
    await killWithReaper(b);
    await b.restart();
    // A second execserver of A's very config on other ports, and one on A's own ports
    // (it fails to bind), each look for leftovers as they start.
    const twin = await spawnExecserver(config("exec-a", ledgerA), { env: { TMPDIR: tmp } });
    execs.push(twin);
    const clash = spawn(process.execPath, slotbrokerArgs(["execserver", "--config", a.configPath]), {
      cwd: root,
      env: { ...process.env, TMPDIR: tmp, SLOTBROKER_LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let clashErr = "";
    clash.stderr.setEncoding("utf8").on("data", (s: string) => (clashErr += s));
    const clashCode = await new Promise<number | null>((resolve) => clash.once("exit", resolve));
    expect(clashCode, clashErr).to.equal(1);
    expect(clashErr).to.contain("EADDRINUSE");

    expect(jobDirsUnder(tmp), "A's live job directories, and nothing of B's dead instance").to.deep.equal(jobsA.map((j) => j.cwd).sort());
    expect(await alive(jobsA), "A's jobs (leaders and children) still run").to.have.members(processesA);
    expect(await alive(jobsB), "B's orphans").to.deep.equal([]);
    for (const j of jobsA) expect(existsSync(j.cwd), j.cwd).to.equal(true);
    // And A's own reaper still cleans up after A.
    await a.kill("SIGKILL");
    await waitFor("A's job directories to go with A", () => jobDirsUnder(tmp).length === 0, 5_000);
  });
});
