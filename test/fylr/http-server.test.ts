import { expect } from "chai";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import * as http2 from "node:http2";
import { once } from "node:events";
import * as net from "node:net";
import { PassThrough } from "node:stream";
import { PipeService } from "../../gen/slotbroker/v1/pipe_pb.js";
import {
  classifyPreface,
  HTTP2_PREFACE,
  matchPath,
  pipeUrls,
  registerPipeService,
  sendText,
  startFylrHttpServer,
  type FylrHttpServer,
} from "../../src/fylr/index.js";
import { ConfigError } from "../../src/shared/errors.js";
import { release, track } from "../../harness/resources.js";
import { curl, randomPayload, releaseAll, sha256, statusAndBody, streaming, trackedRegistry, trackedServer } from "./pipes-support.js";

function get(url: string, extra: string[] = []): Promise<{ status: number; body: string }> {
  return curl(["-w", "\n%{http_code}", ...extra, url]).then(statusAndBody);
}

/** A raw HTTP/1.1 exchange whose request bytes are sent in the given pieces, one per macrotask. */
async function rawExchange(port: number, pieces: string[]): Promise<string> {
  const socket = track(net.connect(port, "127.0.0.1"), "raw socket", (s) => {
    s.destroy();
  });
  socket.setNoDelay(true);
  let text = "";
  socket.on("data", (d: Buffer) => (text += d.toString()));
  const closed = new Promise((resolve) => socket.once("close", resolve));
  await new Promise((resolve) => socket.once("connect", resolve));
  for (const piece of pieces) {
    socket.write(piece);
    // Pacing, the thing under test: each piece reaches the server on its own.
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  await closed;
  await release(socket);
  return text;
}

/** A loopback TCP proxy that splits the client's first write in two, the preface torn apart. */
async function splittingProxy(port: number, at: number): Promise<net.Server> {
  const proxy = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1");
    upstream.setNoDelay(true);
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    upstream.pipe(client);
    let first = true;
    client.on("data", (chunk: Buffer) => {
      if (!first) {
        upstream.write(chunk);
        return;
      }
      first = false;
      client.pause();
      upstream.write(chunk.subarray(0, at));
      // Pacing, the thing under test: the rest of the preface comes in a later packet.
      setTimeout(() => {
        upstream.write(chunk.subarray(at));
        client.resume();
      }, 20);
    });
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  return track(proxy, "splitting proxy", (p) => new Promise<void>((resolve) => p.close(() => resolve())));
}

describe("fylr HTTP server", () => {
  it("classifies the first bytes of a connection", () => {
    expect(classifyPreface(HTTP2_PREFACE)).to.equal("h2");
    expect(classifyPreface(Buffer.concat([HTTP2_PREFACE, Buffer.from([0, 0, 0, 4])]))).to.equal("h2");
    expect(classifyPreface(HTTP2_PREFACE.subarray(0, 5))).to.equal("undecided");
    expect(classifyPreface(Buffer.from("PRI * HTTP/1.1"))).to.equal("h1");
    expect(classifyPreface(Buffer.from("GET / HTTP/1.1\r\n"))).to.equal("h1");
    expect(classifyPreface(Buffer.from("P"))).to.equal("undecided");
    expect(classifyPreface(Buffer.from("G"))).to.equal("h1");
  });

  it("matches raw route patterns segment by segment", () => {
    expect(matchPath("/pipe/in/:id", "/pipe/in/Ab_-9?x=1")).to.deep.equal({ id: "Ab_-9" });
    expect(matchPath("/pipe/in/:id", "/pipe/in/")).to.equal(undefined);
    expect(matchPath("/pipe/in/:id", "/pipe/in/a/b")).to.equal(undefined);
    expect(matchPath("/pipe/in/:id", "/pipe/out/a")).to.equal(undefined);
    expect(matchPath("/pipe/in/:id", "/pipe/in/%E0%A4%A")).to.equal(undefined);
    expect(matchPath("/healthz", "/healthz")).to.deep.equal({});
    expect(matchPath("/healthz", "/healthz?x=1")).to.deep.equal({});
    expect(matchPath("/healthz", "/healthzz")).to.equal(undefined);
    expect(matchPath("/queue/items/:id/output", "/queue/items/a%2Fb/output")).to.deep.equal({ id: "a/b" });
    expect(matchPath("/queue/items/:id/output", "/queue/items/a/outpu")).to.equal(undefined);
    expect(matchPath("/queue/items/:id/output", "/slotbroker.v1.QueueService/Submit")).to.equal(undefined);
  });

  describe("on a running server", () => {
    let server: FylrHttpServer;
    afterEach(() => releaseAll(server));

    it("serves HTTP/1.1 and cleartext HTTP/2 on the same port", async () => {
      server = await trackedServer();
      expect(await get(`${server.url}/healthz`)).to.deep.equal({ status: 200, body: "ok\n" });
      const h2 = await curl(["-i", "--http2-prior-knowledge", `${server.url}/healthz`]);
      expect(h2.stdout.toString()).to.match(/^HTTP\/2 200/);
    });

    it("tells the protocols apart when the first bytes arrive in pieces", async () => {
      server = await trackedServer();
      const h1 = await rawExchange(server.port, ["G", "ET /heal", "thz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"]);
      expect(h1).to.match(/^HTTP\/1\.1 200 OK/);
      expect(h1).to.match(/\r\n\r\nok\n$/);
      const proxy = await splittingProxy(server.port, 7);
      const port = (proxy.address() as net.AddressInfo).port;
      const h2 = await curl(["-i", "--http2-prior-knowledge", `http://127.0.0.1:${port}/healthz`]);
      expect(h2.stdout.toString()).to.match(/^HTTP\/2 200/);
      await release(proxy);
    });

    it("answers /healthz with 503 when the health check fails", async () => {
      let healthy = true;
      server = await trackedServer({ health: () => (healthy ? { ok: true } : { ok: false, detail: "broker down" }) });
      expect((await get(`${server.url}/healthz`)).status).to.equal(200);
      healthy = false;
      expect(await get(`${server.url}/healthz`)).to.deep.equal({ status: 503, body: "broker down\n" });
    });

    it("takes more raw routes and Connect services, and answers unknown paths with 404", async () => {
      const registry = trackedRegistry();
      server = await trackedServer({
        rawRoutes: [
          {
            path: "/hello/:name",
            methods: ["GET"],
            handle: ({ res, params }) => sendText(res, 200, `hello ${params.name}`),
          },
        ],
        connectRoutes: (router) => registerPipeService(router, registry),
      });
      expect(await get(`${server.url}/hello/w%20rld`)).to.deep.equal({ status: 200, body: "hello w rld\n" });
      expect((await curl(["-w", "\n%{http_code}", "-X", "POST", `${server.url}/hello/x`]).then(statusAndBody)).status).to.equal(405);
      expect(await get(`${server.url}/nothing/here`)).to.deep.equal({ status: 404, body: "no route for GET /nothing/here\n" });
      // Without `registry` there are no raw pipe routes, but the Connect service is there.
      const pipe = registry.createInPipe(Buffer.from("via connect"));
      expect((await get(`${server.url}/pipe/in/${pipe.id}`)).status).to.equal(404);
      const client = createClient(PipeService, createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }));
      const parts: Uint8Array[] = [];
      for await (const m of client.read({ pipeId: pipe.id })) parts.push(m.chunk);
      expect(Buffer.concat(parts).toString()).to.equal("via connect");
      await releaseAll(registry);
    });

    it("refuses a malformed listen address", async () => {
      let error: unknown;
      try {
        await startFylrHttpServer({ listen: "localhost" });
      } catch (err) {
        error = err;
      }
      expect(error).to.be.instanceOf(ConfigError);
    });
  });

  describe("closing", () => {
    it("stops accepting, lets an in-flight transfer finish, and is idempotent", async () => {
      const registry = trackedRegistry();
      const server = await startFylrHttpServer({ listen: "127.0.0.1:0", registry, closeTimeoutMs: 20_000 });
      track(server, "fylr http server", (s) => s.close());
      const source = new PassThrough();
      const payload = randomPayload(300_000);
      source.write(payload.subarray(0, 1000));
      const pipe = registry.createInPipe(source);
      const reading = curl(["-f", `${server.url}/pipe/in/${pipe.id}`]);
      await streaming(pipe);
      const closing = server.close();
      expect(server.close()).to.equal(closing);
      const refused = await curl(["-f", `${server.url}/healthz`]);
      expect(refused.code).to.equal(7); // curl: could not connect
      source.end(payload.subarray(1000));
      const result = await reading;
      expect(result.code, result.stderr).to.equal(0);
      expect(sha256(result.stdout)).to.equal(sha256(payload));
      await closing;
      await releaseAll(server, registry);
    });

    it("lets an HTTP/2 stream finish during a graceful close", async () => {
      const registry = trackedRegistry();
      const server = await startFylrHttpServer({ listen: "127.0.0.1:0", registry, closeTimeoutMs: 20_000 });
      track(server, "fylr http server", (s) => s.close());
      const source = new PassThrough();
      source.write("first ");
      const pipe = registry.createInPipe(source);
      const session = track(http2.connect(server.url), "h2 session", (s) => s.destroy());
      session.on("error", () => undefined);
      const stream = session.request({ ":path": `/pipe/in/${pipe.id}` });
      let body = "";
      stream.on("data", (d: Buffer) => (body += d.toString()));
      const ended = new Promise((resolve) => stream.once("end", resolve));
      if (body.length === 0) await once(stream, "data");
      const closing = server.close();
      source.end("and last");
      await ended;
      expect(body).to.equal("first and last");
      await closing;
      await release(session);
      await releaseAll(server, registry);
    });

    it("destroys what is still running when the close timeout passes", async () => {
      const registry = trackedRegistry();
      const server = await startFylrHttpServer({ listen: "127.0.0.1:0", registry, closeTimeoutMs: 100 });
      track(server, "fylr http server", (s) => s.close());
      const source = new PassThrough();
      source.write("never finishes");
      const pipe = registry.createInPipe(source);
      const reading = curl([`${server.url}/pipe/in/${pipe.id}`]);
      await streaming(pipe);
      await server.close();
      const result = await reading;
      expect(result.code).to.not.equal(0);
      expect(result.stdout.toString()).to.equal("never finishes");
      expect(pipe.state).to.equal("aborted");
      await releaseAll(server, registry);
    });
  });

  describe("pipe URLs", () => {
    it("builds in and out URLs and brackets IPv6 hosts", () => {
      expect(pipeUrls("10.0.0.5", 7700, { in: "abc", out: "def" })).to.deep.equal({
        in: "http://10.0.0.5:7700/pipe/in/abc",
        out: "http://10.0.0.5:7700/pipe/out/def",
      });
      expect(pipeUrls("::1", 80, { in: "x" })).to.deep.equal({ in: "http://[::1]:80/pipe/in/x" });
      expect(pipeUrls("fe80::1%eth0", 80, { out: "y" }).out).to.equal("http://[fe80::1%25eth0]:80/pipe/out/y");
      expect(pipeUrls("[::1]", 80, { in: "z" }).in).to.equal("http://[::1]:80/pipe/in/z");
      expect(new URL(pipeUrls("::1", 7700, { in: "Ab_-9" }).in!).pathname).to.equal("/pipe/in/Ab_-9");
    });
  });
});
