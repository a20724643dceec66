import { expect } from "chai";
import { SweepGate } from "../../src/dispatcher/claims/housekeeping.js";

describe("SweepGate", () => {
  it("allows a sweep only after the stale threshold since start", () => {
    const gate = new SweepGate(1000, 0);
    gate.healthy(10);
    expect(gate.mayReap(999)).to.equal(false);
    expect(gate.mayReap(1000)).to.equal(true);
  });

  it("starts the healthy period over after an outage, at the first success", () => {
    const gate = new SweepGate(1000, 0);
    gate.healthy(2000);
    expect(gate.mayReap(2000)).to.equal(true);
    gate.unhealthy();
    expect(gate.mayReap(5000)).to.equal(false);
    gate.healthy(6000);
    gate.healthy(6500); // later successes do not move the start
    expect(gate.mayReap(6999)).to.equal(false);
    expect(gate.mayReap(7000)).to.equal(true);
  });
});
