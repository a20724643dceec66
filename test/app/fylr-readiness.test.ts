import { expect } from "chai";
import { readinessReport } from "../../src/app/fylr-readiness.js";

describe("readinessReport", () => {
  const checks = [
    { name: "execservers", check: () => ({ ok: false, detail: "no execserver connected (a:1: refused)" }) },
    { name: "database", check: () => ({ ok: true, detail: "heartbeat written 0.2 s ago" }) },
  ];

  it("answers 503 naming each failed check, one line per check", () => {
    expect(readinessReport(checks)).to.deep.equal({
      status: 503,
      body: "not ready: execservers\n[-]execservers failed: no execserver connected (a:1: refused)\n[+]database ok: heartbeat written 0.2 s ago\n",
    });
  });

  it("leaves out excluded checks and refuses an unknown name", () => {
    expect(readinessReport(checks, ["execservers"]).status).to.equal(200);
    expect(readinessReport(checks, ["etcd"])).to.deep.equal({ status: 400, body: "unknown check(s) in exclude: etcd; the checks are execservers, database\n" });
  });
});
