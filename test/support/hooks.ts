import type { Context } from "mocha";
import { stopTestPostgres } from "./postgres.js";
import { beginTest, endRun, endTest } from "./resources.js";

process.env.SLOTBROKER_LOG_LEVEL ??= "silent";

/** Mocha root hooks: leak checks around every test, and the shared Postgres. */
export const mochaHooks = {
  beforeEach(this: Context): void {
    beginTest(this.currentTest?.fullTitle() ?? "");
  },
  async afterEach(this: Context): Promise<void> {
    const leaked = await endTest(this.currentTest?.fullTitle() ?? "");
    if (leaked.length > 0) throw new Error(`test left running: ${leaked.join(", ")}`);
  },
  async afterAll(): Promise<void> {
    const leaked = await endRun();
    await stopTestPostgres();
    if (leaked.length > 0) throw new Error(`left running at the end of the run: ${leaked.join(", ")}`);
  },
};
