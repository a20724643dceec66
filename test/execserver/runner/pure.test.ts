import { expect } from "chai";
import { ErrorKind } from "../../../gen/slotbroker/v1/broker_pb.js";
import { childEnv, FALLBACK_PATH, receiptFromOutcome, type JobOutcome } from "../../../src/execserver/runner/index.js";
import { checkRequest } from "../../../src/execserver/runner/request-check.js";
import { ownerVerdict, parseOwner, type DirOwner } from "../../../src/execserver/runner/job-dir-owner.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

const base: JobOutcome = {
  exitCode: 0,
  signal: null,
  durationMs: 1500,
  stderrLine: "",
  stdoutPrefix: new Uint8Array(),
  stdoutBytes: 0,
  stdoutStreamed: false,
  uploadAborted: false,
};

describe("runner: job environment", () => {
  it("is exactly the given variables plus the execserver's PATH", () => {
    expect(childEnv({ LANG: "C" }, "/opt/bin:/usr/bin")).to.deep.equal({ LANG: "C", PATH: "/opt/bin:/usr/bin" });
  });

  it("keeps a PATH the job was allowed to set", () => {
    expect(childEnv({ PATH: "/job/bin" }, "/usr/bin")).to.deep.equal({ PATH: "/job/bin" });
  });

  it("falls back to a minimal PATH", () => {
    expect(childEnv({}, undefined)).to.deep.equal({ PATH: FALLBACK_PATH });
    expect(childEnv({}, "")).to.deep.equal({ PATH: FALLBACK_PATH });
  });
});

describe("runner: receipts", () => {
  it("reports a clean exit with its duration and no error", () => {
    const receipt = receiptFromOutcome(base);
    expect(receipt.exitCode).to.equal(0);
    expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED);
    expect(receipt.errorMessage).to.equal("");
    expect(durationMs(receipt.duration!)).to.equal(1500);
  });

  it("calls a signal nobody here sent KILLED", () => {
    const receipt = receiptFromOutcome({ ...base, exitCode: null, signal: "SIGSEGV" });
    expect(receipt.exitCode).to.equal(undefined);
    expect(receipt.signal).to.equal("SIGSEGV");
    expect(receipt.error).to.equal(ErrorKind.KILLED);
  });

  it("lets the runner's own failure explain the signal it sent", () => {
    const receipt = receiptFromOutcome({
      ...base,
      exitCode: null,
      signal: "SIGTERM",
      failure: { kind: ErrorKind.TIMEOUT, message: "timed out after 5 ms" },
    });
    expect(receipt.error).to.equal(ErrorKind.TIMEOUT);
    expect(receipt.signal).to.equal("SIGTERM");
  });

  it("says when an upload was aborted after a non-zero exit", () => {
    const receipt = receiptFromOutcome({ ...base, exitCode: 2, stdoutBytes: 5000, stdoutStreamed: true, uploadAborted: true });
    expect(receipt.exitCode).to.equal(2);
    expect(receipt.error).to.equal(ErrorKind.UNSPECIFIED);
    // The exit code is in its own field, not repeated here.
    expect(receipt.errorMessage).to.equal("stdout upload aborted after 5000 bytes");
  });
});

describe("runner: request checks", () => {
  const signal = new AbortController().signal;
  const ok = { command: ["cat"], args: [], env: {}, timeoutMs: 1000, signal };

  it("accepts a plain request", () => {
    expect(checkRequest(ok)).to.equal(undefined);
  });

  it("refuses an empty command, a non-positive timeout and non-http pipe URLs", () => {
    expect(checkRequest({ ...ok, command: [] })?.kind).to.equal(ErrorKind.SPAWN_FAILED);
    expect(checkRequest({ ...ok, timeoutMs: 0 })?.kind).to.equal(ErrorKind.SPAWN_FAILED);
    expect(checkRequest({ ...ok, stdinUrl: "file:///etc/passwd" })?.kind).to.equal(ErrorKind.PIPE_FAILED);
    expect(checkRequest({ ...ok, stdoutUrl: "not a url" })?.kind).to.equal(ErrorKind.PIPE_FAILED);
  });
});

describe("runner: who owns a directory of job directories", () => {
  const here: DirOwner = { pid: 100, startTime: "5000", bootId: "boot-1", pidNamespace: "pid:[1]" };
  const running = (table: Record<number, string>) => (pid: number) => (pid in table ? { startTime: table[pid] } : undefined);

  it("a live maker (same pid, same start) is alive; its pid gone or reused is dead", () => {
    const owner = { pid: 42, startTime: "4000", bootId: "boot-1", pidNamespace: "pid:[1]" };
    expect(ownerVerdict(owner, here, running({ 42: "4000" }))).to.equal("alive");
    expect(ownerVerdict(owner, here, running({}))).to.equal("dead");
    expect(ownerVerdict(owner, here, running({ 42: "4999" })), "pid reused by another process").to.equal("dead");
  });

  it("our own pid with another start time is an earlier holder of it (a container restarted as the same pid)", () => {
    expect(ownerVerdict({ ...here, startTime: "17" }, here, running({}))).to.equal("dead");
    expect(ownerVerdict(here, here, running({}))).to.equal("alive");
  });

  it("another boot is dead; another pid namespace cannot be judged and is left alone", () => {
    expect(ownerVerdict({ ...here, pid: 42, bootId: "boot-0" }, here, running({ 42: "5000" }))).to.equal("dead");
    expect(ownerVerdict({ ...here, pidNamespace: "pid:[2]" }, here, running({}))).to.equal("unknown");
    expect(ownerVerdict({ ...here, pid: 1, pidNamespace: "pid:[2]" }, here, running({}))).to.equal("unknown");
  });

  it("without start times (no /proc) a running pid counts as alive", () => {
    expect(ownerVerdict({ pid: 42 }, { pid: 100 }, running({ 42: "" }))).to.equal("alive");
    expect(ownerVerdict({ pid: 42 }, { pid: 100 }, () => ({}))).to.equal("alive");
    expect(ownerVerdict({ pid: 42 }, { pid: 100 }, () => undefined)).to.equal("dead");
  });

  it("reads an owner file as untrusted input", () => {
    expect(parseOwner('{"pid":42,"startTime":"4000","bootId":"b","pidNamespace":"pid:[1]"}')).to.deep.equal({ pid: 42, startTime: "4000", bootId: "b", pidNamespace: "pid:[1]" });
    expect(parseOwner('{"pid":42}')).to.deep.equal({ pid: 42, startTime: undefined, bootId: undefined, pidNamespace: undefined });
    for (const bad of ["", "not json", "null", "[]", '{"pid":"42"}', '{"pid":-1}', '{"pid":1.5}', '{"pid":42,"startTime":4000}', `{"pid":42,"bootId":"${"x".repeat(300)}"}`]) {
      expect(parseOwner(bad), bad).to.equal(undefined);
    }
  });
});
