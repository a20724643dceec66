import { expect } from "chai";
import { LocalQueueHint } from "../../src/dispatcher/local-queue-hint.js";

describe("LocalQueueHint", () => {
  it("is open until a local claim found nothing", () => {
    const hint = new LocalQueueHint();
    expect(hint.knownEmpty).to.equal(false);
    hint.sawEmpty(hint.begin());
    expect(hint.knownEmpty).to.equal(true);
  });

  it("opens again when something may have queued a local item", () => {
    const hint = new LocalQueueHint();
    hint.sawEmpty(hint.begin());
    hint.maybeQueued();
    expect(hint.knownEmpty).to.equal(false);
  });

  it("stays open when a notification came while the claim was in flight", () => {
    const hint = new LocalQueueHint();
    const token = hint.begin();
    hint.maybeQueued(); // the claim's snapshot may predate this item
    hint.sawEmpty(token);
    expect(hint.knownEmpty).to.equal(false);
    hint.sawEmpty(hint.begin());
    expect(hint.knownEmpty).to.equal(true);
  });
});
