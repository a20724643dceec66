import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import {
  JobSpecSchema,
  PositionState,
  type ConnectionStatus,
  type GetStatusResponse,
  type JobSpec,
  type Position,
} from "../../gen/slotbroker/v1/broker_pb.js";
import type { ExecserverConfigInput } from "../../src/execserver/index.js";
import {
  ConnectionLostError,
  brokerSlot,
  NoSlotError,
  UnknownServiceError,
  channelzLocalAddress,
  resolveLocalAddress,
  udpLocalAddress,
  type BrokerClient,
  type Slot,
} from "../../src/fylr/broker/index.js";
import { Registry } from "prom-client";
import { registerFylrBrokerMetrics } from "../../src/app/fylr-broker-metrics.js";
import { Code } from "../../src/shared/errors.js";
import { release } from "../../harness/resources.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { awaitCondition, eventsOf } from "../support/event-monitor.js";
import { startBroker, startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";

/** One slot; `sleep`, `cat` and the builtin `noop`. */
function execConfig(instanceId: string, services: ExecserverConfigInput["services"] = defaultServices) {
  return { instanceId, offerTimeout: "5s", waitgroups: { w: { processes: 1 } }, services };
}
const defaultServices: ExecserverConfigInput["services"] = {
  sleep: { waitgroup: "w", command: ["sleep"] },
  noop: { waitgroup: "w", builtin: "noop" },
};

function ours(status: GetStatusResponse, client: string): ConnectionStatus[] {
  return status.connections.filter((c) => c.clientName === client);
}

async function sum(servers: ExecserverProcess[], client: string, field: "declines" | "grants" | "offers" | "wantsParked"): Promise<number> {
  let total = 0;
  for (const server of servers) for (const c of ours(await server.status(), client)) total += Number(c[field]);
  return total;
}

function ready(broker: BrokerClient, instances: number): Promise<boolean> {
  return awaitCondition(`${instances} instances`, [eventsOf(broker.events, "instances")], () => broker.instances().length === instances);
}

describe("fylr broker client against two execserver processes", function () {
  this.timeout(60_000);
  let a: ExecserverProcess;
  let b: ExecserverProcess;

  before(async () => {
    [a, b] = await Promise.all([spawnExecserver(execConfig("exec-a")), spawnExecserver(execConfig("exec-b"))]);
  });
  after(async () => {
    await release(a);
    await release(b);
  });
  // Every broker a test starts is closed after it, pass or fail.
  const brokers: BrokerClient[] = [];
  const open = (input: Parameters<typeof startBroker>[0]): BrokerClient => {
    const started = startBroker(input);
    brokers.push(started);
    return started;
  };
  afterEach(async () => {
    for (const started of brokers.splice(0)) await release(started);
  });

  it("reaches both instances and reports their HELLO for admission", async () => {
    const broker = open({ addresses: [a.grpcAddress, b.grpcAddress], clientName: "admission" });
    await ready(broker, 2);
    const changes: number[] = [];
    const unsubscribe = broker.subscribe(() => changes.push(broker.instances().length));
    const instances = [...broker.instances()].sort((x, y) => x.instanceId.localeCompare(y.instanceId));
    expect(instances.map((i) => [i.instanceId, i.address, i.capacity])).to.deep.equal([
      ["exec-a", a.grpcAddress, 1],
      ["exec-b", b.grpcAddress, 1],
    ]);
    expect(instances[0]!.clients).to.be.at.least(1);
    expect(instances[0]!.services).to.have.keys("sleep", "noop");
    // Closing drops both connections: the snapshot empties and subscribers hear it.
    await release(broker);
    unsubscribe();
    expect(changes).to.include(0);
    expect(broker.instances()).to.deep.equal([]);
  });

  it("takes the first offer, DECLINEs the surplus one at once", async () => {
    // A long grace: the surplus offer surely arrives before the UNWANT would go out.
    const broker = open({ addresses: [a.grpcAddress, b.grpcAddress], clientName: "race", unwantGrace: "300ms" });
    await ready(broker, 2);
    // Both execservers are idle, so both offer the one want at once: one wins.
    const slot = brokerSlot(await broker.acquire({ service: "noop" }));
    const receipt = await slot.start(jobSpec([]));
    expect(receipt.exitCode).to.equal(0);
    await waitFor("the loser's decline to show in GetStatus", async () => (await sum([a, b], "race", "declines")) === 1);
    expect(broker.stats).to.include({ accepted: 1, declined: 1 });
    expect(await sum([a, b], "race", "grants")).to.equal(1);
    const loser = slot.instanceId === "exec-a" ? b : a;
    expect(ours(await loser.status(), "race")[0]!.declines).to.equal(1n);
  });

  it("hands a surplus offer that is still good to the next want parked there instead of declining it", async () => {
    // Both instances serve a connection's oldest want, so when both slots free at once both
    // offer the same want. The long grace keeps the second offer good (no UNWANT yet).
    const busy = await startReplica({ addresses: [a.grpcAddress, b.grpcAddress] }, "substitute-busy");
    const replica = await startReplica({ addresses: [a.grpcAddress, b.grpcAddress], unwantGrace: "2s" }, "substitute");
    try {
      await Promise.all([ready(busy.broker, 2), ready(replica.broker, 2)]);
      const sleeping = [runSleep(busy, "1"), runSleep(busy, "1")];
      await waitFor("both slots busy", async () => (await a.status()).waitgroups[0]!.running + (await b.status()).waitgroups[0]!.running === 2);
      const wants = [replica.broker.acquire({ service: "noop" }), replica.broker.acquire({ service: "noop" })];
      await waitFor("both wants parked on both", async () => (await sum([a, b], "substitute", "wantsParked")) === 4);
      const slots = (await Promise.all(wants)).map(brokerSlot);
      expect(new Set(slots.map((s) => s.instanceId)).size).to.equal(2);
      expect(replica.broker.stats).to.include({ accepted: 2, substituted: 1, declined: 0 });
      const metrics = new Registry();
      registerFylrBrokerMetrics([metrics], replica.broker);
      const exposition = await metrics.metrics();
      expect(exposition).to.match(/^slotbroker_fylr_offers_substituted_total 1$/m);
      expect(exposition).to.match(/^slotbroker_fylr_offers_total\{outcome="accepted"\} 2$/m);
      // The second want runs under the first one's job id on the other instance; each job
      // is tracked on its own connection and settles with its own DONE.
      expect(slots[0]!.jobId).to.equal(slots[1]!.jobId);
      const receipts = await Promise.all(slots.map((s) => s.start(jobSpec([]))));
      expect(receipts.map((r) => r.exitCode)).to.deep.equal([0, 0]);
      expect(replica.broker.running).to.equal(0);
      await Promise.all(sleeping);
      await waitFor("nothing left parked", async () => (await sum([a, b], "substitute", "wantsParked")) === 0);
      // (The second want's own copy on the first instance is withdrawn after the grace like
      // any loser's; if that slot frees meanwhile, its offer is declined as usual.)
      expect(await sum([a, b], "substitute", "grants")).to.equal(2);
    } finally {
      await stopReplica(replica);
      await stopReplica(busy);
    }
  });

  it("UNWANTs the want everywhere else once it won, and parks only one want per instance", async () => {
    const replica = await startReplica({ addresses: [a.grpcAddress, b.grpcAddress] }, "unwant");
    try {
      await ready(replica.broker, 2);
      // Occupy both slots: the second run cannot land where the first runs.
      const busy = [runSleep(replica, "1"), runSleep(replica, "1")];
      await waitFor("both slots busy", async () => (await a.status()).waitgroups[0]!.running + (await b.status()).waitgroups[0]!.running === 2);
      const positions: [string, Position][] = [];
      const third = replica.broker.acquire({ service: "sleep", onPosition: (position, id) => positions.push([id, position]) });
      await waitFor("the want parked on both", async () => (await sum([a, b], "unwant", "wantsParked")) === 2);
      // While parked it learns where it stands on each instance (QUERY → POSITION).
      await waitFor("a position from each instance", () => new Set(positions.map(([id]) => id)).size === 2);
      expect(positions[0]![1]).to.include({ state: PositionState.PARKED, running: 1, capacity: 1, ahead: 0, waitgroup: "w" });
      const slot = await third;
      slot.decline();
      await waitFor("the UNWANT to reach the other execserver", async () => (await sum([a, b], "unwant", "wantsParked")) === 0);
      const other = slot.instanceId === "exec-a" ? b : a;
      expect((await other.status()).waitgroups[0]!.waiting).to.equal(0n);
      await Promise.all(busy);
    } finally {
      await stopReplica(replica);
    }
  });

  it("sends each want's fairness key and weight: one execserver serves them key by key", async () => {
    const replica = await startReplica({ addresses: [a.grpcAddress] }, "keyed");
    try {
      await ready(replica.broker, 1);
      // Busy long enough for six wants to park even on a loaded machine.
      const busy = runSleep(replica, "3");
      await waitFor("the slot busy", async () => (await a.status()).waitgroups[0]!.running === 1);
      const started: string[] = [];
      const run = (name: string, fairnessKey?: string, fairnessWeight?: number): Promise<unknown> =>
        replica.exec.run({ service: "noop", fairnessKey, fairnessWeight, onStart: () => started.push(name) });
      const runs = [run("t1-a", "t1", 2), run("t1-b", "t1", 2), run("t1-c", "t1", 2), run("t2-a", "t2"), run("t2-b", "t2"), run("plain")];
      await waitFor("six wants parked", async () => (await sum([a], "keyed", "wantsParked")) === 6);
      const book = (await a.status()).waitgroups[0]!.book.map((d) => [d.priority, Number(d.wants), d.keys]);
      expect(book, "one class: six wants under three keys").to.deep.equal([[0, 6, 3]]);
      await Promise.all([busy, ...runs]);
      expect(started).to.deep.equal(["t1-a", "t1-b", "t2-a", "plain", "t1-c", "t2-b"]);
      const bad = await replica.broker.acquire({ service: "noop", fairnessWeight: 0 }).then(
        () => expect.fail("expected InvalidArgument"),
        (e: unknown) => e,
      );
      expect(bad).to.have.property("code", Code.InvalidArgument);
      expect((bad as Error).message).to.equal("fairnessWeight: must be an integer from 1 to 1000, got 0");
    } finally {
      await stopReplica(replica);
    }
  });

  it("gives up with NoSlotError after connectTimeout and UNWANTs everywhere", async () => {
    const replica = await startReplica({ addresses: [a.grpcAddress, b.grpcAddress] }, "noslot");
    try {
      await ready(replica.broker, 2);
      const busy = [runSleep(replica, "2"), runSleep(replica, "2")];
      await waitFor("both slots busy", async () => (await a.status()).waitgroups[0]!.running + (await b.status()).waitgroups[0]!.running === 2);
      const err = await replica.broker.acquire({ service: "sleep", connectTimeoutMs: 300 }).then(
        () => expect.fail("expected NoSlotError"),
        (e: unknown) => e,
      );
      // The dispatcher requeues by this code (RESOURCE_EXHAUSTED), not by the class.
      expect(err).to.be.instanceOf(NoSlotError).and.have.property("code", Code.ResourceExhausted);
      expect((err as Error).message).to.equal('no slot for service "sleep" within 300ms on 2 instances');
      expect(await sum([a, b], "noslot", "wantsParked")).to.equal(0);
      expect(replica.broker.parked).to.equal(0);
      expect(replica.broker.stats.noSlot).to.equal(1);
      await Promise.all(busy);
    } finally {
      await stopReplica(replica);
    }
  });

  it("fails fast, and says so, when no connected execserver offers the service", async () => {
    const broker = open({ addresses: [a.grpcAddress, b.grpcAddress], connectTimeout: "10m", clientName: "unknown" });
    const err = await broker.acquire({ service: "ffmpeg" }).then(
      () => expect.fail("expected UnknownServiceError"),
      (e: unknown) => e,
    );
    expect(err).to.be.instanceOf(UnknownServiceError);
    expect((err as Error).message).to.equal('no execserver offers service "ffmpeg" (2 connected instances offer: "noop", "sleep")');
    expect(await sum([a, b], "unknown", "wantsParked")).to.equal(0);
  });

  it("parks a want only where the HELLO lists the service", async () => {
    const catOnly = await spawnExecserver(execConfig("exec-cat", { cat: { waitgroup: "w", command: ["cat"] } }));
    try {
      const broker = open({ addresses: [a.grpcAddress, catOnly.grpcAddress], clientName: "routing" });
      await ready(broker, 2);
      const slot = await broker.acquire({ service: "cat" });
      expect(slot.instanceId).to.equal("exec-cat");
      slot.decline();
      expect(await sum([a], "routing", "offers")).to.equal(0);
      expect(broker.stats.declined).to.equal(0);
    } finally {
      await release(catOnly);
    }
  });

  it("parks once per instance when two addresses reach the same execserver", async () => {
    const port = a.grpcAddress.split(":")[1]!;
    const broker = open({ addresses: [`127.0.0.1:${port}`, `localhost:${port}`], clientName: "twice" });
    await awaitCondition("both connections ready", [eventsOf(broker.events, "connection:up", "instances")], () => broker.pools().every((p) => p.connections()[0]?.state === "ready"));
    expect(broker.instances().map((i) => i.instanceId)).to.deep.equal(["exec-a"]);
    const slot = brokerSlot(await broker.acquire({ service: "noop" }));
    await slot.start(jobSpec([]));
    expect(await sum([a], "twice", "offers")).to.equal(1);
    expect(broker.stats.declined).to.equal(0);
  });

  it("finds its local address through channelz and a UDP probe, and measures the ping", async () => {
    const broker = open({ addresses: [a.grpcAddress], clientName: "local" });
    await ready(broker, 1);
    const conn = broker.pools()[0]!.connections()[0]!;
    const local = await conn.localAddress();
    expect(local?.source).to.equal("channelz");
    // The execserver saw us come from exactly that address and port.
    expect(`${local!.host}:${local!.port}`).to.equal(conn.hello!.peerAddress);
    const client = (conn as unknown as { client: { getChannel(): Parameters<typeof channelzLocalAddress>[0] } }).client;
    expect(await channelzLocalAddress(client.getChannel())).to.deep.equal(local);
    const [host, port] = a.grpcAddress.split(":");
    const udp = { host: "127.0.0.1", port: undefined, source: "udp" };
    expect(await udpLocalAddress(host!, Number(port))).to.deep.equal(udp);
    // Without a channel (or when channelz knows no READY socket) the UDP probe answers.
    expect(await resolveLocalAddress(undefined, a.grpcAddress)).to.deep.equal(udp);
    expect(await udpLocalAddress("::1", Number(port))).to.deep.equal({ host: "::1", port: undefined, source: "udp" });
    const rtt = await conn.ping();
    expect(rtt).to.be.a("number").and.be.greaterThan(0);
    expect(conn.rttMs).to.equal(rtt);
  });

  it("re-registers parked wants after an execserver restart; a running job fails clearly", async () => {
    const server = await spawnExecserver(execConfig("exec-r"));
    try {
      const replica = await startReplica({ addresses: [server.grpcAddress] }, "restart");
      try {
        await ready(replica.broker, 1);
        // Settled into a value at once, so the rejection is never "unhandled" meanwhile.
        const running = runSleep(replica, "30").then(
          () => expect.fail("expected the running job to fail"),
          (e: unknown) => e,
        );
        await waitFor("the long job to run", async () => (await server.status()).waitgroups[0]!.running === 1);
        const parked = replica.broker.acquire({ service: "noop", connectTimeoutMs: 30_000 });
        await waitFor("the want parked", async () => (await sum([server], "restart", "wantsParked")) === 1);
        await server.restart("SIGKILL");
        const err = await running;
        expect(err).to.be.instanceOf(ConnectionLostError);
        expect((err as Error).message).to.match(/connection to execserver exec-r \(127\.0\.0\.1:\d+\) was lost while job \S+ was running/);
        const slot: Slot = brokerSlot(await parked);
        expect(slot.instanceId).to.equal("exec-r");
        expect((await slot.start(jobSpec([]))).exitCode).to.equal(0);
        expect(replica.broker.pools()[0]!.connections()[0]!.streams).to.be.at.least(2);
      } finally {
        await stopReplica(replica);
      }
    } finally {
      await release(server);
    }
  });
});

function runSleep(replica: FylrReplica, seconds: string): Promise<unknown> {
  return replica.exec.run({ service: "sleep", args: [seconds] });
}

function jobSpec(args: string[]): JobSpec {
  return create(JobSpecSchema, { args });
}
