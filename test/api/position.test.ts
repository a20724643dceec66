// The position merge, pure: database count, the execserver's POSITION, its load, ETA.
import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { PositionSchema, PositionState } from "../../gen/slotbroker/v1/broker_pb.js";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { buildPosition, estimateMs, formatMs, RuntimeMeans, summaryWithoutTimes, type PositionFacts } from "../../src/api/index.js";
import type { LiveItem } from "../../src/dispatcher/index.js";
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";

const now = new Date("2030-01-01T12:00:00Z");
const base: PositionFacts = {
  state: "queued",
  kind: "exec",
  service: "ffmpeg",
  startAfter: now,
  aheadInQueue: 0,
  claimedBy: undefined,
  error: undefined,
  live: undefined,
  load: undefined,
  local: undefined,
  meanRuntimeMs: undefined,
  now,
};

function live(patch: Partial<LiveItem>): LiveItem {
  return { id: "i", kind: "exec", priority: 0, lease: 1, phase: "waiting", callIndex: 0, callCount: 1, service: "ffmpeg", instanceId: undefined, position: undefined, claimedAt: now, phaseSince: now, ...patch };
}

describe("queue position", () => {
  it("reads '3 running, 7 waiting - you are number 11' for a want parked at the execserver", () => {
    const position = create(PositionSchema, { state: PositionState.PARKED, running: 3, ahead: 7, capacity: 4, eta: durationFromMs(40_000) });
    const p = buildPosition({ ...base, state: "claimed", live: live({ position }) });
    expect(p.summary).to.equal("3 running, 7 waiting - you are number 11, about 40s");
    expect([p.state, p.running, p.capacity, p.ahead, p.aheadAtExecserver, p.aheadInQueue]).to.deep.equal([ItemState.CLAIMED, 3, 4, 7, 7, 0]);
    expect(durationMs(p.eta!)).to.equal(40_000);
  });

  it("adds the execserver's whole book to the queue ahead of an item not parked yet", () => {
    const p = buildPosition({ ...base, aheadInQueue: 5, load: { running: 4, capacity: 4, waiting: 2, meanRuntimeMs: 10_000 } });
    expect([p.aheadInQueue, p.aheadAtExecserver, p.ahead]).to.deep.equal([5, 2, 7]);
    // No slot free: 7 ahead + this one, four at a time, a mean of 10 s each → 20 s.
    expect(durationMs(p.eta!)).to.equal(20_000);
    expect(p.summary).to.equal("4 running, 7 waiting - you are number 12, about 20s");
  });

  it("prefers this fylr's own mean runtime and says when the item may start", () => {
    const p = buildPosition({ ...base, startAfter: new Date(now.getTime() + 90_000), load: { running: 0, capacity: 2, waiting: 0, meanRuntimeMs: 1 }, meanRuntimeMs: 5000 });
    expect(durationMs(p.eta!)).to.equal(90_000);
    expect(p.summary).to.equal("not before 2030-01-01T12:01:30.000Z (in 1m 30s); 0 running, 0 waiting - you are number 1, about 1m 30s");
    expect(summaryWithoutTimes(p.summary)).to.equal("not before 2030-01-01T12:01:30.000Z; 0 running, 0 waiting - you are number 1");
  });

  it("describes running, claimed-elsewhere, finished and local items", () => {
    expect(buildPosition({ ...base, state: "running", live: live({ phase: "running", instanceId: "exec-1", callIndex: 1, callCount: 3 }) }).summary).to.equal(
      "running ffmpeg (call 2 of 3) on exec-1",
    );
    expect(buildPosition({ ...base, state: "claimed", claimedBy: "fylr-b" }).summary).to.equal("claimed by fylr fylr-b, waiting for a slot");
    expect(buildPosition({ ...base, state: "failed", error: "calls[0] (x): exited with code 1" }).summary).to.equal("failed: calls[0] (x): exited with code 1");
    const local = buildPosition({ ...base, kind: "local", service: "checksum", aheadInQueue: 2, local: { running: 4, capacity: 4 } });
    expect([local.running, local.capacity, local.ahead, local.aheadAtExecserver]).to.deep.equal([4, 4, 2, 0]);
  });

  it("estimates nothing without history and zero while a slot is free", () => {
    expect(estimateMs(3, 1, 4, undefined)).to.equal(undefined);
    expect(estimateMs(2, 1, 4, 1000)).to.equal(0);
    expect(estimateMs(3, 1, 4, 1000)).to.equal(250);
    expect([formatMs(850), formatMs(12_000), formatMs(150_000), formatMs(3_900_000)]).to.deep.equal(["850ms", "12s", "2m 30s", "1h 5m"]);
  });

  it("keeps a rolling mean per service over a window", () => {
    const means = new RuntimeMeans(3);
    expect(means.meanMs("x")).to.equal(undefined);
    for (const ms of [10, 20, 30, 40]) means.record("x", ms);
    expect(means.meanMs("x")).to.equal(30);
  });
});
