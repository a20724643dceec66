// The fylr's broker connection against a stock grpc-go server (test/ecosystem/polyglot/grpc-go-server,
// default keepalive enforcement: at most one HTTP/2 PING per 5 minutes). With the fylr's
// default timings (HTTP/2 keepalive every 5 minutes) it stays connected — liveness rides
// the stream as Ping/Pong frames — while a client whose HTTP/2 PINGs come more often than
// the server's policy allows (every second here; the old default was every 10 s) is cut
// off with GOAWAY "too_many_pings".
import { expect } from "chai";
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { ConnectResponseSchema } from "../../../gen/slotbroker/v1/broker_pb.js";
import { BrokerConnection, type ConnectionState } from "../../../src/fylr/broker/index.js";
import { waitForOutput } from "../../../harness/child-output.js";
import { release, track } from "../../../harness/resources.js";
import { root } from "../../integration/support.js";
import { run } from "./support.js";

const hello = create(ConnectResponseSchema, {
  frame: {
    case: "hello",
    value: { instanceId: "grpc-go", services: { noop: "w" }, waitgroups: [{ name: "w", processes: 1 }], clients: 1, capabilities: [] },
  },
});

describe("the fylr's broker connection against a stock grpc-go server (keepalive)", function () {
  this.timeout(60_000);
  let server: ChildProcess;
  let address: string;

  before(async function () {
    this.timeout(600_000);
    const bin = join(root, "tools/bin/grpc-go-server");
    const build = await run("go", ["build", "-o", bin, "."], { cwd: join(root, "test/ecosystem/polyglot/grpc-go-server"), timeoutMs: 540_000 });
    expect(build.code, `go build failed (Go is required): ${build.stderr}`).to.equal(0);
    server = spawn(bin, [Buffer.from(toBinary(ConnectResponseSchema, hello)).toString("hex")], { stdio: ["ignore", "pipe", "pipe"] });
    track(server, "grpc-go server", (s) => {
      s.kill("SIGKILL");
    });
    address = (await waitForOutput(server, /^listening (\S+)$/m, { timeoutMs: 10_000 }))[1]!;
  });

  after(() => release(server));
  afterEach(async () => {
    for (const conn of opened.splice(0)) await release(conn);
  });
  const opened: BrokerConnection[] = [];

  function connect(timings: ConstructorParameters<typeof BrokerConnection>[0]["timings"]): { conn: BrokerConnection; states: ConnectionState[]; rtts: number[] } {
    const conn = track(new BrokerConnection({ address, clientName: "keepalive-test", timings }), "broker connection", (c) => c.close());
    const states: ConnectionState[] = [];
    const rtts: number[] = [];
    conn.on("state", (s) => states.push(s));
    conn.on("rtt", (ms) => rtts.push(ms));
    conn.start();
    opened.push(conn);
    return { conn, states, rtts };
  }

  async function until(what: string, done: () => boolean, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!done()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  it("stays connected with the default timings: HELLO, then a Pong for every Ping, nothing dropped", async () => {
    const { conn, states, rtts } = connect({ pingIntervalMs: 200 });
    await until("ready", () => conn.state === "ready", 10_000);
    expect(conn.hello?.instanceId).to.equal("grpc-go");
    await until("10 pongs", () => rtts.length >= 10, 10_000);
    expect(states).to.deep.equal(["connecting", "ready"]);
  });

  it("is cut off with GOAWAY too_many_pings when it sends HTTP/2 PINGs more often than the server allows", async () => {
    const { conn, states } = connect({ keepaliveTimeMs: 1000, keepaliveTimeoutMs: 1000, pingIntervalMs: 600_000 });
    await until("ready", () => conn.state === "ready", 10_000);
    await until("the stream to drop", () => states.includes("backoff"), 20_000);
    // grpc-js words the HTTP/2 error ENHANCE_YOUR_CALM that comes with the GOAWAY like this.
    expect(conn.lastError?.message, "why the stream ended").to.match(/Bandwidth exhausted or memory limit exceeded/);
  });
});
