// Fairness on the execserver page is judged over recent grant rates, not counts since start-up.
import { expect } from "chai";
import { GrantWindow, jainIndex, type WindowConnection } from "../src/status-pages/index.js";

const hour = 3_600_000;

function conn(id: string, grants: number, ageMs: number, parked = 1): WindowConnection {
  return { id, grants, offers: grants, parked, ageMs };
}

describe("fairness over a recent window", () => {
  it("does not hold a newcomer's late start against a fair broker", () => {
    const window = new GrantWindow();
    const t0 = 10 * hour;
    // The incumbent has 36 000 grants from an hour alone; the newcomer joined a minute ago.
    // Since then both were granted 1 per second.
    expect(window.fairness(t0, [conn("old", 36_000, hour), conn("new", 0, 0)]).index).to.be.closeTo(1 / 2, 1e-9);
    for (let s = 5; s <= 60; s += 5) window.fairness(t0 + s * 1000, [conn("old", 36_000 + s, hour + s * 1000), conn("new", s, s * 1000)]);
    const now = t0 + 60_000;
    const f = window.fairness(now, [conn("old", 36_060, hour + 60_000), conn("new", 60, 60_000)]);
    expect(f.index).to.be.closeTo(1, 1e-9);
    expect(f.spanMs).to.equal(60_000);
    // Counted since start-up, as before, the same broker looked unfair.
    expect(jainIndex([36_060, 60])).to.be.below(0.51);
  });

  it("shows an unfair minute even when the totals since start-up are even", () => {
    const window = new GrantWindow();
    const t0 = hour;
    window.fairness(t0, [conn("a", 1000, hour), conn("b", 1000, hour)]);
    for (let s = 5; s <= 60; s += 5) window.fairness(t0 + s * 1000, [conn("a", 1000 + 10 * s, hour), conn("b", 1000, hour)]);
    const f = window.fairness(t0 + 60_000, [conn("a", 1600, hour), conn("b", 1000, hour)]);
    expect(f.index).to.be.closeTo(0.5, 1e-9); // one took every grant of the window
    expect(jainIndex([1600, 1000])).to.be.above(0.94);
  });

  it("judges rates since each connection opened until a snapshot is old enough, and leaves out the silent", () => {
    const window = new GrantWindow();
    const f = window.fairness(hour, [conn("a", 30, 30_000), conn("b", 10, 10_000), conn("idle", 0, 50_000, 0), conn("young", 1, 500)]);
    // a and b: 1/s each; young counts as 10 s old: 0.1/s; idle asked for nothing.
    expect(f.spanMs).to.equal(undefined);
    expect(f.over).to.equal(3);
    expect(f.index).to.be.closeTo(jainIndex([1, 1, 0.1])!, 1e-9);
  });

  it("keeps at most one snapshot per 5 s and none older than the window", () => {
    const window = new GrantWindow();
    for (let ms = 0; ms <= 10 * 60_000; ms += 250) window.fairness(ms, [conn("a", ms / 1000, ms)]);
    const kept = (window as unknown as { snapshots: unknown[] }).snapshots.length;
    expect(kept).to.be.at.most(13);
  });
});
