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
  const rows = readdirSync(dir).map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")) as { file: string; ms: number });
  rmSync(dir, { recursive: true, force: true });
  if (rows.length < 2) return;
  rows.sort((a, b) => b.ms - a.ms);
  const lines = rows.slice(0, 10).map((r) => `  ${(r.ms / 1000).toFixed(1).padStart(6)} s  ${r.file}`);
  process.stdout.write(`\n  slowest files (of ${rows.length}, wall time each):\n${lines.join("\n")}\n`);
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
  writeFileSync(join(dir, `${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}.json`), JSON.stringify({ file: relative(projectRoot, file), ms: Date.now() - fileStartedAt }));
}
