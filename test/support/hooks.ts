import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import type { Context, Hook } from "mocha";
import { buildChildren, projectRoot, removeBuild } from "../../harness/node-children.js";
import { startSharedTestPostgres, stopTestPostgres } from "./postgres.js";
import { beginTest, endRun, endTest } from "../../harness/resources.js";

process.env.SLOTBROKER_LOG_LEVEL ??= "silent";

const TIMING_ENV = "SLOTBROKER_TEST_TIMINGS";
let fileStartedAt = 0;
let fileCpuAtStart = 0;

/**
 * CPU seconds of this worker and of the children it has reaped (fylrs, execservers, CLIs,
 * jobs): what a file costs on a machine where the files run side by side. The shared
 * Postgres is not in it.
 */
function cpuSeconds(): number {
  try {
    const fields = readFileSync("/proc/self/stat", "utf8").split(") ")[1]!.split(" ");
    // utime, stime, cutime, cstime: fields 14-17 of stat(5), in clock ticks (100 a second).
    return (Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])) / 100;
  } catch {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  }
}

/**
 * Once per run, in mocha's main process before any worker starts: one build of the
 * children's JavaScript and one PostgreSQL server, both handed to the workers through the
 * environment (see harness/node-children.ts and ./postgres.ts).
 */
export async function mochaGlobalSetup(): Promise<void> {
  process.env[TIMING_ENV] = mkdtempSync(join(tmpdir(), "slotbroker-test-timings-"));
  await buildChildren();
  await startSharedTestPostgres();
}

/** Stops what the setup started and prints the slowest files of the run. */
export async function mochaGlobalTeardown(): Promise<void> {
  await stopTestPostgres();
  removeBuild();
  const dir = process.env[TIMING_ENV];
  if (!dir) return;
  const rows = readdirSync(dir).map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")) as { file: string; ms: number; cpu: number });
  rmSync(dir, { recursive: true, force: true });
  if (rows.length < 2) return;
  const line = (r: { file: string; ms: number; cpu: number }): string => `  ${(r.ms / 1000).toFixed(1).padStart(6)} s  ${r.cpu.toFixed(1).padStart(6)} s  ${r.file}`;
  const slowest = [...rows].sort((a, b) => b.ms - a.ms).slice(0, 10);
  // The files run side by side on few cores: the run's length follows the CPU they take.
  const costliest = [...rows].sort((a, b) => b.cpu - a.cpu).slice(0, 10);
  const total = rows.reduce((sum, r) => sum + r.cpu, 0);
  process.stdout.write(
    `\n  slowest files (of ${rows.length}; wall, CPU with children):\n${slowest.map(line).join("\n")}\n` +
      `\n  costliest files (CPU with children; ${total.toFixed(0)} s over all files):\n${costliest.map(line).join("\n")}\n`,
  );
}

/**
 * Mocha root hooks: leak checks around every test, and each file's duration.
 *
 * A leak fails the test that left it, never the hook: mocha stops running the rest of the
 * suite (here: of the whole run) after a failed afterEach hook. Hook#error hands the error
 * to that test instead (mocha calls runner.fail(test, err) and carries on). The spec
 * reporter has already printed the test as passed, so it shows up twice: ✔, then as a
 * numbered failure; the run fails.
 *
 * In parallel mode (the default, see .mocharc.json) a worker runs one file at a time and
 * the root beforeAll/afterAll hooks bracket that file.
 */
export const mochaHooks = {
  beforeAll(): void {
    fileStartedAt = Date.now();
    fileCpuAtStart = cpuSeconds();
  },
  beforeEach(this: Context): void {
    beginTest(this.currentTest?.fullTitle() ?? "");
  },
  async afterEach(this: Context): Promise<void> {
    const leaked = await endTest(this.currentTest?.fullTitle() ?? "");
    if (leaked.length === 0) return;
    (this.runnable() as Hook).error(new Error(`test left running: ${leaked.join(", ")} (closed now; the next tests are unaffected)`));
  },
  async afterAll(this: Context): Promise<void> {
    const leaked = await endRun();
    await stopTestPostgres();
    recordFileTime(this);
    if (leaked.length > 0) throw new Error(`left running at the end of the file: ${leaked.join(", ")}`);
  },
};

function recordFileTime(context: Context): void {
  const dir = process.env[TIMING_ENV];
  const file = context.test?.parent?.suites[0]?.file;
  if (!dir || !file) return;
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, `${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}.json`), JSON.stringify({ file: relative(projectRoot, file), ms: Date.now() - fileStartedAt, cpu: cpuSeconds() - fileCpuAtStart }));
}
