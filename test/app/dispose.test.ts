import { expect } from "chai";
import { startExecserver } from "../../src/app/execserver.js";
import { startFylr, type FylrHandle } from "../../src/app/fylr.js";
import { compileFylrConfig } from "../../src/app/fylr-config.js";
import { compileExecserverConfig } from "../../src/execserver/index.js";
import { CleanupError, CleanupStack } from "../../src/shared/cleanup.js";
import { fastFylrConfig } from "../integration/support.js";
import { createTestDatabase } from "../support/postgres.js";

describe("disposal", function () {
  this.timeout(60_000);

  it("a cleanup stack runs every step, last first, and names every step that failed", async () => {
    const ran: string[] = [];
    const stack = new CleanupStack("test stack");
    stack.defer("pool", () => ran.push("pool"));
    stack.defer("broker", () => {
      ran.push("broker");
      throw new Error("broker stuck");
    });
    stack.defer("port", () => Promise.reject(new Error("port busy")).finally(() => ran.push("port")));
    stack.defer("dispatcher", () => ran.push("dispatcher"));
    const err = await stack.run().then(
      () => expect.fail("should reject"),
      (e: unknown) => e,
    );
    expect(ran).to.deep.equal(["dispatcher", "port", "broker", "pool"]);
    expect(err).to.be.instanceOf(CleanupError);
    expect((err as CleanupError).failures.map((f) => f.step)).to.deep.equal(["port", "broker"]);
    expect((err as Error).message).to.equal("test stack: 2 cleanup steps failed: port: port busy; broker: broker stuck");
    // Idempotent: the same outcome, nothing runs twice.
    await stack.run().catch(() => undefined);
    expect(ran).to.have.lengthOf(4);
    expect(() => stack.defer("late", () => undefined)).to.throw(/already ran/);
  });

  it("startExecserver and startFylr handles stop at the end of an `await using` block", async () => {
    const databaseUrl = await createTestDatabase("dispose");
    const execConfig = compileExecserverConfig(
      {
        instanceId: "dispose",
        listen: "127.0.0.1:0",
        adminListen: "127.0.0.1:0",
        waitgroups: { w: { processes: 1 } },
        services: { noop: { waitgroup: "w", builtin: "noop" } },
      },
      "test",
    );
    let seen: { exec: { state: string }; fylr: FylrHandle } | undefined;
    {
      await using exec = await startExecserver(execConfig);
      await using fylr = await startFylr(compileFylrConfig(fastFylrConfig(databaseUrl, [exec.grpcAddress]), "test"));
      seen = { exec, fylr };
      expect([exec.state, fylr.state]).to.deep.equal(["serving", "running"]);
      expect((await fetch(`${fylr.url}/healthz`)).status).to.equal(200);
    }
    // Disposed in reverse: the fylr first, then the execserver.
    expect(seen.fylr.state).to.equal("stopped");
    expect(seen.fylr.dispatcher.state).to.equal("stopped");
    expect(seen.exec.state).to.equal("stopped");
    await fetch(`${seen.fylr.url}/healthz`).then(
      () => expect.fail("the fylr's port should be closed"),
      (e: unknown) => expect(e).to.be.instanceOf(Error),
    );
  });
});
