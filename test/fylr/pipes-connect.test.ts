import { expect } from "chai";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { Readable } from "node:stream";
import { PipeService, type WriteRequest } from "../../gen/slotbroker/v1/pipe_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { WriteRequestSchema } from "../../gen/slotbroker/v1/pipe_pb.js";
import type { FylrHttpServer, PipeRegistry } from "../../src/fylr/index.js";
import { curl, HashingSink, pipeFailure, randomPayload, releaseAll, sha256, sinkGotBytes, trackedRegistry, trackedServer } from "./pipes-support.js";

type WriteInit = MessageInitShape<typeof WriteRequestSchema>;
const MiB = 1024 * 1024;

async function readAll(client: Client<typeof PipeService>, pipeId: string): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const message of client.read({ pipeId })) parts.push(message.chunk);
  return Buffer.concat(parts);
}

/** Turns messages into the async iterable a client-streaming call takes. */
async function* stream<T>(items: Iterable<T>): AsyncGenerator<T> {
  for (const item of items) yield await Promise.resolve(item);
}

function chunked(pipeId: string, payload: Uint8Array, size = 64 * 1024): AsyncGenerator<WriteInit> {
  const messages: WriteInit[] = [];
  for (let i = 0; i < payload.length; i += size) {
    messages.push({ pipeId: i === 0 ? pipeId : "", chunk: payload.subarray(i, i + size) });
  }
  return stream(messages);
}

async function connectCode(promise: Promise<unknown>): Promise<Code> {
  try {
    await promise;
  } catch (err) {
    return ConnectError.from(err).code;
  }
  throw new Error("expected the call to fail");
}

describe("PipeService over Connect", () => {
  let registry: PipeRegistry;
  let server: FylrHttpServer;
  let h2: Client<typeof PipeService>;
  let h1: Client<typeof PipeService>;
  beforeEach(async () => {
    registry = trackedRegistry();
    server = await trackedServer({ registry });
    h2 = createClient(PipeService, createConnectTransport({ baseUrl: server.url, httpVersion: "2" }));
    h1 = createClient(PipeService, createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }));
  });
  afterEach(() => releaseAll(server, registry));

  it("Read streams an in-pipe over HTTP/2", async () => {
    const payload = randomPayload(4 * MiB + 5);
    const pipe = registry.createInPipe(payload);
    expect(sha256(await readAll(h2, pipe.id))).to.equal(sha256(payload));
    expect(await pipe.done).to.equal(payload.length);
  });

  it("Read streams an in-pipe over HTTP/1.1", async () => {
    const payload = randomPayload(3 * MiB);
    const pipe = registry.createInPipe(Readable.from([payload.subarray(0, 10), payload.subarray(10)]));
    expect(sha256(await readAll(h1, pipe.id))).to.equal(sha256(payload));
    expect(await pipe.done).to.equal(payload.length);
  });

  it("Write fills an out-pipe over HTTP/2 and returns bytes_written", async () => {
    const payload = randomPayload(6 * MiB + 1);
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const response = await h2.write(chunked(pipe.id, payload));
    expect(response.bytesWritten).to.equal(BigInt(payload.length));
    expect(await pipe.done).to.equal(payload.length);
    expect(sink.digest()).to.equal(sha256(payload));
  });

  it("Write works over HTTP/1.1 with the Connect protocol: curl sends enveloped JSON chunks", async () => {
    const payload = randomPayload(300 * 1024);
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    // Connect streaming: each message is a flags byte, a 4-byte big-endian length, then JSON.
    const envelope = (message: object): Buffer => {
      const json = Buffer.from(JSON.stringify(message));
      const head = Buffer.alloc(5);
      head.writeUInt32BE(json.length, 1);
      return Buffer.concat([head, json]);
    };
    const body = Buffer.concat([
      envelope({ pipeId: pipe.id, chunk: payload.subarray(0, 100_000).toString("base64") }),
      envelope({ chunk: payload.subarray(100_000).toString("base64") }),
    ]);
    const result = await curl(
      ["--http1.1", "-X", "POST", "-H", "content-type: application/connect+json", "--data-binary", "@-", `${server.url}/slotbroker.v1.PipeService/Write`],
      body,
    );
    // The answer is enveloped too: the WriteResponse, then the end-of-stream message (flags 2).
    const out = result.stdout;
    const first = JSON.parse(out.subarray(5, 5 + out.readUInt32BE(1)).toString()) as { bytesWritten: string };
    expect(first.bytesWritten).to.equal(String(payload.length));
    expect(out[5 + out.readUInt32BE(1)]).to.equal(2);
    expect(sink.digest()).to.equal(sha256(payload));
    // connect-es over HTTP/1.1 does the same.
    const again = new HashingSink();
    const second = registry.createOutPipe(again);
    expect((await h1.write(chunked(second.id, payload))).bytesWritten).to.equal(BigInt(payload.length));
    expect(again.digest()).to.equal(sha256(payload));
  });

  it("speaks the gRPC protocol too", async () => {
    const grpc = createClient(PipeService, createGrpcTransport({ baseUrl: server.url }));
    const payload = randomPayload(MiB);
    const inPipe = registry.createInPipe(payload);
    expect(sha256(await readAll(grpc, inPipe.id))).to.equal(sha256(payload));
    const sink = new HashingSink();
    const outPipe = registry.createOutPipe(sink);
    expect((await grpc.write(chunked(outPipe.id, payload))).bytesWritten).to.equal(BigInt(payload.length));
    expect(sink.digest()).to.equal(sha256(payload));
  });

  it("maps an unknown id to NOT_FOUND and a used or expired one to FAILED_PRECONDITION", async () => {
    expect(await connectCode(readAll(h2, "AAAAAAAAAAAAAAAAAAAAAAAA"))).to.equal(Code.NotFound);
    expect(await connectCode(h2.write(chunked("AAAAAAAAAAAAAAAAAAAAAAAA", Buffer.from("x"))))).to.equal(Code.NotFound);
    const used = registry.createInPipe(Buffer.from("once"));
    await readAll(h1, used.id);
    expect(await connectCode(readAll(h1, used.id))).to.equal(Code.FailedPrecondition);
    const expired = registry.createOutPipe(new HashingSink(), { ttlMs: 20 });
    await pipeFailure(expired.done);
    expect(await connectCode(h2.write(chunked(expired.id, Buffer.from("late"))))).to.equal(Code.FailedPrecondition);
  });

  it("refuses a Write whose first message does not name the pipe", async () => {
    expect(await connectCode(h2.write(stream([{ chunk: Buffer.from("who am I") }])))).to.equal(Code.InvalidArgument);
    const pipe = registry.createOutPipe(new HashingSink());
    const switching: WriteInit[] = [
      { pipeId: pipe.id, chunk: Buffer.from("a") },
      { pipeId: "BBBBBBBBBBBBBBBBBBBBBBBB", chunk: Buffer.from("b") },
    ];
    expect(await connectCode(h2.write(stream(switching)))).to.equal(Code.InvalidArgument);
    expect((await pipeFailure(pipe.done)).kind).to.equal("aborted");
  });

  it("a Write the client aborts mid-stream aborts the pipe and errors the sink", async () => {
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const controller = new AbortController();
    async function* thenAbort(): AsyncGenerator<WriteInit> {
      yield { pipeId: pipe.id, chunk: randomPayload(128 * 1024) };
      await sinkGotBytes(sink);
      controller.abort();
      yield { chunk: randomPayload(128 * 1024) };
    }
    expect(await connectCode(h2.write(thenAbort(), { signal: controller.signal }))).to.equal(Code.Canceled);
    const err = await pipeFailure(pipe.done);
    expect(err.kind).to.equal("aborted");
    expect(sink.errored).to.equal(err);
    expect(sink.writableFinished).to.equal(false);
  });

  it("a Read the client cancels mid-stream aborts the in-pipe and destroys its source", async () => {
    const source = new Readable({
      read() {
        this.push(Buffer.alloc(64 * 1024, 1));
      },
    });
    const pipe = registry.createInPipe(source);
    const controller = new AbortController();
    const reading = (async () => {
      for await (const message of h2.read({ pipeId: pipe.id }, { signal: controller.signal })) {
        expect(message.chunk.length).to.be.greaterThan(0);
        controller.abort();
      }
    })();
    expect(await connectCode(reading)).to.equal(Code.Canceled);
    expect((await pipeFailure(pipe.done)).kind).to.equal("aborted");
    expect(source.destroyed).to.equal(true);
  });

  it("keeps concurrent Reads and Writes on one HTTP/2 connection apart", async () => {
    const payloads = Array.from({ length: 6 }, () => randomPayload(512 * 1024 + Math.floor(Math.random() * 999)));
    const ins = payloads.map((p) => registry.createInPipe(p));
    const sinks = payloads.map(() => new HashingSink());
    const outs = sinks.map((s) => registry.createOutPipe(s));
    const [read, written] = await Promise.all([
      Promise.all(ins.map((p) => readAll(h2, p.id))),
      Promise.all(outs.map((p, i) => h2.write(chunked(p.id, payloads[i]!, 10_000)))),
    ]);
    read.forEach((bytes, i) => expect(sha256(bytes)).to.equal(sha256(payloads[i]!)));
    written.forEach((r, i) => expect(r.bytesWritten).to.equal(BigInt(payloads[i]!.length)));
    sinks.forEach((s, i) => expect(s.digest()).to.equal(sha256(payloads[i]!)));
  });
});

// Keeps the WriteRequest import honest: the generated type is what the handler receives.
export type _WriteRequest = WriteRequest;
