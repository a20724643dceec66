import { expect } from "chai";
import { QueueHint } from "../../src/dispatcher/claims/claim-pass.js";

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
