import { expect } from "chai";
import { createReadStream, readFileSync } from "node:fs";
import * as http from "node:http";
import * as http2 from "node:http2";
import { join } from "node:path";
import { PassThrough, Readable } from "node:stream";
import type { FylrHttpServer, PipeRegistry } from "../../src/fylr/index.js";
import {
  HashingSink,
  curl,
  randomPayload,
  releaseAll,
  sha256,
  sinkGotBytes,
  statusAndBody,
  streaming,
  tempDir,
  trackedRegistry,
  pipeFailure,
  trackedServer,
} from "./pipes-support.js";

const MiB = 1024 * 1024;

describe("pipes over plain HTTP (native tools)", () => {
  let registry: PipeRegistry;
  let server: FylrHttpServer;
  beforeEach(async () => {
    registry = trackedRegistry();
    server = await trackedServer({ registry });
  });
  afterEach(() => releaseAll(server, registry));

  it("curl reads a multi-megabyte in-pipe fed from a file stream", async () => {
    const payload = randomPayload(6 * MiB + 123);
    const dir = tempDir();
    const file = dir.file("stdin.bin", payload);
    const pipe = registry.createInPipe(createReadStream(file));
    const out = join(dir.path, "got.bin");
    const result = await curl(["-f", "-o", out, `${server.url}/pipe/in/${pipe.id}`]);
    expect(result.code, result.stderr).to.equal(0);
    expect(sha256(readFileSync(out))).to.equal(sha256(payload));
    expect(await pipe.done).to.equal(payload.length);
    await releaseAll(dir);
  });

  it("curl reads an in-pipe over HTTP/2 with prior knowledge", async () => {
    const payload = randomPayload(3 * MiB);
    const pipe = registry.createInPipe(payload);
    const result = await curl(["-f", "--http2-prior-knowledge", `${server.url}/pipe/in/${pipe.id}`]);
    expect(result.code, result.stderr).to.equal(0);
    expect(sha256(result.stdout)).to.equal(sha256(payload));
    expect(await pipe.done).to.equal(payload.length);
  });

  it("curl -T - writes a multi-megabyte out-pipe (chunked upload from stdin)", async () => {
    const payload = randomPayload(8 * MiB + 7);
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const result = await curl(["-f", "-T", "-", `${server.url}/pipe/out/${pipe.id}`], Readable.from([payload]));
    expect(result.code, result.stderr).to.equal(0);
    expect(result.stdout.toString()).to.match(new RegExp(`^${payload.length} bytes written`));
    expect(await pipe.done).to.equal(payload.length);
    expect(sink.digest()).to.equal(sha256(payload));
  });

  it("curl --data-binary @file writes an out-pipe with a Content-Length body", async () => {
    const payload = randomPayload(5 * MiB);
    const dir = tempDir();
    const file = dir.file("stdout.bin", payload);
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const result = await curl(["-f", "-X", "PUT", "--data-binary", `@${file}`, `${server.url}/pipe/out/${pipe.id}`]);
    expect(result.code, result.stderr).to.equal(0);
    expect(await pipe.done).to.equal(payload.length);
    expect(sink.digest()).to.equal(sha256(payload));
    await releaseAll(dir);
  });

  it("curl writes an out-pipe over HTTP/2 with prior knowledge", async () => {
    const payload = randomPayload(4 * MiB);
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const result = await curl(["-f", "--http2-prior-knowledge", "-T", "-", `${server.url}/pipe/out/${pipe.id}`], payload);
    expect(result.code, result.stderr).to.equal(0);
    expect(await pipe.done).to.equal(payload.length);
    expect(sink.digest()).to.equal(sha256(payload));
  });

  it("a pipe cannot be used twice: the second GET answers 410 Gone", async () => {
    const pipe = registry.createInPipe(Buffer.from("once\n"));
    const url = `${server.url}/pipe/in/${pipe.id}`;
    const first = statusAndBody(await curl(["-w", "\n%{http_code}", url]));
    expect(first).to.deep.equal({ status: 200, body: "once\n" });
    const second = statusAndBody(await curl(["-w", "\n%{http_code}", url]));
    expect(second.status).to.equal(410);
    expect(second.body).to.equal("pipe already used\n");
    const out = registry.createOutPipe(new HashingSink());
    const put = (): Promise<{ status: number; body: string }> =>
      curl(["-w", "\n%{http_code}", "-T", "-", `${server.url}/pipe/out/${out.id}`], Buffer.from("x")).then(statusAndBody);
    expect((await put()).status).to.equal(200);
    expect((await put()).status).to.equal(410);
  });

  it("an unknown id answers 404, an id on the wrong route too", async () => {
    const unknown = statusAndBody(await curl(["-w", "\n%{http_code}", `${server.url}/pipe/in/AAAAAAAAAAAAAAAAAAAAAAAA`]));
    expect(unknown).to.deep.equal({ status: 404, body: "no such in-pipe\n" });
    const inPipe = registry.createInPipe(Buffer.from("x"));
    const crossed = await curl(["-w", "\n%{http_code}", "-T", "-", `${server.url}/pipe/out/${inPipe.id}`], Buffer.from("y"));
    expect(statusAndBody(crossed).status).to.equal(404);
    inPipe.cancel();
  });

  it("a wrong method answers 405 with Allow", async () => {
    const pipe = registry.createInPipe(Buffer.from("x"));
    const result = await curl(["-i", "-X", "DELETE", `${server.url}/pipe/in/${pipe.id}`]);
    const text = result.stdout.toString();
    expect(text).to.match(/^HTTP\/1\.1 405/);
    expect(text).to.match(/allow: GET/i);
    expect(text).to.match(/method DELETE is not allowed here; use GET\n$/);
    expect(pipe.state).to.equal("waiting");
    pipe.cancel();
  });

  it("an expired out-pipe rejects its promise and answers 410 afterwards", async () => {
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink, { ttlMs: 30 });
    const err = await pipeFailure(pipe.done);
    expect(err.message).to.match(/pipe expired unused/);
    expect(sink.errored).to.equal(err);
    const late = statusAndBody(await curl(["-w", "\n%{http_code}", "-T", "-", `${server.url}/pipe/out/${pipe.id}`], Buffer.from("late")));
    expect(late).to.deep.equal({ status: 410, body: "pipe expired unused\n" });
  });

  it("an expired in-pipe destroys its source and answers 410 afterwards", async () => {
    const source = new PassThrough();
    const closed = new Promise((resolve) => source.once("close", resolve));
    const pipe = registry.createInPipe(source, { ttlMs: 30 });
    await closed;
    expect((await pipeFailure(pipe.done)).kind).to.equal("expired");
    const late = statusAndBody(await curl(["-w", "\n%{http_code}", `${server.url}/pipe/in/${pipe.id}`]));
    expect(late.status).to.equal(410);
  });

  for (const framing of ["chunked", "content-length"] as const) {
    it(`an upload cut off mid-body (${framing}) rejects the out-pipe and errors the sink`, async () => {
      const sink = new HashingSink();
      const pipe = registry.createOutPipe(sink);
      const half = randomPayload(512 * 1024);
      const headers: http.OutgoingHttpHeaders = framing === "chunked" ? {} : { "content-length": String(2 * half.length) };
      const req = http.request(`${server.url}/pipe/out/${pipe.id}`, { method: "PUT", headers });
      req.on("error", () => undefined);
      req.write(half);
      // Cut the connection only once the server has really passed bytes to the sink.
      await sinkGotBytes(sink);
      req.destroy();
      const err = await pipeFailure(pipe.done);
      expect(err.kind).to.equal("aborted");
      expect(sink.errored).to.equal(err);
      expect(sink.writableFinished).to.equal(false);
      const again = statusAndBody(await curl(["-w", "\n%{http_code}", "-T", "-", `${server.url}/pipe/out/${pipe.id}`], Buffer.from("x")));
      expect(again.status).to.equal(410);
    });
  }

  it("an HTTP/2 upload reset mid-body rejects the out-pipe (not a short success)", async () => {
    const sink = new HashingSink();
    const pipe = registry.createOutPipe(sink);
    const session = http2.connect(server.url);
    session.on("error", () => undefined);
    const stream = session.request({ ":method": "PUT", ":path": `/pipe/out/${pipe.id}` });
    stream.on("error", () => undefined);
    stream.write(randomPayload(256 * 1024));
    await sinkGotBytes(sink);
    stream.close(http2.constants.NGHTTP2_CANCEL);
    const err = await pipeFailure(pipe.done);
    expect(err.kind).to.equal("aborted");
    expect(sink.errored).to.equal(err);
    session.destroy();
  });

  it("a reader that disconnects mid-body aborts the in-pipe and destroys its source", async () => {
    let produced = 0;
    const source = new Readable({
      read() {
        produced += 64 * 1024;
        this.push(Buffer.alloc(64 * 1024, 7));
      },
    });
    const pipe = registry.createInPipe(source);
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      http.get(`${server.url}/pipe/in/${pipe.id}`, resolve).on("error", reject);
    });
    res.on("error", () => undefined);
    await new Promise((resolve) => res.once("data", resolve));
    res.destroy();
    const err = await pipeFailure(pipe.done);
    expect(err.kind).to.equal("aborted");
    expect(source.destroyed).to.equal(true);
    expect(produced).to.be.greaterThan(0);
  });

  it("an in-pipe whose source fails mid-stream breaks the transfer instead of ending it cleanly", async () => {
    const source = new PassThrough();
    const pipe = registry.createInPipe(source);
    source.write(randomPayload(100_000));
    const result = curl(["-f", `${server.url}/pipe/in/${pipe.id}`]);
    await streaming(pipe);
    source.destroy(new Error("stdin producer crashed"));
    const done = await result;
    expect(done.code).to.not.equal(0);
    expect(done.stderr).to.match(/transfer closed|outstanding|(18)/);
    expect((await pipeFailure(pipe.done)).message).to.match(/stdin producer crashed/);
  });

  it("concurrent pipes don't interfere", async () => {
    const n = 8;
    const payloads = Array.from({ length: n }, () => randomPayload(MiB + Math.floor(Math.random() * 1000)));
    const ins = payloads.map((p) => registry.createInPipe(Readable.from([p.subarray(0, 1000), p.subarray(1000)])));
    const sinks = payloads.map(() => new HashingSink());
    const outs = sinks.map((s) => registry.createOutPipe(s));
    const reads = ins.map((pipe, i) =>
      curl(["-f", ...(i % 2 ? ["--http2-prior-knowledge"] : []), `${server.url}/pipe/in/${pipe.id}`]),
    );
    const writes = outs.map((pipe, i) =>
      curl(["-f", ...(i % 2 ? [] : ["--http2-prior-knowledge"]), "-T", "-", `${server.url}/pipe/out/${pipe.id}`], payloads[i]),
    );
    const got = await Promise.all(reads);
    got.forEach((r, i) => expect(sha256(r.stdout), `in-pipe ${i}`).to.equal(sha256(payloads[i]!)));
    const put = await Promise.all(writes);
    put.forEach((r) => expect(r.code, r.stderr).to.equal(0));
    const bytes = await Promise.all(outs.map((p) => p.done));
    bytes.forEach((b, i) => expect(b).to.equal(payloads[i]!.length));
    sinks.forEach((s, i) => expect(s.digest(), `out-pipe ${i}`).to.equal(sha256(payloads[i]!)));
  });

  it("closing the registry answers 503 and rejects what was pending", async () => {
    const pipe = registry.createOutPipe(new HashingSink());
    registry.close();
    expect((await pipeFailure(pipe.done)).kind).to.equal("closed");
    const late = statusAndBody(await curl(["-w", "\n%{http_code}", "-T", "-", `${server.url}/pipe/out/${pipe.id}`], Buffer.from("x")));
    expect(late.status).to.equal(503);
  });
});

