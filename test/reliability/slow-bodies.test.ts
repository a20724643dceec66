// Request bodies have a deadline and a minimum rate on every HTTP listener, with real
// processes: slow-body connections to a fylr's HTTP port (HTTP/1.1 and HTTP/2) and to an
// execserver's admin and legacy ports are cut within `bodyTimeout`, while normal requests
// are served meanwhile, fast uploads of any size go through, and bodies whose sender the
// route trusts (a pipe's stdout, a redeemed legacy job's stdin) may pause for longer.
import * as http from "node:http";
import * as http2 from "node:http2";
import { connect, type Socket } from "node:net";
import { Readable } from "node:stream";
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { followItem, uploadInput } from "../../src/api/index.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "../integration/support.js";

const SLOW = 50;
// Short deadlines keep the test quick: 2 s of slack, 1 KiB/s.
const body = { bodyTimeout: "2s", bodyMinRate: "1KiB" };

interface SlowBody {
  readonly socket: Socket;
  /** What the server wrote back before it closed the connection. */
  answer(): string;
  readonly closedAfterMs: Promise<number>;
}

/** Opens a connection, sends `head` and then one byte of body every 500 ms (2 bytes/s). */
function slowBody(address: string, head: string): Promise<SlowBody> {
  const [host, port] = address.split(":") as [string, string];
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), host, () => {
      const since = Date.now();
      socket.write(head);
      const drip = setInterval(() => socket.writable && socket.write("{"), 500);
      let answer = "";
      socket.on("data", (b: Buffer) => (answer += b.toString("latin1")));
      socket.on("error", () => undefined);
      const closedAfterMs = new Promise<number>((done) =>
        socket.once("close", () => {
          clearInterval(drip);
          done(Date.now() - since);
        }),
      );
      resolve({ socket, answer: () => answer, closedAfterMs });
    });
    socket.once("error", reject);
  });
}

/** Resolves with how long each took to close; fails naming how many were still open after `ms`. */
async function allClosedWithin(slow: readonly SlowBody[], ms: number, what: string): Promise<number[]> {
  const open = (): number => slow.filter((s) => !s.socket.destroyed).length;
  await waitFor(`${what}: all ${slow.length} slow bodies to be cut (${open()} open)`, () => open() === 0, ms, 50);
  return Promise.all(slow.map((s) => s.closedAfterMs));
}

function post(path: string, extra = ""): string {
  return `POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n${extra}\r\n`;
}

describe("reliability: slow request bodies are cut on every HTTP listener", () => {
  let databaseUrl: string;
  let pool: pg.Pool | undefined;
  let exec: ExecserverProcess | undefined;
  let fylr: FylrProcess | undefined;
  const sockets: Socket[] = [];

  before(async function () {
    this.timeout(60_000);
    databaseUrl = await createTestDatabase("slow_bodies");
    pool = openPool(databaseUrl);
    exec = await spawnExecserver({
      instanceId: "exec-slow-bodies",
      waitgroups: { w: { processes: 4 } },
      services: { echo: { waitgroup: "w", command: ["echo"] }, sh: { waitgroup: "w", command: ["sh", "-c"] }, cat: { waitgroup: "w", command: ["cat"] } },
      adminHttp: body,
      legacy: { enabled: true, listen: "127.0.0.1:0" },
    });
    fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec.grpcAddress], { http: body }), "f-slow-bodies");
  });
  afterEach(() => {
    for (const s of sockets.splice(0)) s.destroy();
  });
  after(async () => {
    await closeAll(fylr, exec, pool);
  });

  it("cuts 50 slow Submit bodies (HTTP/1.1) and 10 slow HTTP/2 streams on the fylr within bodyTimeout; submits go on meanwhile", async function () {
    this.timeout(60_000);
    const address = new URL(fylr!.url).host;
    const slow = await Promise.all(Array.from({ length: SLOW }, () => slowBody(address, post("/slotbroker.v1.QueueService/Submit"))));
    sockets.push(...slow.map((s) => s.socket));
    // HTTP/2 (how gRPC clients reach this port): ten streams on one connection, trickling.
    const session = http2.connect(fylr!.url);
    session.on("error", () => undefined);
    const streams = Array.from({ length: 10 }, () => {
      const stream = session.request({ ":method": "POST", ":path": "/slotbroker.v1.QueueService/Submit", "content-type": "application/json" });
      stream.on("error", () => undefined);
      stream.resume();
      return stream;
    });
    const drip = setInterval(() => {
      for (const stream of streams) if (stream.writable) stream.write("{");
    }, 500);
    try {
      // Normal work meanwhile.
      const submitted = await fylr!.client.submit({ calls: [{ service: "echo", args: ["meanwhile"] }] });
      expect((await followItem(fylr!.client, submitted.item!.id)).state).to.equal(ItemState.SUCCEEDED);
      const times = await allClosedWithin(slow, 10_000, "fylr HTTP/1.1");
      expect(Math.min(...times), "cut before bodyTimeout").to.be.greaterThan(1_500);
      expect(slow.filter((s) => s.answer().startsWith("HTTP/1.1 408 ")).length, "answered 408").to.equal(SLOW);
      expect(slow[0]!.answer()).to.match(/request body too slow: it must keep up 1024 bytes\/s, with 2000 ms of slack/);
      await waitFor("the HTTP/2 streams to be reset", () => streams.every((s) => s.closed), 10_000, 50);
      expect(streams.map((s) => s.rstCode)).to.deep.equal(Array<number>(10).fill(http2.constants.NGHTTP2_CANCEL));
    } finally {
      clearInterval(drip);
      session.destroy();
    }
    expect((await fetch(`${fylr!.url}/healthz`)).status).to.equal(200);
  });

  it("cuts 50 slow bodies on the execserver's admin port and 50 on its legacy port; both keep serving", async function () {
    this.timeout(60_000);
    // Both answer at once (no such route; a bad token); the bodies they carry are still timed.
    const admin = await Promise.all(Array.from({ length: SLOW }, () => slowBody(exec!.adminAddress, post("/upload"))));
    const legacy = await Promise.all(Array.from({ length: SLOW }, () => slowBody(exec!.legacyAddress!, post("/job?token=nope").replace("POST", "PUT"))));
    sockets.push(...admin.map((s) => s.socket), ...legacy.map((s) => s.socket));
    expect((await fetch(`http://${exec!.adminAddress}/healthz`)).status).to.equal(200);
    const token = (await (await fetch(`http://${exec!.legacyAddress}/token/echo`)).json()) as { token: string };
    const ran = await fetch(`http://${exec!.legacyAddress}/job?token=${token.token}&job=${encodeURIComponent(JSON.stringify({ args: ["hi"] }))}`, { method: "PUT" });
    expect([ran.status, await ran.text()]).to.deep.equal([200, "hi\n"]);
    const times = [...(await allClosedWithin(admin, 10_000, "admin port")), ...(await allClosedWithin(legacy, 10_000, "legacy port"))];
    expect(Math.min(...times)).to.be.greaterThan(1_500);
    expect(admin.every((s) => s.answer().startsWith("HTTP/1.1 404 ")), admin[0]!.answer()).to.equal(true);
    expect(legacy.every((s) => s.answer().startsWith("HTTP/1.1 404 ")), legacy[0]!.answer()).to.equal(true);
    expect((await fetch(`http://${exec!.adminAddress}/healthz`)).status).to.equal(200);
  });

  it("lets a fast upload of any length through, and a steady one well past bodyTimeout", async function () {
    this.timeout(60_000);
    const big = Buffer.alloc(32 << 20, 7);
    expect((await uploadInput(fylr!.url, Readable.from([big]), { size: big.length })).size).to.equal(big.length);
    // 4 KiB every 250 ms (16 KiB/s) for 5 s: slower than a burst, faster than 1 KiB/s.
    async function* steady(): AsyncGenerator<Buffer> {
      for (let i = 0; i < 20; i++) {
        yield Buffer.alloc(4096, i);
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    expect((await uploadInput(fylr!.url, Readable.from(steady()))).size).to.equal(20 * 4096);
  });

  it("does not time trusted bodies: a job's stdout pausing past bodyTimeout, a legacy job's stdin likewise", async function () {
    this.timeout(60_000);
    // Past 4000 bytes the runner streams stdout into the fylr's pipe; then 3 s of silence.
    const submitted = await fylr!.client.submit({ calls: [{ service: "sh", args: ["head -c 5000 /dev/zero; sleep 3; echo end"] }], maxAttempts: 1 });
    const item = await followItem(fylr!.client, submitted.item!.id);
    expect(item.state, item.error).to.equal(ItemState.SUCCEEDED);
    expect(Number(item.outputSize)).to.equal(5004);
    // A legacy job whose stdin pauses for 3 s.
    const token = (await (await fetch(`http://${exec!.legacyAddress}/token/cat`)).json()) as { token: string };
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(`http://${exec!.legacyAddress}/job?token=${token.token}`, { method: "PUT" }, (res) => {
        let text = "";
        res.setEncoding("utf8").on("data", (s: string) => (text += s));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
      });
      req.on("error", reject);
      req.write("first ");
      setTimeout(() => req.end("second"), 3_000);
    });
    expect(answer).to.deep.equal({ status: 200, body: "first second" });
  });
});
