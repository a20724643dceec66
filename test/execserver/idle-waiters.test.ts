import { expect } from "chai";
import { IdleWaiters } from "../../src/execserver/idle-waiters.js";

describe("execserver idle waiters", () => {
  it("is idle at once when nothing runs", async () => {
    expect(await new IdleWaiters(() => 0).wait(10_000)).to.equal(true);
  });

  it("wakes when the last running job finishes, not before", async () => {
    let running = 2;
    const idle = new IdleWaiters(() => running);
    let result: boolean | undefined;
    const waiting = idle.wait(10_000).then((r) => (result = r));
    running = 1;
    idle.jobFinished();
    await Promise.resolve();
    expect(result).to.equal(undefined);
    running = 0;
    idle.jobFinished();
    expect(await waiting).to.equal(true);
  });

  it("gives up after the timeout", async () => {
    expect(await new IdleWaiters(() => 1).wait(10)).to.equal(false);
  });

  it("releaseAll wakes every waiter with whether anything still runs", async () => {
    const idle = new IdleWaiters(() => 1);
    const waits = [idle.wait(10_000), idle.wait(10_000)];
    idle.releaseAll();
    expect(await Promise.all(waits)).to.deep.equal([false, false]);
  });
});
