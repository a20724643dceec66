// Finding 3 of the trust review, with real processes: a SIGKILLed execserver must take
// its running jobs with it, so the fylr's retry elsewhere is not a second run that
// overlaps a first one nobody stops any more. However it dies: alone, with its whole
// process group (`kill -9 -- -PGID`, as supervisord's killasgroup or a shell does), on a
// hang-up, or together with its reaper (then the next execserver to start cleans up).
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";
import { jobDirsUnder } from "../../harness/job-dirs.js";
import { createTestDatabase } from "../support/postgres.js";
import { livingMembers } from "../support/process-group.js";
import { processesWhere, reaperOf } from "../support/process-liveness.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "../integration/support.js";

function lines(path: string): string[] {
  try {
    return readFileSync(path, "utf8").split("\n").filter(Boolean);
  } catch {
    return [];
  }
}

// A zombie (killed, not yet reaped by whoever inherited it) counts as gone.
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

// Job groups a test saw, killed after it: a failing test must not leave its orphans running.
const seenGroups = new Set<number>();

/** Every process of the given jobs' groups that still lives (zombies count as gone). */
async function survivors(pgids: readonly number[]): Promise<number[]> {
  for (const g of pgids) seenGroups.add(g);
  return (await Promise.all(pgids.map((g) => livingMembers(g)))).flat();
}

/**
 * Samples the job processes whose command line holds `marker` until stopped: the most that
 * ran at once, and every moment one item (its job's last argument) ran twice at once. Only
 * a job's leader counts (it leads a session of its own), not the shells it forks.
 */
class JobSampler {
  most = 0;
  readonly twice: string[] = [];
  #stopped = false;
  readonly #done: Promise<void>;

  constructor(marker: string) {
    this.#done = this.#loop(marker);
  }

  async #loop(marker: string): Promise<void> {
    while (!this.#stopped) {
      const leaders = (await processesWhere((cmdline) => cmdline.includes(marker))).filter((p) => p.pid === p.sid);
      this.most = Math.max(this.most, leaders.length);
      const items = leaders.map((p) => p.cmdline.split(" ").at(-1)!);
      for (const item of new Set(items)) {
        const pids = leaders.filter((p) => p.cmdline.split(" ").at(-1) === item).map((p) => p.pid);
        if (pids.length > 1) this.twice.push(`item ${item}: pids ${pids.join(", ")}`);
      }
      await new Promise((r) => setTimeout(r, 40));
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#done;
  }
}

describe("reliability: a job never outlives its execserver", () => {
  let databaseUrl: string;
  let pool: pg.Pool;
  let dir: string;
  let execs: ExecserverProcess[] = [];
  let fylr: FylrProcess | undefined;
  let replica: FylrReplica | undefined;

  before(async () => {
    databaseUrl = await createTestDatabase("orphan_jobs");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
    dir = mkdtempSync(join(tmpdir(), "slotbroker-ledger-"));
  });
  afterEach(async () => {
    for (const g of seenGroups) {
      try {
        process.kill(-g, "SIGKILL");
      } catch {
        // gone, as it should be
      }
    }
    seenGroups.clear();
    await stopReplica(replica);
    replica = undefined;
    await closeAll(fylr, ...execs, pool);
    fylr = undefined;
    execs = [];
    rmSync(dir, { recursive: true, force: true });
  });

  it("finding 3: SIGKILL of an execserver kills its running jobs (and their children) at once; the retry elsewhere runs alone", async function () {
    this.timeout(120_000);
    const started = join(dir, "started");
    const finished = join(dir, "finished");
    // Each run records its pid and the pid of a background child in the same group.
    const script = `sleep 30 & echo "$$ $!" >> ${started}; sleep 3; echo "$$" >> ${finished}; kill $! 2>/dev/null`;
    const services = { ledger: { waitgroup: "w", command: ["sh", "-c", script] } };
    const victim = await spawnExecserver({ instanceId: "exec-victim", waitgroups: { w: { processes: 4 } }, services });
    execs.push(victim);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [victim.grpcAddress]), "f-orphans");
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await fylr.client.submit({ calls: [{ service: "ledger", args: [String(i)] }], maxAttempts: 3 })).item!.id);
    await waitFor("4 jobs running on the victim", () => lines(started).length >= 4, 30_000);
    const firstRuns = lines(started).map((l) => l.split(" ").map(Number));
    const killedAt = Date.now();
    await victim.kill("SIGKILL");
    await waitFor(
      "every job of the killed execserver (and its background child) to be gone",
      () => firstRuns.every((pids) => pids.every((pid) => !alive(pid))),
      2_000,
      20,
    );
    const gone = Date.now() - killedAt;
    // A survivor takes the retries; the killed runs never finish.
    const survivor = await spawnExecserver({ instanceId: "exec-survivor", waitgroups: { w: { processes: 4 } }, services });
    execs.push(survivor);
    const next = await spawnFylr(fastFylrConfig(databaseUrl, [survivor.grpcAddress]), "f-survivor");
    const first = fylr;
    fylr = next;
    await closeAll(first);
    await waitFor(
      "every item to succeed on the survivor",
      async () => (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state = 'succeeded'")).rows[0]!.n === 4,
      60_000,
      200,
    );
    const killedPids = new Set(firstRuns.map((pids) => pids[0]));
    const finishedPids = lines(finished).map(Number);
    expect(finishedPids.filter((pid) => killedPids.has(pid)), `finished runs of the killed execserver (gone after ${gone} ms)`).to.deep.equal([]);
    expect(finishedPids).to.have.length(4);
    for (const id of ids) expect((await next.client.get({ id })).item!.state).to.equal(ItemState.SUCCEEDED);
  });

  it("issue 23 finding 3: kill -9 of the execserver's whole process group kills its jobs; restarted, it runs the retries alone and never more jobs than slots", async function () {
    this.timeout(120_000);
    const slots = 3;
    const ledger = join(dir, "ledger");
    // A run records its item ($1) and pid and keeps a background child in its group. The
    // first run of an item would take 30 s, so an orphan would surely still run beside the
    // retry; a retry takes 2 s.
    const script =
      `if mkdir ${dir}/ran-$1 2>/dev/null; then t=30; else t=2; fi; ` +
      `echo "start $1 $$" >> ${ledger}; sleep 60 & sleep $t; echo "end $1 $$" >> ${ledger}; kill $! 2>/dev/null`;
    const services = { ledger: { waitgroup: "w", command: ["sh", "-c", script, "job"] } };
    const tmp = join(dir, "tmp");
    mkdirSync(tmp);
    const victim = await spawnExecserver(
      { instanceId: "exec-group", waitgroups: { w: { processes: slots } }, services },
      { ownGroup: true, env: { TMPDIR: tmp } },
    );
    execs.push(victim);
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [victim.grpcAddress]), "f-group");
    for (let i = 0; i < slots; i++) await fylr.client.submit({ calls: [{ service: "ledger", args: [String(i)] }], maxAttempts: 3 });
    await waitFor(`${slots} jobs running`, () => lines(ledger).filter((l) => l.startsWith("start")).length >= slots, 30_000);
    const firstRuns = lines(ledger).map((l) => Number(l.split(" ")[2]));
    const sampler = new JobSampler(ledger);
    try {
      const killedAt = Date.now();
      await victim.killGroup("SIGKILL");
      let left = await survivors(firstRuns);
      while (left.length > 0 && Date.now() - killedAt < 2_000) {
        await new Promise((r) => setTimeout(r, 20));
        left = await survivors(firstRuns);
      }
      const goneAfterMs = Date.now() - killedAt;
      // Restarted on the same ports, as a supervisor does; the fylr retries there.
      await victim.restart();
      await waitFor(
        "every item to succeed on the restarted execserver",
        async () => (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items WHERE state = 'succeeded'")).rows[0]!.n === slots,
        90_000,
        200,
      );
      await sampler.stop();
      const ended = lines(ledger)
        .filter((l) => l.startsWith("end"))
        .map((l) => Number(l.split(" ")[2]));
      expect({
        survivorsOfTheGroupKill: left,
        finishedRunsOfTheKilledExecserver: ended.filter((pid) => firstRuns.includes(pid)),
        itemsRunningTwiceAtOnce: sampler.twice.slice(0, 5),
        mostJobsAtOnceAboveSlots: Math.max(0, sampler.most - slots),
      }, `after kill -9 -- -PGID (checked for ${goneAfterMs} ms)`).to.deep.equal({
        survivorsOfTheGroupKill: [],
        finishedRunsOfTheKilledExecserver: [],
        itemsRunningTwiceAtOnce: [],
        mostJobsAtOnceAboveSlots: 0,
      });
      expect(sampler.most, "the sampler saw the jobs").to.be.at.least(1);
      expect(ended).to.have.length(slots);
    } finally {
      await sampler.stop();
    }
  });

  describe("with a broker client instead of a fylr", () => {
    const holdScript = (ledger: string): string => `echo "start $1 $$" >> ${ledger}; sleep 60 & sleep 60`;

    async function holdJobs(exec: ExecserverProcess, ledger: string, n: number): Promise<number[]> {
      replica = await startReplica({ addresses: [exec.grpcAddress], connectTimeout: "30s" }, "holder");
      for (let i = 0; i < n; i++) void replica.exec.run({ service: "hold", args: [String(i)] }).catch(() => undefined);
      await waitFor(`${n} jobs running`, () => lines(ledger).length >= n, 30_000);
      return lines(ledger).map((l) => Number(l.split(" ")[2]));
    }

    for (const jobLauncher of [false, true]) {
      it(`issue 23 finding 3: a hang-up (SIGHUP to the execserver's process group) or kill -9 -- -PGID kills its jobs${jobLauncher ? " (jobLauncher: true)" : ""}`, async function () {
        this.timeout(90_000);
        for (const signal of ["SIGHUP", "SIGKILL"] as const) {
          const ledger = join(dir, `ledger-${signal}`);
          const exec = await spawnExecserver(
            { instanceId: `exec-${signal}`, jobLauncher, waitgroups: { w: { processes: 2 } }, services: { hold: { waitgroup: "w", command: ["sh", "-c", holdScript(ledger), "hold"] } } },
            { ownGroup: true, env: { TMPDIR: dir } },
          );
          execs.push(exec);
          const jobs = await holdJobs(exec, ledger, 2);
          await exec.killGroup(signal);
          let left = await survivors(jobs);
          for (let i = 0; i < 100 && left.length > 0; i++) {
            await new Promise((r) => setTimeout(r, 20));
            left = await survivors(jobs);
          }
          expect(left, `processes of the jobs left 2 s after ${signal} to the group`).to.deep.equal([]);
          await stopReplica(replica);
          replica = undefined;
        }
      });
    }

    it("issue 23 finding 3: what a job started in a session of its own goes with the execserver too, while it works in the job's directory", async function () {
      this.timeout(60_000);
      const ledger = join(dir, "ledger");
      // `setsid` takes the background sleep out of the job's process group and session.
      const script = `setsid sleep 60 & echo "start $1 $$ $!" >> ${ledger}; sleep 60`;
      const exec = await spawnExecserver(
        { instanceId: "exec-escape", waitgroups: { w: { processes: 2 } }, services: { hold: { waitgroup: "w", command: ["sh", "-c", script, "hold"] } } },
        { ownGroup: true, env: { TMPDIR: dir } },
      );
      execs.push(exec);
      await holdJobs(exec, ledger, 1);
      const [, , leader, escaped] = lines(ledger)[0]!.split(" ").map(Number);
      await waitFor("the escaped process to lead a session of its own", async () => (await processesWhere(() => true)).find((p) => p.pid === escaped)?.sid === escaped);
      seenGroups.add(escaped!);
      await exec.killGroup("SIGKILL");
      await waitFor("the job and the process it set apart to be gone", async () => (await survivors([leader!, escaped!])).length === 0, 2_000, 20);
    });

    it("issue 23 finding 3: a reaper killed by hand is replaced at once while jobs run, so the jobs still die with their execserver", async function () {
      this.timeout(60_000);
      const ledger = join(dir, "ledger");
      const exec = await spawnExecserver(
        { instanceId: "exec-rereap", waitgroups: { w: { processes: 2 } }, services: { hold: { waitgroup: "w", command: ["sh", "-c", holdScript(ledger), "hold"] } } },
        { env: { TMPDIR: dir } },
      );
      execs.push(exec);
      const jobs = await holdJobs(exec, ledger, 2);
      const first = await reaperOf(exec.child.pid!);
      expect(first, "the execserver's reaper").to.not.equal(undefined);
      // One that dies within a second of its start waits for the next job (it would die again).
      await new Promise((r) => setTimeout(r, 1_100));
      process.kill(first!.pid, "SIGKILL");
      const second = await waitFor("a new reaper", async () => {
        const r = await reaperOf(exec.child.pid!);
        return r && r.pid !== first!.pid ? r : undefined;
      });
      expect(second.sid, "in a session of its own").to.equal(second.pid);
      await exec.kill("SIGKILL");
      await waitFor("the jobs to be gone", async () => (await survivors(jobs)).length === 0, 2_000, 20);
    });

    it("issue 23 finding 3 (defence in depth): an execserver that starts kills the jobs an earlier instance left when its reaper died too, before it offers a slot", async function () {
      this.timeout(90_000);
      const ledger = join(dir, "ledger");
      const tmp = join(dir, "tmp");
      mkdirSync(tmp);
      // It forks its jobs itself: a job launcher would kill them once the execserver is gone.
      const exec = await spawnExecserver(
        { instanceId: "exec-sweep", jobLauncher: false, waitgroups: { w: { processes: 2 } }, services: { hold: { waitgroup: "w", command: ["sh", "-c", holdScript(ledger), "hold"] } } },
        { env: { TMPDIR: tmp } },
      );
      execs.push(exec);
      const jobs = await holdJobs(exec, ledger, 2);
      const dirs = jobDirsUnder(tmp);
      expect(dirs).to.have.length(2);
      // The reaper dies with its execserver (stopped first, so it cannot act on the EOF).
      const reaper = await reaperOf(exec.child.pid!);
      expect(reaper, "the execserver's reaper").to.not.equal(undefined);
      process.kill(reaper!.pid, "SIGSTOP");
      await exec.kill("SIGKILL");
      process.kill(reaper!.pid, "SIGKILL");
      await waitFor("the reaper to be gone", async () => (await processesWhere((c) => c.includes("slotbroker-job-reaper"))).every((p) => p.pid !== reaper!.pid));
      expect(await survivors(jobs), "the orphans (nothing killed them yet)").to.have.length.above(0);
      await stopReplica(replica);
      replica = undefined;
      // Its banner says it serves: by then the orphans must be gone and their directories too.
      await exec.restart();
      expect(await survivors(jobs), "processes of the earlier instance's jobs once the new one serves").to.deep.equal([]);
      expect(jobDirsUnder(tmp).filter((d) => dirs.includes(d)), "the earlier instance's job directories").to.deep.equal([]);
    });
  });
});
