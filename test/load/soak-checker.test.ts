// The chaos soak's checker (load/soak/checker.ts) on hand-made runs: an extra execution is
// accepted only with a concrete reason — a fault that hit that run's fylr, execserver or
// broker path, bounded in time — and a job that ended without a trace needs the
// execserver's word (or its death) for how.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import { check, type CheckInput, type ExecOutcome } from "../../load/soak/checker.js";
import type { FaultEvent } from "../../load/soak/driver.js";
import { jobDirsUnder } from "../../harness/job-dirs.js";

const T = 1_000_000;
const EXEC_A = 500; // execserver-0 behind proxy-0
const EXEC_B = 600; // execserver-2 behind proxy-1
const item = { tag: "it-1", mode: "long" as const, param: "5", maxAttempts: 8 };

function run(
  ledger: string[],
  o: { faults?: FaultEvent[]; deaths?: [number, number][]; gone?: [string, number][]; outcomes?: [number, ExecOutcome[]][]; leftoverJobDirs?: string[] } = {},
): ReturnType<typeof check> {
  const input: CheckInput = {
    items: [item],
    rows: [{ tag: item.tag, state: "succeeded", attempts: 2, error: null }],
    completions: new Map([[item.tag, 1]]),
    ledger: ledger.join("\n"),
    faults: o.faults ?? [],
    execDeaths: new Map(o.deaths ?? []),
    execPaths: new Map([
      [EXEC_A, { name: "execserver-0", proxy: "proxy-0" }],
      [EXEC_B, { name: "execserver-2", proxy: "proxy-1" }],
    ]),
    gone: new Map(o.gone ?? []),
    outcomes: new Map(o.outcomes ?? []),
    crashes: [],
    leftovers: [],
    leftoverJobDirs: o.leftoverJobDirs ?? [],
  };
  return check(input);
}

const start = (pid: number, exec: number, at: number): string => `start it-1 ${pid} ${exec} ${T + at}`;
const end = (pid: number, exec: number, at: number, code = 0): string => `end it-1 ${pid} ${exec} ${T + at} ${code}`;
const fault = (kind: string, at: number, until: number, extra: Partial<FaultEvent> = {}): FaultEvent => ({ kind, at: T + at, until: T + until, target: "x", ...extra });

describe("soak checker", () => {
  it("explains two overlapping runs by a freeze of the first run's execserver, if the first ended soon after the thaw", () => {
    const ledger = [start(1, EXEC_A, 0), start(2, EXEC_B, 4_400), end(1, EXEC_A, 5_000, 143), end(2, EXEC_B, 9_000)];
    const frozen = fault("stop-execserver", 1_000, 4_900, { pid: EXEC_A });
    const ok = run(ledger, { faults: [frozen] });
    expect(ok.violations).to.deep.equal([]);
    expect(ok.report.join("\n")).to.contain("overlapping run: stop-execserver made its fylr give up on the stream");

    const otherExecserver = run(ledger, { faults: [{ ...frozen, pid: EXEC_B }] });
    expect(otherExecserver.violations).to.have.length(1);
    expect(otherExecserver.violations[0]).to.contain("which was still running").and.contain("no fault explains the overlap");

    const ranOnAfterThaw = run([start(1, EXEC_A, 0), start(2, EXEC_B, 4_400), end(1, EXEC_A, 12_000), end(2, EXEC_B, 9_000)], { faults: [frozen] });
    expect(ranOnAfterThaw.violations).to.have.length(1);
  });

  it("explains an overlap by a frozen broker path only for the proxy that carried the first run", () => {
    const ledger = [start(1, EXEC_B, 0), start(2, EXEC_A, 4_000), end(1, EXEC_B, 4_500, 143), end(2, EXEC_A, 9_000)];
    expect(run(ledger, { faults: [fault("freeze-broker", 500, 4_200, { target: "proxy-1" })] }).violations).to.deep.equal([]);
    expect(run(ledger, { faults: [fault("freeze-broker", 500, 4_200, { target: "proxy-0" })] }).violations).to.have.length(1);
  });

  it("needs the execserver's word for a job that ended without its end line while its execserver lived", () => {
    const ledger = [start(1, EXEC_A, 0), start(2, EXEC_B, 3_000), end(2, EXEC_B, 8_000)];
    const faults = [fault("sever-broker", 500, 500, { target: "proxy-0" })];
    const silent = run(ledger, { faults, gone: [["it-1 1", T + 2_600]] });
    expect(silent.violations.join("\n")).to.contain("ended without its end line while its execserver (pid 500) lived");

    const killed = run(ledger, { faults, gone: [["it-1 1", T + 2_600]], outcomes: [[1, [{ at: T + 2_550, signal: "SIGKILL", error: "CANCELLED" }]]] });
    expect(killed.violations).to.deep.equal([]);
    expect(killed.report.join("\n")).to.contain("its execserver SIGKILLed the job (CANCELLED)");
  });

  it("explains a job that died with its execserver only by a kill of that execserver, and flags one that outlived it", () => {
    const ledger = [start(1, EXEC_A, 0), start(2, EXEC_B, 2_000), end(2, EXEC_B, 8_000)];
    const kill = fault("kill-execserver", 1_000, 1_800, { pid: EXEC_A });
    expect(run(ledger, { faults: [kill], deaths: [[EXEC_A, T + 1_000]], gone: [["it-1 1", T + 1_050]] }).violations).to.deep.equal([]);
    const outlived = run(ledger, { faults: [kill], deaths: [[EXEC_A, T + 1_000]], gone: [["it-1 1", T + 5_000]] });
    expect(outlived.violations.join("\n")).to.contain("outlived its execserver");
  });

  it("flags a re-run no fault of that run's fylr, execserver or broker path explains", () => {
    const result = run([start(1, EXEC_A, 0), end(1, EXEC_A, 5_000), start(2, EXEC_B, 6_000), end(2, EXEC_B, 11_000)]);
    expect(result.violations).to.have.length(1);
    expect(result.violations[0]).to.contain("with no fault of its fylr, execserver or broker path to explain it");

    const stopped = [start(1, EXEC_A, 0), end(1, EXEC_A, 1_000, 143), start(2, EXEC_B, 1_300), end(2, EXEC_B, 6_000)];
    const elsewhere = run(stopped, { faults: [fault("kill-execserver", 900, 1_200, { pid: EXEC_B })] });
    expect(elsewhere.violations).to.have.length(1);
    const severed = run(stopped, { faults: [fault("sever-broker", 950, 950, { target: "proxy-0 (3 connections)" })] });
    expect(severed.violations).to.deep.equal([]);
    expect(severed.report.join("\n")).to.contain("rescued after sever-broker=1");
  });

  it("counts every job directory left in the execservers' temp directory as left over", () => {
    const tmp = mkdtempSync(join(tmpdir(), "slotbroker-soak-check-"));
    try {
      // As execservers leave them: a live one's (empty) directory, a dead one's job directory.
      mkdirSync(join(tmp, "slotbroker-jobs-1-aaaaaa"));
      mkdirSync(join(tmp, "slotbroker-jobs-2-bbbbbb", "slotbroker-job-cccccc"), { recursive: true });
      const ledger = [start(1, EXEC_A, 0), end(1, EXEC_A, 1_000)];
      expect(run(ledger).violations).to.deep.equal([]);
      const left = run(ledger, { leftoverJobDirs: jobDirsUnder(tmp) });
      expect(left.violations).to.deep.equal([`left over: job directory ${join(tmp, "slotbroker-jobs-2-bbbbbb", "slotbroker-job-cccccc")}`]);
      expect(left.report).to.include("leftover job directories: 1");
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});
