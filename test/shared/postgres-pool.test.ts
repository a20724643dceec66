// A Postgres restart sends every backend "terminating connection due to administrator
// command" (57P01). pg emits it as an 'error' event on the client, and Node ends a process
// on an 'error' event nobody listens to. The soak saw a fylr exit that way once in about 40
// restarts: a client checked out of the pool, between queries, has no listener of the pool's.
import { expect } from "chai";
import pg from "pg";
import { createPgPool } from "../../src/shared/postgres.js";
import { awaitCondition, emitterOf } from "../support/event-monitor.js";
import { createTestDatabase } from "../support/postgres.js";

describe("createPgPool", function () {
  this.timeout(60_000);
  let url: string;
  before(async () => {
    url = await createTestDatabase("pgpool");
  });

  async function terminate(pid: number): Promise<void> {
    const admin = new pg.Client(url);
    await admin.connect();
    try {
      await admin.query("select pg_terminate_backend($1)", [pid]);
    } finally {
      await admin.end();
    }
  }

  it("a checked-out client between queries survives its backend being terminated, and the pool serves on", async () => {
    const pool = createPgPool({ connectionString: url, max: 2 });
    const uncaught: Error[] = [];
    const onUncaught = (err: Error): void => void uncaught.push(err);
    // mocha's own handler would fail the test too; this one names the cause.
    process.prependListener("uncaughtException", onUncaught);
    try {
      const held = await pool.connect();
      const pid = (await held.query<{ pid: number }>("select pg_backend_pid() as pid")).rows[0]!.pid;
      const errors: Error[] = [];
      // What a caller would see: the next query on the broken client fails.
      // Not events.once: it would listen for 'error' itself and hide the crash.
      const ended = new Promise<void>((resolve) => held.on("end", () => resolve()));
      await terminate(pid);
      await ended;
      await held.query("select 1").catch((err: Error) => errors.push(err));
      held.release(true);
      expect(uncaught.map((e) => e.message)).to.deep.equal([]);
      expect(errors).to.have.length(1);
      expect((await pool.query<{ one: number }>("select 1 as one")).rows[0]!.one).to.equal(1);
    } finally {
      process.removeListener("uncaughtException", onUncaught);
      await pool.end();
    }
  });

  it("an idle client's termination goes to the pool's error callback, not to the process", async () => {
    const idleErrors: string[] = [];
    const pool = createPgPool({ connectionString: url, max: 1 }, (err) => idleErrors.push(err.message));
    try {
      const pid = (await pool.query<{ pid: number }>("select pg_backend_pid() as pid")).rows[0]!.pid;
      await terminate(pid);
      await awaitCondition("the pool to report its idle client's error", [emitterOf(pool, "error")], () => idleErrors.length > 0, 10_000);
      expect(idleErrors[0]).to.match(/terminating connection due to administrator command/);
      expect((await pool.query<{ one: number }>("select 1 as one")).rows[0]!.one).to.equal(1);
    } finally {
      await pool.end();
    }
  });
});
