import { expect } from "chai";
import { PassThrough, Writable } from "node:stream";
import { Code, SlotbrokerError } from "../../src/shared/errors.js";
import { Events } from "../../src/shared/typed-events.js";
import { IllegalTransitionError, Transitions } from "../../src/shared/lifecycle.js";
import { lengthFieldSize, stringFieldSize, varintSize, writeVarint } from "../../src/shared/protobuf-wire.js";
import { retry, retryDelayMs } from "../../src/shared/retry.js";
import { drained } from "../../src/shared/streams.js";
import { lazyChild } from "../../src/shared/log.js";
import { HookedAbortController, onAbort } from "../../src/shared/abort.js";
import { pino } from "pino";

describe("shared helpers", () => {
  describe("retry policy", () => {
    it("grows delays by the multiplier up to the cap, jitter only ever shortening them", () => {
      const p = { initialMs: 100, maxMs: 1000 };
      expect([0, 1, 2, 3, 4, 10].map((n) => retryDelayMs(p, n))).to.deep.equal([100, 200, 400, 800, 1000, 1000]);
      expect(retryDelayMs({ ...p, multiplier: 3 }, 2)).to.equal(900);
      expect(retryDelayMs({ ...p, jitter: 0.5 }, 3, () => 1)).to.equal(400);
      expect(retryDelayMs(p, 10_000)).to.equal(1000);
    });

    it("retries what is retryable, up to maxAttempts, and throws the rest at once", async () => {
      let calls = 0;
      const transient = new SlotbrokerError(Code.Unavailable, "down");
      const retried: number[] = [];
      const value = await retry(
        (attempt) => (++calls < 3 ? Promise.reject(transient) : Promise.resolve(`ok after ${attempt}`)),
        { policy: { initialMs: 1, maxMs: 2 }, retryable: (e) => e === transient, onRetry: (_e, attempt) => retried.push(attempt) },
      );
      expect(value).to.equal("ok after 3");
      expect(retried).to.deep.equal([1, 2]);
      const fatal = new Error("bad input");
      calls = 0;
      await retry(() => (++calls, Promise.reject(fatal)), { policy: { initialMs: 1, maxMs: 1 }, retryable: () => false }).then(
        () => expect.fail("should throw"),
        (e: unknown) => expect(e).to.equal(fatal),
      );
      expect(calls).to.equal(1);
      calls = 0;
      await retry(() => (++calls, Promise.reject(transient)), { policy: { initialMs: 1, maxMs: 1 }, retryable: () => true, maxAttempts: 4 }).catch(() => undefined);
      expect(calls).to.equal(4);
    });

    it("stops pausing the moment its signal aborts", async () => {
      const controller = new AbortController();
      const started = performance.now();
      const pending = retry(() => Promise.reject(new Error("down")), {
        policy: { initialMs: 60_000, maxMs: 60_000 },
        retryable: () => true,
        signal: controller.signal,
        onRetry: () => controller.abort(new Error("stopping")),
      });
      await pending.then(
        () => expect.fail("should reject"),
        (e: unknown) => expect((e as Error).message).to.equal("stopping"),
      );
      expect(performance.now() - started).to.be.below(5_000);
    });
  });

  describe("typed events", () => {
    it("emit safely: a throwing listener is reported and the others still run", () => {
      const reported: string[] = [];
      const events = new Events<{ tick: [n: number] }>((err, event) => reported.push(`${String(event)}: ${(err as Error).message}`));
      const seen: number[] = [];
      events.on("tick", () => {
        throw new Error("observer bug");
      });
      const stop = events.on("tick", (n) => seen.push(n));
      events.emit("tick", 1);
      stop();
      events.emit("tick", 2);
      expect(seen).to.deep.equal([1]);
      expect(reported).to.deep.equal(["tick: observer bug", "tick: observer bug"]);
    });

    it("next() resolves with the first matching event and rejects when its signal aborts", async () => {
      const events = new Events<{ item: [id: string, state: string] }>();
      const done = events.next("item", { filter: (_id, state) => state === "done" });
      events.emit("item", "a", "running");
      events.emit("item", "a", "done");
      expect(await done).to.deep.equal(["a", "done"]);
      expect(events.has("item")).to.equal(false);
      const controller = new AbortController();
      const never = events.next("item", { signal: controller.signal });
      controller.abort(new Error("gave up"));
      await never.then(
        () => expect.fail("should reject"),
        (e: unknown) => expect((e as Error).message).to.equal("gave up"),
      );
      expect(events.has("item")).to.equal(false);
    });
  });

  describe("transition tables", () => {
    it("allow the listed moves and throw one error type, naming the machine, for the rest", () => {
      const t = new Transitions<"a" | "b" | "c">("thing", { a: ["b"], b: ["c"], c: [] });
      expect(t.check("a", "b")).to.equal("b");
      expect(t.can("b", "a")).to.equal(false);
      expect(t.isFinal("c")).to.equal(true);
      expect(() => t.check("c", "a"))
        .to.throw(IllegalTransitionError, "illegal thing transition c → a")
        .with.property("code", Code.FailedPrecondition);
    });
  });

  describe("protobuf varints", () => {
    it("size and write varints with int32 rules (negatives take ten bytes)", () => {
      const bytes = (n: number): number[] => {
        const out = new Uint8Array(10);
        return [...out.subarray(0, writeVarint(out, 0, n))];
      };
      expect(bytes(1)).to.deep.equal([1]);
      expect(bytes(300)).to.deep.equal([0xac, 0x02]);
      expect(bytes(2 ** 32)).to.deep.equal([0x80, 0x80, 0x80, 0x80, 0x10]);
      expect(bytes(-1)).to.deep.equal([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
      for (const n of [0, 127, 128, 16_383, 16_384, 2 ** 31 - 1, 2 ** 32, -5]) expect(varintSize(n)).to.equal(bytes(n).length);
      expect(stringFieldSize(0)).to.equal(0);
      expect(lengthFieldSize(0)).to.equal(2);
      expect(stringFieldSize(200)).to.equal(1 + 2 + 200);
    });
  });

  describe("drained", () => {
    it("resolves on drain, rejects on error or close, and leaves no listener behind", async () => {
      const stream = new PassThrough({ highWaterMark: 1 });
      stream.write("xx");
      const waiting = drained(stream, () => new Error("closed"));
      stream.read();
      await waiting;
      expect(stream.listenerCount("drain") + stream.listenerCount("close")).to.equal(0);
      const slow = new Writable({ highWaterMark: 1, write: (_c, _e, cb) => setImmediate(cb) });
      slow.write("xx");
      const closing = drained(slow, () => new Error("closed first"));
      slow.destroy();
      await closing.then(
        () => expect.fail("should reject"),
        (e: unknown) => expect((e as Error).message).to.equal("closed first"),
      );
      const failing = new Writable({ write: (_c, _e, cb) => setImmediate(cb) });
      const erroring = drained(failing, () => new Error("closed"));
      failing.destroy(new Error("boom"));
      await erroring.then(
        () => expect.fail("should reject"),
        (e: unknown) => expect((e as Error).message).to.equal("boom"),
      );
    });
  });
  describe("onAbort", () => {
    it("runs a hooked controller's callbacks once at abort, not those taken off, and still fires its listeners", () => {
      const controller = new HookedAbortController();
      const calls: string[] = [];
      onAbort(controller.signal, () => calls.push(`a:${String(controller.signal.reason)}`));
      const off = onAbort(controller.signal, () => calls.push("b"));
      controller.signal.addEventListener("abort", () => calls.push("listener"));
      off();
      controller.abort("why");
      controller.abort("again");
      expect(calls).to.deep.equal(["listener", "a:why"]);
      onAbort(controller.signal, () => calls.push("late"));
      expect(calls).to.have.length(2);
    });

    it("uses a listener on any other signal and takes it off", () => {
      const controller = new AbortController();
      let calls = 0;
      const off = onAbort(controller.signal, () => calls++);
      onAbort(controller.signal, () => calls++);
      off();
      controller.abort();
      expect(calls).to.equal(1);
    });
  });

  describe("lazyChild", () => {
    it("logs the lines a child would, with its bindings, and makes the child only for a line let through", () => {
      const lines: Record<string, unknown>[] = [];
      const sink = new Writable({ write: (chunk: Buffer, _e, done) => void (lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>), done()) });
      let children = 0;
      const parent = pino({ level: "info", base: undefined, timestamp: false, onChild: () => void children++ }, sink);
      const log = lazyChild(parent, { itemId: "i1" });
      log.debug({ n: 1 }, "off");
      expect(children).to.equal(0);
      log.warn({ n: 2 }, "on");
      log.info("again");
      expect(children).to.equal(1);
      log.child({ call: 0 }).error("nested");
      expect(lines.map((l) => [l.msg, l.itemId, l.n, l.call])).to.deep.equal([
        ["on", "i1", 2, undefined],
        ["again", "i1", undefined, undefined],
        ["nested", "i1", undefined, 0],
      ]);
      expect(log.isLevelEnabled("debug")).to.equal(false);
    });
  });
});
