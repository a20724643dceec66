import type { Context, Hook } from "mocha";
import { stopTestPostgres } from "./postgres.js";
import { beginTest, endRun, endTest } from "./resources.js";

process.env.SLOTBROKER_LOG_LEVEL ??= "silent";

/**
 * Mocha root hooks: leak checks around every test, and the shared Postgres.
 *
 * A leak fails the test that left it, never the hook: mocha stops running the rest of the
 * suite (here: of the whole run) after a failed afterEach hook. Hook#error hands the error
 * to that test instead (mocha calls runner.fail(test, err) and carries on). The spec
 * reporter has already printed the test as passed, so it shows up twice: ✔, then as a
 * numbered failure; the run fails.
 */
export const mochaHooks = {
  beforeEach(this: Context): void {
    beginTest(this.currentTest?.fullTitle() ?? "");
  },
  async afterEach(this: Context): Promise<void> {
    const leaked = await endTest(this.currentTest?.fullTitle() ?? "");
    if (leaked.length === 0) return;
    (this.runnable() as Hook).error(new Error(`test left running: ${leaked.join(", ")} (closed now; the next tests are unaffected)`));
  },
  async afterAll(): Promise<void> {
    const leaked = await endRun();
    await stopTestPostgres();
    if (leaked.length > 0) throw new Error(`left running at the end of the run: ${leaked.join(", ")}`);
  },
};
