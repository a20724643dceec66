import { createHash } from "node:crypto";
import { expect } from "chai";
import {
  checksumAction,
  compileDispatcherConfig,
  countAction,
  createDefaultActions,
  describeFailure,
  execAdmission,
  fromPgError,
  instanceShare,
  isTransient,
  LocalPermits,
  normalizeSubmit,
  reservedForHigh,
  itemRetryDelayMs,
  type ExecInstance,
} from "../../src/dispatcher/index.js";
import { ErrorKind } from "../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../../src/shared/errors.js";
import { receiptFor } from "./support.js";

const instance = (id: string, capacity: number, clients: number): ExecInstance => ({ instanceId: id, address: `${id}:7600`, capacity, clients });

describe("dispatcher admission", () => {
  it("gives each of 5 fylrs on a 40-slot execserver ceil(40/5) + headroom = 10 exec items", () => {
    const a = execAdmission([instance("x", 40, 5)], 0, 2);
    expect(a.shares.map((s) => s.share)).to.deep.equal([Math.ceil(40 / 5) + 2]);
    expect(a.admission).to.equal(10);
    expect(execAdmission([instance("x", 40, 5)], 0, 0).admission).to.equal(8);
  });

  it("rounds a share up and sums shares over instances, minus what is held", () => {
    const a = execAdmission([instance("a", 10, 3), instance("b", 4, 1)], 5, 2);
    expect(a.shares.map((s) => s.share)).to.deep.equal([4 + 2, 4 + 2]);
    expect(a.admission).to.equal(12);
    expect(a.free).to.equal(7);
    expect(execAdmission([instance("a", 10, 3)], 50, 2).free).to.equal(0);
  });

  it("admits nothing exec-bound without a connected instance", () => {
    const a = execAdmission([], 0, 2);
    expect(a).to.include({ admission: 0, free: 0 });
    expect(a.shares).to.have.length(0);
  });

  it("gives no headroom for an instance without capacity (draining) and reads 0 clients as 1", () => {
    expect(instanceShare(instance("d", 0, 3), 2)).to.equal(0);
    expect(instanceShare(instance("c", 6, 0), 1)).to.equal(7);
  });

  it("counts an instance reached by two connections once", () => {
    expect(execAdmission([instance("x", 8, 2), instance("x", 8, 2)], 0, 2).admission).to.equal(6);
  });

  it("grows a survivor's share when a sibling drops off", () => {
    const before = execAdmission([instance("x", 40, 5)], 0, 2).admission;
    const after = execAdmission([instance("x", 40, 4)], 0, 2).admission;
    expect(after).to.be.greaterThan(before);
    expect(after).to.equal(12);
  });

  it("backs off exponentially up to the cap", () => {
    const config = (initial: number, max: number): { retryInitialMs: number; retryMaxMs: number } => ({ retryInitialMs: initial, retryMaxMs: max });
    expect([1, 2, 3, 4, 5].map((n) => itemRetryDelayMs(config(1000, 10_000), n))).to.deep.equal([1000, 2000, 4000, 8000, 10_000]);
    expect(itemRetryDelayMs(config(1000, 60_000), 500)).to.equal(60_000);
  });
});

describe("local permits", () => {
  it("keeps a share for high priority that normal items cannot take", () => {
    const permits = new LocalPermits(4);
    expect(permits.reservedForHigh).to.equal(reservedForHigh(4)).and.to.equal(1);
    const normal = [permits.tryReserve(0), permits.tryReserve(0), permits.tryReserve(0)];
    expect(normal.every(Boolean)).to.equal(true);
    expect(permits.tryReserve(0)).to.equal(undefined);
    const high = permits.tryReserve(5);
    expect(high).to.not.equal(undefined);
    expect(permits.tryReserve(5)).to.equal(undefined);
    high!.release();
    high!.release(); // idempotent
    expect(permits.counts().held).to.equal(3);
    expect(permits.available(0)).to.equal(0);
    expect(permits.available(1)).to.equal(1);
  });

  it("lets high priority use every permit and reserves nothing on one CPU", () => {
    const one = new LocalPermits(1);
    expect(one.reservedForHigh).to.equal(0);
    expect(one.tryReserve(0)).to.not.equal(undefined);
    const two = new LocalPermits(2);
    expect([two.tryReserve(1), two.tryReserve(1)].every(Boolean)).to.equal(true);
  });

  it("hands a released permit to a waiter and tracks used permits", async () => {
    const permits = new LocalPermits(2);
    const a = permits.tryReserve(9)!;
    permits.tryReserve(9)!.markUsed();
    const waiting = permits.reserve(9);
    a.release();
    const b = await waiting;
    b.markUsed();
    expect(permits.counts()).to.include({ held: 2, used: 2 });
    b.release();
    expect(permits.counts()).to.include({ held: 1, used: 1 });
  });

  it("stops waiting when the signal aborts", async () => {
    const permits = new LocalPermits(1);
    permits.tryReserve(0);
    const controller = new AbortController();
    const waiting = permits.reserve(0, controller.signal);
    controller.abort(new Error("gone"));
    await waiting.then(
      () => expect.fail("should reject"),
      (err: Error) => expect(err.message).to.equal("gone"),
    );
  });
});

describe("local actions", () => {
  const signal = new AbortController().signal;

  it("checksum hashes the input with the chosen algorithm", async () => {
    const input = Buffer.from("hello world\n".repeat(200_000)); // > 1 MiB: crosses slices
    const out = await checksumAction.run({}, input, signal);
    expect(out.toString()).to.equal(`${createHash("sha256").update(input).digest("hex")}\n`);
    const md5 = await checksumAction.run({ algorithm: "md5" }, Buffer.from("x"), signal);
    expect(md5.toString()).to.equal(`${createHash("md5").update("x").digest("hex")}\n`);
  });

  it("count reports lines, words and bytes like wc", async () => {
    const out = await countAction.run({}, Buffer.from("one two\n  three\nfour"), signal);
    expect(out.toString()).to.equal("2 4 20\n");
  });

  it("refuses an unknown action or algorithm naming what was wrong", () => {
    const actions = createDefaultActions();
    expect(() => actions.validate("compress", {})).to.throw(/unknown local action "compress"; known: checksum, count/);
    expect(() => actions.validate("checksum", { algorithm: "crc99" })).to.throw(/algorithm: unsupported hash "crc99"/);
    expect(() => actions.validate("checksum", { algo: "md5" })).to.throw(/unknown parameter "algo"/);
    expect(() => actions.validate("checksum", { algorithm: "sha1" })).to.not.throw();
  });
});

describe("submit validation", () => {
  const actions = createDefaultActions();
  const limits = { maxInputBytes: 16, defaultMaxAttempts: 3 };

  it("names the bad field", () => {
    expect(() => normalizeSubmit({}, actions, limits)).to.throw(/one or more calls, or a local action/);
    expect(() => normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "previous" } }] }, actions, limits)).to.throw(
      /calls\[0\]\.stdin_from_previous/,
    );
    expect(() => normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "url", url: "file:///etc/passwd" } }] }, actions, limits)).to.throw(
      /calls\[0\]\.stdin_url: must be http/,
    );
    expect(() => normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "data", data: Buffer.alloc(17) } }] }, actions, limits)).to.throw(
      /17 bytes of inline stdin, over the 16-byte limit/,
    );
    expect(() => normalizeSubmit({ local: { name: "nope", params: {}, input: Buffer.alloc(0) } }, actions, limits)).to.throw(/unknown local action/);
    expect(() => normalizeSubmit({ calls: [{ service: "", args: [], env: {} }] }, actions, limits)).to.throw(/calls\[0\]\.service/);
    expect(() => normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }], priority: 1.5 }, actions, limits)).to.throw(/priority/);
  });

  it("fills defaults", () => {
    const n = normalizeSubmit({ calls: [{ service: "cat", args: ["-n"], env: {} }] }, actions, limits);
    expect(n).to.include({ kind: "exec", priority: 0, maxAttempts: 3, idempotencyKey: undefined });
  });
});

describe("dispatcher config", () => {
  it("compiles defaults to milliseconds", () => {
    const c = compileDispatcherConfig({});
    expect(c).to.include({ pollIntervalMs: 1000, heartbeatIntervalMs: 1000, staleAfterMs: 15_000, headroom: 2, noSlotDelayMs: 60_000, maxAttempts: 3 });
  });

  it("names the bad key", () => {
    expect(() => compileDispatcherConfig({ staleAfter: "2s" }, "fylr.yaml dispatcher")).to.throw(/staleAfter: must be at least 3 × heartbeatInterval/);
    expect(() => compileDispatcherConfig({ pollInterval: "1" })).to.throw(/pollInterval: expected a duration/);
    expect(() => compileDispatcherConfig({ parallel: 4 })).to.throw(/unknown key "parallel"/);
  });
});

describe("receipt descriptions", () => {
  it("says why a call failed", () => {
    expect(describeFailure(receiptFor({ exitCode: 2, stderrLine: "no such file" }))).to.equal("exited with code 2: no such file");
    expect(describeFailure(receiptFor({ signal: "SIGKILL" }))).to.equal("killed by SIGKILL");
    expect(describeFailure(receiptFor({ error: ErrorKind.TIMEOUT, errorMessage: "after 5s" }))).to.equal("timed out: after 5s");
  });

  it("never says the same thing twice", () => {
    expect(describeFailure(receiptFor({ exitCode: 3, errorMessage: "stdout upload aborted after 5000 bytes" }))).to.equal("exited with code 3: stdout upload aborted after 5000 bytes");
    // What older execservers send.
    expect(describeFailure(receiptFor({ exitCode: 3, errorMessage: "exited with code 3; stdout upload aborted after 5000 bytes" }))).to.equal("exited with code 3; stdout upload aborted after 5000 bytes");
    expect(describeFailure(receiptFor({ exitCode: 3, errorMessage: "exited with code 3" }))).to.equal("exited with code 3");
    expect(describeFailure(receiptFor({ signal: "SIGKILL", error: ErrorKind.KILLED, errorMessage: "killed by SIGKILL" }))).to.equal("killed by SIGKILL");
    expect(describeFailure(receiptFor({ signal: "SIGKILL", error: ErrorKind.KILLED, errorMessage: "the job launcher (pid 9) died" }))).to.equal("killed by SIGKILL: the job launcher (pid 9) died");
  });
});

describe("Postgres error translation", () => {
  const pgError = (code: string, message = "boom"): Error => Object.assign(new Error(message), { code });

  it("maps SQLSTATEs to status codes once, naming the operation", () => {
    const dup = fromPgError(pgError("23505", "duplicate key"), "submit") as SlotbrokerError;
    expect(dup).to.be.instanceOf(SlotbrokerError);
    expect(dup.code).to.equal(Code.AlreadyExists);
    expect(dup.message).to.equal("submit: duplicate key");
    expect(dup.details).to.deep.equal({ sqlState: "23505" });
    expect((fromPgError(pgError("08006"), "claim") as SlotbrokerError).code).to.equal(Code.Unavailable);
    expect((fromPgError(pgError("40P01"), "claim") as SlotbrokerError).code).to.equal(Code.Aborted);
    expect((fromPgError(pgError("42P01", 'relation "queue_items" does not exist'), "claim") as Error).message).to.match(/run `slotbroker migrate`/);
    expect((fromPgError(new Error("Connection terminated unexpectedly"), "heartbeat") as SlotbrokerError).code).to.equal(Code.Unavailable);
    expect((fromPgError(new Error("Cannot use a pool after calling end on the pool"), "claim") as SlotbrokerError).code).to.equal(Code.FailedPrecondition);
  });

  it("retries only what a pause can fix", () => {
    expect(isTransient(fromPgError(pgError("57P01"), "x"))).to.equal(true);
    expect(isTransient(fromPgError(pgError("23505"), "x"))).to.equal(false);
    const abort = new DOMException("stop", "AbortError");
    expect(fromPgError(abort, "x")).to.equal(abort);
  });
});
