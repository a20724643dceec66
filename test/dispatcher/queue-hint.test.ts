import { expect } from "chai";
import { QueueHint } from "../../src/dispatcher/claims/claim-pass.js";
import { Wakeup } from "../../src/dispatcher/claims/wakeup.js";

describe("QueueHint", () => {
  it("is open until a claim drained the queue", () => {
    const hint = new QueueHint();
    expect(hint.knownEmpty).to.equal(false);
    hint.sawEmpty(hint.begin());
    expect(hint.knownEmpty).to.equal(true);
  });

  it("opens again when something may have queued an item", () => {
    const hint = new QueueHint();
    hint.sawEmpty(hint.begin());
    hint.maybeQueued();
    expect(hint.knownEmpty).to.equal(false);
  });

  it("stays open when a notification came while the claim was in flight", () => {
    const hint = new QueueHint();
    const token = hint.begin();
    hint.maybeQueued(); // the claim's snapshot may predate this item
    hint.sawEmpty(token);
    expect(hint.knownEmpty).to.equal(false);
    hint.sawEmpty(hint.begin());
    expect(hint.knownEmpty).to.equal(true);
  });
});

describe("the claim loop's Wakeup", () => {
  it("polls after its interval each wait, wakes on a notify (kept when nobody waits), and rejects on abort", async () => {
    const wakeup = new Wakeup();
    const controller = new AbortController();
    const t0 = performance.now();
    expect(await wakeup.wait(30, controller.signal)).to.equal("poll");
    expect(performance.now() - t0).to.be.at.least(29);
    // The timer is re-armed by each wait: a wait after a notify still lasts its full interval.
    setTimeout(() => wakeup.notify("finished"), 5);
    expect(await wakeup.wait(30, controller.signal)).to.equal("finished");
    const t1 = performance.now();
    expect(await wakeup.wait(40, controller.signal)).to.equal("poll");
    expect(performance.now() - t1).to.be.at.least(39);
    wakeup.notify("submit");
    wakeup.notify("backlog");
    expect(await wakeup.wait(10_000, controller.signal)).to.equal("submit");
    wakeup.notify("submit");
    wakeup.clear();
    const waiting = wakeup.wait(10_000, controller.signal);
    controller.abort(new Error("stopped"));
    await waiting.then(
      () => expect.fail("resolved"),
      (err: unknown) => expect((err as Error).message).to.equal("stopped"),
    );
    await wakeup.wait(10, controller.signal).then(
      () => expect.fail("resolved"),
      (err: unknown) => expect((err as Error).message).to.equal("stopped"),
    );
    // Another signal is watched on its own.
    expect(await wakeup.wait(5, new AbortController().signal)).to.equal("poll");
  });
});
