import { expect } from "chai";
import { PassThrough, Readable, Writable } from "node:stream";
import { PipeError, PipeRegistry, SpentIds, isPipeError, type PipeErrorKind } from "../../src/fylr/index.js";
import { HashingSink, randomPayload, releaseAll, sha256, trackedRegistry } from "./pipes-support.js";

async function rejection(promise: Promise<unknown>): Promise<PipeError> {
  try {
    await promise;
  } catch (err) {
    expect(err).to.be.instanceOf(PipeError);
    return err as PipeError;
  }
  throw new Error("expected a rejection");
}

function thrown(fn: () => unknown): PipeError {
  try {
    fn();
  } catch (err) {
    expect(err).to.be.instanceOf(PipeError);
    return err as PipeError;
  }
  throw new Error("expected a throw");
}

async function drain(chunks: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const chunk of chunks) parts.push(chunk);
  return Buffer.concat(parts);
}

describe("pipe registry", () => {
  let registry: PipeRegistry;
  beforeEach(() => {
    registry = trackedRegistry();
  });
  afterEach(() => releaseAll(registry));

  it("makes ids of at least 128 random bits in URL-safe base64, never repeating", () => {
    const ids = new Set<string>();
    for (let i = 0; i < 500; i++) {
      const { id } = registry.createInPipe(Buffer.alloc(0));
      expect(id).to.match(/^[A-Za-z0-9_-]+$/);
      expect(Buffer.from(id, "base64url").length).to.be.at.least(16);
      ids.add(id);
    }
    expect(ids.size).to.equal(500);
  });

  it("serves an in-pipe once and resolves its owner's promise with the byte count", async () => {
    const payload = randomPayload(300_000);
    const pipe = registry.createInPipe(payload);
    const reader = registry.openIn(pipe.id);
    expect(reader.length).to.equal(payload.length);
    expect(sha256(await drain(reader.chunks()))).to.equal(sha256(payload));
    reader.finish();
    expect(await pipe.done).to.equal(payload.length);
    expect(pipe.state).to.equal("done");
    expect(thrown(() => registry.openIn(pipe.id)).kind).to.equal("used");
  });

  it("streams a Readable source and counts its bytes", async () => {
    const payload = randomPayload(200_000);
    const pipe = registry.createInPipe(Readable.from([payload.subarray(0, 1000), payload.subarray(1000)]));
    const reader = registry.openIn(pipe.id);
    expect(reader.length).to.equal(undefined);
    expect(sha256(await drain(reader.chunks()))).to.equal(sha256(payload));
    reader.finish();
    expect(await pipe.done).to.equal(payload.length);
  });

  it("answers not-found for unknown ids and for an id used on the wrong direction", () => {
    const inPipe = registry.createInPipe(Buffer.from("x"));
    const outPipe = registry.createOutPipe(new PassThrough());
    expect(thrown(() => registry.openIn("AAAAAAAAAAAAAAAAAAAAAAAA")).kind).to.equal("not-found");
    expect(thrown(() => registry.openOut(inPipe.id)).kind).to.equal("not-found");
    expect(thrown(() => registry.openIn(outPipe.id)).kind).to.equal("not-found");
    expect(thrown(() => registry.openOut("AAAAAAAAAAAAAAAAAAAAAAAA")).code).to.equal(5 /* NOT_FOUND */);
  });

  it("expires an unused in-pipe: the source is destroyed and the id answers expired", async () => {
    const source = new PassThrough();
    const pipe = registry.createInPipe(source, { ttlMs: 20 });
    const err = await rejection(pipe.done);
    expect(err.kind).to.equal("expired");
    expect(err.message).to.match(/expired unused/);
    expect(source.destroyed).to.equal(true);
    expect(pipe.state).to.equal("expired");
    const again = thrown(() => registry.openIn(pipe.id));
    expect(again.kind).to.equal("expired");
    expect(again.code).to.equal(9 /* FAILED_PRECONDITION */);
  });

  it("expires an unused out-pipe: its promise rejects and the sink gets the same error", async () => {
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink, { ttlMs: 20 });
    const err = await rejection(pipe.done);
    expect(err.message).to.match(/pipe expired unused/);
    expect(sink.destroyed).to.equal(true);
    expect(sink.errored).to.equal(err);
    expect(thrown(() => registry.openOut(pipe.id)).kind).to.equal("expired");
  });

  it("writes an out-pipe into its sink and resolves with the bytes once the sink finished", async () => {
    const payload = randomPayload(500_000);
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const writer = registry.openOut(pipe.id);
    for (let i = 0; i < payload.length; i += 65536) await writer.write(payload.subarray(i, i + 65536));
    expect(await writer.finish()).to.equal(payload.length);
    expect(await pipe.done).to.equal(payload.length);
    expect(sink.writableFinished).to.equal(true);
    expect(sink.digest()).to.equal(sha256(payload));
    expect(thrown(() => registry.openOut(pipe.id)).kind).to.equal("used");
  });

  it("holds the writer while the sink is full (backpressure)", async () => {
    let release: (() => void) | undefined;
    const sink = new Writable({
      highWaterMark: 1,
      write(_chunk, _enc, callback) {
        release = () => callback();
      },
    });
    const pipe = registry.createOutPipe(sink);
    const writer = registry.openOut(pipe.id);
    let settled = false;
    const pending = writer.write(Buffer.from("abc")).then(() => (settled = true));
    await new Promise((resolve) => setImmediate(resolve));
    expect(settled).to.equal(false);
    release!();
    await pending;
    expect(settled).to.equal(true);
    pipe.cancel("test over");
  });

  it("an aborted upload rejects the owner's promise and errors the sink: never a short success", async () => {
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const writer = registry.openOut(pipe.id);
    await writer.write(Buffer.from("half of it"));
    writer.abort(new Error("client went away"));
    const err = await rejection(pipe.done);
    expect(err.kind).to.equal("aborted");
    expect(err.message).to.match(/client went away/);
    expect(sink.errored).to.equal(err);
    expect(sink.writableFinished).to.equal(false);
    expect((await rejection(writer.write(Buffer.from("more")))).kind).to.equal("aborted");
    expect(thrown(() => registry.openOut(pipe.id)).kind).to.equal("used");
  });

  it("keeps a source error until the reader comes, instead of crashing the process", async () => {
    const source = new Readable({ read() {} });
    const pipe = registry.createInPipe(source);
    const closed = new Promise((resolve) => source.once("close", resolve));
    source.destroy(new Error("disk on fire"));
    await closed;
    const reader = registry.openIn(pipe.id);
    const err = await rejection(drain(reader.chunks()));
    expect(err.message).to.match(/disk on fire/);
    reader.abort(err);
    expect((await rejection(pipe.done)).kind).to.equal("aborted");
  });

  it("cancelling a waiting pipe makes its id answer as gone", async () => {
    const pipe = registry.createOutPipe(new HashingSink());
    pipe.cancel("job dropped");
    expect((await rejection(pipe.done)).kind).to.equal("cancelled");
    const err = thrown(() => registry.openOut(pipe.id));
    expect(err.kind).to.equal("cancelled");
    expect(err.code).to.equal(9);
  });

  it("retiring an unopened pipe closes its sink without an error; opened pipes are left alone", async () => {
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    pipe.retire();
    expect((await rejection(pipe.done)).kind).to.equal("cancelled");
    expect(sink.destroyed).to.equal(true);
    expect(sink.errored).to.equal(null);
    expect(thrown(() => registry.openOut(pipe.id)).kind).to.equal("cancelled");
    const used = registry.createOutPipe(new HashingSink());
    const writer = registry.openOut(used.id);
    used.retire();
    await writer.write(Buffer.from("still streaming"));
    expect(await writer.finish()).to.equal(15);
  });

  it("makes a sink given as a function only when its writer arrives", async () => {
    let made = 0;
    const retired = registry.createOutPipe(() => (made++, new HashingSink()));
    retired.retire();
    expect((await rejection(retired.done)).kind).to.equal("cancelled");
    expect(made).to.equal(0);
    let sink: HashingSink | undefined;
    const used = registry.createOutPipe(() => (made++, (sink = new HashingSink())));
    const writer = registry.openOut(used.id);
    expect(made).to.equal(1);
    await writer.write(Buffer.from("bytes"));
    expect(await writer.finish()).to.equal(5);
    expect(await used.done).to.equal(5);
    expect(sink!.bytes).to.equal(5);
  });

  it("closing the registry fails everything pending and refuses new pipes", async () => {
    const source = new PassThrough();
    const sink = new HashingSink();
    const waitingIn = registry.createInPipe(source);
    const waitingOut = registry.createOutPipe(sink);
    const streamingOut = registry.createOutPipe(new HashingSink());
    const writer = registry.openOut(streamingOut.id);
    await writer.write(Buffer.from("x"));
    registry.close();
    registry.close();
    for (const pipe of [waitingIn, waitingOut, streamingOut]) expect((await rejection(pipe.done)).kind).to.equal("closed");
    expect(source.destroyed).to.equal(true);
    expect(sink.errored).to.be.instanceOf(PipeError);
    expect(isPipeError(thrown(() => registry.createInPipe(Buffer.alloc(1))), "closed")).to.equal(true);
    expect(thrown(() => registry.openIn(waitingIn.id)).kind).to.equal("closed");
  });

  it("refuses a non-positive TTL", () => {
    expect(() => new PipeRegistry({ ttlMs: 0 })).to.throw(RangeError);
    expect(() => registry.createInPipe(Buffer.alloc(0), { ttlMs: -1 })).to.throw(RangeError);
  });
});

describe("spent pipe ids", () => {
  it("forgets the oldest ids beyond its capacity", () => {
    const spent = new SpentIds({ capacity: 3 });
    for (const id of ["a", "b", "c", "d", "e"]) spent.add(id, "used");
    expect(spent.size).to.equal(3);
    expect(spent.get("a")).to.equal(undefined);
    expect(spent.get("b")).to.equal(undefined);
    expect(spent.get("e")).to.equal("used");
  });

  it("forgets ids after the retention time", () => {
    let now = 1000;
    const spent = new SpentIds({ retainMs: 100, now: () => now });
    spent.add("old", "expired");
    now += 50;
    spent.add("new", "used");
    expect(spent.get("old")).to.equal("expired");
    now += 60;
    expect(spent.get("old")).to.equal(undefined);
    expect(spent.get("new")).to.equal("used");
    const kinds: PipeErrorKind[] = ["used", "expired"];
    expect(kinds).to.include(spent.get("new"));
  });
});
