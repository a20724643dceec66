import { expect } from "chai";
import { fromPgError, refusesWrites, WriteHealth, writeHealthMaxAgeMs } from "../../src/dispatcher/index.js";

describe("WriteHealth (readiness: the database takes this fylr's writes)", () => {
  it("fails at once on a failed heartbeat, names the error, and recovers on the next write", () => {
    const health = new WriteHealth(5000, 0);
    expect(health.report(100)).to.deep.include({ ok: true });
    health.failed(new Error("cannot execute UPDATE in a read-only transaction"));
    health.failed(new Error("cannot execute UPDATE in a read-only transaction"));
    const failed = health.report(2000);
    expect(failed.ok).to.equal(false);
    expect(failed.detail).to.equal("the last 2 heartbeat write(s) failed (last written 2.0 s ago): cannot execute UPDATE in a read-only transaction");
    health.wrote(2100);
    expect(health.report(2200)).to.deep.equal({ ok: true, detail: "heartbeat written 0.1 s ago" });
  });

  it("fails when no heartbeat was written for longer than the limit (a write that hangs)", () => {
    const health = new WriteHealth(writeHealthMaxAgeMs(1000), 0);
    expect(writeHealthMaxAgeMs(1000)).to.equal(5000);
    expect(writeHealthMaxAgeMs(3000)).to.equal(9000);
    expect(health.report(5000).ok).to.equal(true);
    expect(health.report(5001)).to.deep.equal({ ok: false, detail: "no heartbeat written for 5.0 s (a write is still waiting for the database)" });
  });
});

describe("refused writes (readiness: a full disk may still take the heartbeat)", () => {
  it("a write the database refused fails readiness for the age limit, then lapses", () => {
    const health = new WriteHealth(5000, 0);
    health.refused(new Error('could not extend file "base/16384/16397": No space left on device'), 1000);
    expect(health.report(1500)).to.deep.equal({
      ok: false,
      detail: 'the database refused a write 0.5 s ago: could not extend file "base/16384/16397": No space left on device',
    });
    health.wrote(2000); // the heartbeat's in-place update still goes through
    expect(health.report(5900).ok).to.equal(false);
    expect(health.report(6001).ok).to.equal(true);
  });

  it("tells refusals (disk full, read-only, io error, no privilege) from other failures, through translations", () => {
    const pgError = (code: string): Error => Object.assign(new Error(code), { code });
    for (const code of ["53100", "25006", "58030", "42501"]) expect(refusesWrites(pgError(code)), code).to.equal(true);
    for (const code of ["23505", "40001", "57P01"]) expect(refusesWrites(pgError(code)), code).to.equal(false);
    expect(refusesWrites(fromPgError(pgError("53100"), "submit"))).to.equal(true);
    expect(refusesWrites(new Error("ECONNREFUSED"))).to.equal(false);
  });
});
