import { expect } from "chai";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import * as http from "node:http";
import * as http2 from "node:http2";
import { gunzipSync } from "node:zlib";
import { once } from "node:events";
import { GetRequestSchema, QueueService, StatsRequestSchema } from "../../gen/slotbroker/v1/queue_pb.js";
import { defaultHttpLimits } from "../../src/shared/http-limits.js";
import { nodeRequestKey, type FylrHttpServer } from "../../src/fylr/index.js";
import { release, track } from "../../harness/resources.js";
import { releaseAll, trackedServer } from "./pipes-support.js";

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

const dropped = new Set(["date", "connection", "keep-alive", "transfer-encoding", "content-length"]);

// Headers that say something about the call (the transport's own ones left out).
function callHeaders(raw: http.IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(raw)) if (!dropped.has(k) && !k.startsWith(":") && v !== undefined) out[k] = String(v);
  return out;
}

function decoded(headers: http.IncomingHttpHeaders, body: Buffer): string {
  return (headers["content-encoding"] === "gzip" ? gunzipSync(body) : body).toString("base64");
}

// HTTP/1.1 takes the direct path; `chunked` sends the body without Content-Length.
function h1(url: string, path: string, headers: Record<string, string>, body: Uint8Array, chunked = false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${path}`, { method: "POST", headers: chunked ? headers : { ...headers, "content-length": body.byteLength }, agent: false });
    req.on("error", reject);
    req.on("response", (res) => {
      const parts: Buffer[] = [];
      res.on("data", (c: Buffer) => parts.push(c));
      res.on("end", () => resolve({ status: res.statusCode!, headers: callHeaders(res.headers), body: decoded(res.headers, Buffer.concat(parts)) }));
    });
    if (chunked) req.write(body.subarray(0, 1));
    req.end(chunked ? body.subarray(1) : body);
  });
}

// HTTP/2 goes through Connect's generic handler: the reference.
async function h2(url: string, path: string, headers: Record<string, string>, body: Uint8Array): Promise<Answer> {
  const session = track(http2.connect(url), "h2 session", (s) => void s.close());
  try {
    return await new Promise((resolve, reject) => {
      const stream = session.request({ ":method": "POST", ":path": path, ...headers });
      stream.on("error", reject);
      let head: http2.IncomingHttpHeaders = {};
      stream.on("response", (h) => (head = h));
      const parts: Buffer[] = [];
      stream.on("data", (c: Buffer) => parts.push(c));
      stream.on("end", () => resolve({ status: Number(head[":status"]), headers: callHeaders(head), body: decoded(head, Buffer.concat(parts)) }));
      stream.end(body);
    });
  } finally {
    await release(session);
  }
}

describe("fylr HTTP server: unary Connect calls over HTTP/1.1 (the direct path)", () => {
  let server: FylrHttpServer;
  let seen: HandlerContext[] = [];
  afterEach(() => releaseAll(server));

  beforeEach(async () => {
    seen = [];
    server = await trackedServer({
      limits: { ...defaultHttpLimits, maxRequestBytes: 64 * 1024 },
      connectRoutes: (router) =>
        router.service(QueueService, {
          // Reads what a handler may read, sets headers and a trailer.
          stats: (_req, ctx) => {
            seen.push(ctx);
            ctx.responseHeader.set("x-seen-agent", ctx.requestHeader.get("x-agent") ?? "none");
            ctx.responseTrailer.set("x-done", "yes");
            return { fylrId: `${ctx.method.name} ${ctx.service.typeName} ${ctx.requestMethod} ${ctx.protocolName}` };
          },
          // Waits until the client goes away.
          position: async (_req, ctx) => {
            seen.push(ctx);
            await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
            return {};
          },
          get: (req) => {
            if (req.id === "plain") throw new Error("a plain error");
            if (req.id === "big") return { item: { id: "big", error: "x".repeat(20_000) } };
            throw new ConnectError(`no item ${req.id}`, Code.NotFound, { "x-why": "missing" });
          },
        }),
    });
  });

  const proto = { "content-type": "application/proto" };
  const json = { "content-type": "application/json" };
  const cases: [string, string, Record<string, string>, Uint8Array][] = [
    ["binary success with headers and a trailer", "Stats", { ...proto, "x-agent": "t" }, toBinary(StatsRequestSchema, create(StatsRequestSchema))],
    ["JSON success", "Stats", json, Buffer.from("{}")],
    ["a ConnectError with metadata", "Get", proto, toBinary(GetRequestSchema, create(GetRequestSchema, { id: "nope" }))],
    ["a plain error (internal)", "Get", json, Buffer.from('{"id":"plain"}')],
    ["an answer big enough to be compressed", "Get", { ...proto, "accept-encoding": "gzip" }, toBinary(GetRequestSchema, create(GetRequestSchema, { id: "big" }))],
    ["a body that is not protobuf", "Get", proto, Buffer.from([0xff, 0xff, 0xff])],
    ["JSON with an unknown field", "Get", json, Buffer.from('{"id":"a","typo":1}')],
    ["a body over the request limit", "Get", proto, Buffer.alloc(70 * 1024, 0x0a)],
  ];
  for (const [name, method, headers, body] of cases) {
    it(`answers like Connect's own handler: ${name}`, async () => {
      const path = `/slotbroker.v1.QueueService/${method}`;
      const withLength = { ...headers, "content-length": String(body.byteLength) };
      expect(await h1(server.url, path, headers, body)).to.deep.equal(await h2(server.url, path, withLength, body));
      expect(await h1(server.url, path, headers, body, true)).to.deep.equal(await h2(server.url, path, headers, body));
    });
  }

  it("gives the handler a signal that aborts once the call is over, and the node request", async () => {
    await h1(server.url, "/slotbroker.v1.QueueService/Stats", proto, new Uint8Array());
    const [ctx] = seen;
    expect(ctx!.signal.aborted).to.equal(true);
    expect(ctx!.values.get(nodeRequestKey)).to.be.instanceOf(http.IncomingMessage);
    expect(ctx!.url).to.equal(`${server.url}/slotbroker.v1.QueueService/Stats`);
    expect(ctx!.timeoutMs()).to.equal(undefined);
  });

  it("aborts the handler's signal when the client goes away before the answer", async () => {
    const req = http.request(`${server.url}/slotbroker.v1.QueueService/Position`, { method: "POST", headers: proto, agent: false });
    req.on("error", () => undefined);
    req.end();
    while (seen.length === 0) await new Promise((resolve) => setTimeout(resolve, 5));
    req.destroy();
    const ctx = seen[0]!;
    if (!ctx.signal.aborted) await once(ctx.signal, "abort");
    expect(ConnectError.from(ctx.signal.reason).code).to.equal(Code.Canceled);
  });
});
