import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { JobSpecSchema } from "../../gen/slotbroker/v1/broker_pb.js";
import { compileExecserverConfig } from "../../src/execserver/index.js";
import { startExecserver, type ExecserverHandle } from "../../src/app/execserver.js";
import { BrokerConnection, NoSlotError, brokerSlot, type ConnectionState } from "../../src/fylr/broker/index.js";
import { freePort } from "../../src/shared/free-port.js";
import { Code, SlotbrokerError } from "../../src/shared/errors.js";
import { spawnExecserver, waitFor } from "../../harness/execserver-process.js";
import { awaitCondition, emitterOf, eventsOf } from "../support/event-monitor.js";
import { startBroker } from "../support/fylr-replica.js";
import { release, track } from "../../harness/resources.js";
import { requireTool } from "../../harness/system-tools.js";
import { FakeExecserver } from "../fuzz/fake-execserver.js";

const services = { noop: { waitgroup: "w", builtin: "noop" as const } };

async function inProcess(extra: object): Promise<ExecserverHandle> {
  const config = compileExecserverConfig({ listen: "127.0.0.1:0", adminListen: "127.0.0.1:0", waitgroups: { w: { processes: 1 } }, services, ...extra });
  return track(await startExecserver(config), "execserver", (h) => h.forceClose());
}

function connection(address: string, extra: Partial<ConstructorParameters<typeof BrokerConnection>[0]> = {}): BrokerConnection {
  const conn = new BrokerConnection({
    address,
    clientName: "conn-test",
    timings: { backoff: { initialMs: 20, maxMs: 200 }, pingIntervalMs: 200, pingTimeoutMs: 500, helloTimeoutMs: 1000 },
    ...extra,
  });
  return track(conn, "broker connection", (c) => c.close());
}

describe("fylr broker connection", function () {
  this.timeout(60_000);

  it("sends the bearer token and its name; a wrong token never gets ready", async () => {
    const server = await inProcess({ token: "s3cret", instanceId: "auth" });
    try {
      const wrong = connection(server.grpcAddress, { token: "nope" });
      const states: ConnectionState[] = [];
      wrong.on("state", (s) => states.push(s));
      wrong.start();
      await awaitCondition("the refusal", [emitterOf(wrong, "state")], () => wrong.lastError);
      expect(wrong.lastError).to.be.instanceOf(SlotbrokerError);
      expect((wrong.lastError as SlotbrokerError).code).to.equal(Code.Unauthenticated);
      expect(wrong.lastError!.message).to.match(/refused the token \(UNAUTHENTICATED\)/);
      expect(wrong.lastError!.message).to.not.include("nope");
      expect(states).to.not.include("ready");
      await release(wrong);

      const right = connection(server.grpcAddress, { token: "s3cret" });
      right.start();
      await awaitCondition("ready", [emitterOf(right, "state")], () => right.state === "ready");
      expect(right.hello!.instanceId).to.equal("auth");
      expect(server.status().connections.map((c) => c.clientName)).to.deep.equal(["conn-test"]);
      await release(right);
    } finally {
      await release(server);
    }
  });

  it("speaks TLS with a configured CA", async () => {
    const dir = mkdtempSync(join(tmpdir(), "slotbroker-tls-"));
    try {
      const [cert, key] = [join(dir, "cert.pem"), join(dir, "key.pem")];
      execFileSync(requireTool("openssl"), [
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", cert,
      ], { stdio: "ignore" });
      const server = await inProcess({ instanceId: "tls", tls: { certFile: cert, keyFile: key } });
      try {
        const port = server.grpcPort;
        const secure = connection(`localhost:${port}`, { tls: { caFile: cert } });
        secure.start();
        await awaitCondition("ready over TLS", [emitterOf(secure, "state")], () => secure.state === "ready");
        expect(secure.hello!.instanceId).to.equal("tls");
        const local = await secure.localAddress();
        expect(local?.host).to.match(/^(127\.0\.0\.1|::1)$/);
        await release(secure);

        const plain = connection(`localhost:${port}`);
        plain.start();
        await awaitCondition("a plaintext attempt to fail", [emitterOf(plain, "state")], () => plain.lastError);
        expect(plain.state).to.not.equal("ready");
        await release(plain);
      } finally {
        await release(server);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("waits, then reports no slot on 0 instances, while no execserver is reachable; serves once one comes up", async () => {
    // The client is aimed at this port before its server exists, so the server cannot move to
    // another; freePort picks outside the kernel's ephemeral range, where nothing takes it meanwhile.
    const port = await freePort();
    const broker = startBroker({ addresses: [`127.0.0.1:${port}`], reconnectMax: "100ms" });
    let server: ExecserverHandle | undefined;
    try {
      const err = await broker.acquire({ service: "noop", connectTimeoutMs: 300 }).then(
        () => expect.fail("expected NoSlotError"),
        (e: unknown) => e,
      );
      expect(err).to.be.instanceOf(NoSlotError);
      expect((err as Error).message).to.equal('no slot for service "noop" within 300ms on 0 instances');
      const later = broker.acquire({ service: "noop", connectTimeoutMs: 20_000 });
      server = await inProcess({ instanceId: "late", listen: `127.0.0.1:${port}` });
      const slot = await later;
      expect(slot.instanceId).to.equal("late");
      slot.decline();
    } finally {
      await release(broker);
      await release(server);
    }
  });

  it("treats a draining execserver as zero capacity and waits instead of failing fast", async () => {
    const server = await spawnExecserver({ instanceId: "drain", waitgroups: { w: { processes: 2 } }, services: { sleep: { waitgroup: "w", command: ["sleep"] } } });
    const broker = startBroker({ addresses: [server.grpcAddress] });
    try {
      await awaitCondition("ready", [eventsOf(broker.events, "instances")], () => broker.instances()[0]?.capacity === 2);
      const slot = brokerSlot(await broker.acquire({ service: "sleep" }));
      const running = slot.start(create(JobSpecSchema, { args: ["2"] }));
      await waitFor("the job to run", async () => (await server.status()).waitgroups[0]!.running === 1);
      server.child.kill("SIGTERM");
      await awaitCondition("the draining HELLO", [eventsOf(broker.events, "instances")], () => broker.instances()[0]?.draining === true);
      expect(broker.instances()[0]).to.include({ capacity: 0, processes: 2 });
      const err = await broker.acquire({ service: "sleep", connectTimeoutMs: 300 }).then(
        () => expect.fail("expected NoSlotError"),
        (e: unknown) => e,
      );
      expect(err).to.be.instanceOf(NoSlotError);
      expect((err as Error).message).to.match(/on 0 instances$/);
      expect((await running).exitCode, "the running job finishes during the drain").to.equal(0);
    } finally {
      await release(broker);
      await release(server);
    }
  });

  it("detects a frozen (half-open) execserver by Ping timeout and re-registers its wants after it thaws", async () => {
    const server = await spawnExecserver({ instanceId: "frozen", waitgroups: { w: { processes: 1 } }, services: { sleep: { waitgroup: "w", command: ["sleep"] } } });
    // One connection only: the same connection must notice, reconnect and re-register.
    const broker = startBroker({
      addresses: [server.grpcAddress],
      maxConnectionsPerAddress: 1,
      pingInterval: "200ms",
      pingTimeout: "500ms",
      helloTimeout: "1s",
      connectTimeout: "60s",
    });
    try {
      await awaitCondition("ready", [eventsOf(broker.events, "instances")], () => broker.instances().length === 1);
      const conn = broker.pools()[0]!.connections()[0]!;
      const busy = brokerSlot(await broker.acquire({ service: "sleep" }));
      const running = busy.start(create(JobSpecSchema, { args: ["30"] })).then(
        () => undefined,
        (e: unknown) => e,
      );
      const parked = broker.acquire({ service: "sleep" });
      await waitFor("the want parked", async () => (await server.status()).waitgroups[0]!.waiting === 1n);

      // SIGSTOP keeps the TCP connection open but nothing answers: only liveness checks notice.
      process.kill(server.child.pid!, "SIGSTOP");
      await awaitCondition("the ping timeout", [emitterOf(conn, "state")], () => conn.state !== "ready");
      expect(conn.lastError!.message).to.match(/no Pong|keepalive|ended|failed/i);
      expect(await running).to.be.instanceOf(SlotbrokerError);
      expect(broker.instances()).to.deep.equal([]);

      process.kill(server.child.pid!, "SIGCONT");
      // The old stream is gone, so the execserver dropped the running job and the want;
      // the reconnect re-registers the want and the freed slot is offered to it.
      const slot = await parked;
      expect(slot.instanceId).to.equal("frozen");
      expect(conn.streams).to.be.at.least(2);
      slot.decline();
    } finally {
      if (server.child.signalCode === null) process.kill(server.child.pid!, "SIGCONT");
      await release(broker);
      await release(server);
    }
  });
  it("drops and reconnects a stream whose later HELLO names another instance; a same-instance update is believed", async () => {
    const fake = track(await FakeExecserver.start({ onJob: () => undefined }), "fake execserver", (f) => f.close());
    try {
      const conn = connection(fake.address);
      conn.start();
      await awaitCondition("ready", [emitterOf(conn, "state")], () => conn.state === "ready");
      expect(conn.serves("fz")).to.equal(true);

      // An update from the same instance is the protocol's way to change services.
      fake.sendAll({ case: "hello", value: { instanceId: "fake-exec", services: { fz: "w", more: "w" }, waitgroups: [{ name: "w", processes: 4 }], clients: 1 } });
      await awaitCondition("the update", [emitterOf(conn, "hello")], () => conn.serves("more"));
      expect(conn.streams).to.equal(1);

      // A stream reaches one instance: a HELLO naming another one (with no services) is a
      // broken peer, not "this execserver offers nothing now".
      fake.sendAll({ case: "hello", value: { instanceId: "someone-else", services: {}, waitgroups: [], clients: 0 } });
      await awaitCondition("the drop", [emitterOf(conn, "state")], () => conn.state !== "ready");
      expect(conn.lastError!.message).to.match(/sent a HELLO for instance "someone-else" on a stream that reached instance "fake-exec"/);
      await awaitCondition("ready again", [emitterOf(conn, "state")], () => conn.state === "ready");
      expect(conn.hello!.instanceId).to.equal("fake-exec");
      expect(conn.serves("fz")).to.equal(true);
      expect(conn.streams).to.equal(2);
      await release(conn);
    } finally {
      await release(fake);
    }
  });
});
