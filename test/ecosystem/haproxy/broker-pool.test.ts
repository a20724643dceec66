import { expect } from "chai";
import { once } from "node:events";
import type { BrokerClient } from "../../../src/fylr/broker/index.js";
import { freePort } from "../../../src/shared/free-port.js";
import { awaitCondition, emitterOf, eventsOf } from "../../support/event-monitor.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../../harness/execserver-process.js";
import { startReplica, stopReplica, type FylrReplica } from "../../support/fylr-replica.js";
import { startHaproxy, type Haproxy } from "../../../harness/haproxy.js";
import { release } from "../../../harness/resources.js";

const oneSleepSlot = (instanceId: string, listen?: string) => ({
  instanceId,
  ...(listen ? { listen } : {}),
  waitgroups: { w: { processes: 1 } },
  services: { sleep: { waitgroup: "w", command: ["sleep"] } },
});

/** Distinct instances the broker's connections reach, from the execservers' point of view. */
async function connectionsPerInstance(servers: ExecserverProcess[], client: string): Promise<number[]> {
  const counts: number[] = [];
  for (const server of servers) counts.push((await server.status()).connections.filter((c) => c.clientName === client).length);
  return counts;
}

/** Runs `jobs` sleeps at once; resolves with the instance ids that ran them. */
async function burst(replica: FylrReplica, jobs: number, seconds: string): Promise<string[]> {
  const results = await Promise.all(Array.from({ length: jobs }, () => replica.exec.run({ service: "sleep", args: [seconds] })));
  for (const r of results) expect(r.receipt.exitCode, r.receipt.stderrLine).to.equal(0);
  return results.map((r) => r.instanceId);
}

/** Resolves once the broker reaches one instance (its first connection got a HELLO). */
function firstConnection(broker: BrokerClient): Promise<true> {
  return awaitCondition("the first connection", [eventsOf(broker.events, "instances")], () => broker.instances().length === 1);
}

function pool(broker: BrokerClient) {
  return broker.pools()[0]!;
}

/** Which instance each new stream of the pool reached, in order (for failure messages). */
function landings(broker: BrokerClient): string[] {
  const log: string[] = [];
  pool(broker).on("connection", (conn) => conn.on("hello", (hello, first) => first && log.push(`${conn.name}→${hello.instanceId}`)));
  for (const conn of pool(broker).connections()) if (conn.hello) log.push(`${conn.name}→${conn.hello.instanceId}`);
  return log;
}

describe("fylr broker pool behind one load-balanced address (HAProxy, three execservers)", function () {
  this.timeout(90_000);
  let servers: ExecserverProcess[] = [];
  let haproxy: Haproxy | undefined;
  let replica: FylrReplica | undefined;

  // Generous liveness timings: a reconnect caused by a loaded machine would take an extra
  // turn of the balancer's round robin and blur what the test looks at.
  const lb = () => ({ addresses: [haproxy!.address], connectTimeout: "60s", pingInterval: "10s", pingTimeout: "5s" });

  afterEach(async () => {
    await stopReplica(replica);
    replica = undefined;
    await release(haproxy);
    haproxy = undefined;
    for (const server of servers.splice(0)) await release(server);
  });

  it("grows under backpressure, reaches all three, closes the duplicate, marks covered and stops growing", async () => {
    servers = await Promise.all(["pod-1", "pod-2", "pod-3"].map((id) => spawnExecserver(oneSleepSlot(id))));
    haproxy = await startHaproxy(servers.map((s) => s.grpcAddress));
    // A short re-probe: under load HAProxy's rotation can skip a pod (a health check that
    // timed out, a redispatched connect), the pool then meets a known pod first and stops;
    // the next probe, while backpressure lasts, finds the one that was skipped.
    replica = await startReplica({ ...lb(), reprobeInterval: "2s", maxConnectionsPerAddress: 8 }, "lb");
    const p = pool(replica.broker);
    await firstConnection(replica.broker);
    const log = landings(replica.broker);
    expect(p.stats.opened).to.equal(1);
    let sawCovered = false;
    p.on("duplicate", () => (sawCovered ||= p.covered));

    // Eighteen 1.5-second jobs on three one-slot pods: backpressure lasts for seconds.
    const ran = await burst(replica, 18, "1.5");
    const why = (): string => `${log.join(" ")}\nhaproxy: ${haproxy!.output()}`;

    expect(new Set(ran), why()).to.have.lengthOf(3);
    expect(replica.broker.instances().map((i) => i.instanceId).sort(), why()).to.deep.equal(["pod-1", "pod-2", "pod-3"]);
    expect(p.stats.duplicatesClosed, `a connection landed on a known pod and was closed: ${why()}`).to.be.at.least(1);
    expect(sawCovered, "the duplicate marked the pool covered").to.equal(true);
    expect(p.connections()).to.have.lengthOf(3);
    expect(p.stats.opened).to.equal(3 + p.stats.duplicatesClosed);
    // Each pod counts this fylr exactly once. (The pods' own view, asked over GetStatus: the
    // closed duplicate leaves a pod a moment after this side closed it.)
    await waitFor("one connection per pod", async () => (await connectionsPerInstance(servers, "lb")).every((n) => n === 1));
    expect(replica.broker.instances().map((i) => i.clients)).to.deep.equal([1, 1, 1]);

    // The burst is over: no backpressure, so no new connection, not even when the covered
    // mark lapses and the pool decides again and again.
    const opened = p.stats.opened;
    await awaitCondition("the pool to see no backpressure", [emitterOf(p, "tick")], () => p.lastDecision?.grow === false && p.lastDecision.reason === "no-backpressure");
    if (p.covered) await once(p, "uncovered");
    for (let i = 0; i < 5; i++) await once(p, "tick");
    expect(p.covered, "the covered mark lapsed").to.equal(false);
    expect(p.stats.opened).to.equal(opened);
    expect(p.lastDecision).to.deep.equal({ grow: false, reason: "no-backpressure" });
  });

  it("stays at one connection when one pod absorbs the work", async () => {
    servers = [await spawnExecserver({ ...oneSleepSlot("solo"), waitgroups: { w: { processes: 4 } } })];
    haproxy = await startHaproxy(servers.map((s) => s.grpcAddress));
    replica = await startReplica(lb(), "solo");
    await firstConnection(replica.broker);
    await burst(replica, 4, "0.5");
    expect(pool(replica.broker).stats.opened).to.equal(1);
  });

  it("re-probes after the covered mark lapses and finds a pod that came up later", async () => {
    // The client is aimed at this port before its server exists, so the server cannot move to
    // another; freePort picks outside the kernel's ephemeral range, where nothing takes it meanwhile.
    const latePort = await freePort();
    servers = await Promise.all(["early-1", "early-2"].map((id) => spawnExecserver(oneSleepSlot(id))));
    haproxy = await startHaproxy([...servers.map((s) => s.grpcAddress), `127.0.0.1:${latePort}`]);
    replica = await startReplica({ ...lb(), reprobeInterval: "1s", reconnectMax: "200ms" }, "probe");
    const p = pool(replica.broker);
    await firstConnection(replica.broker);

    await burst(replica, 8, "1");
    expect(replica.broker.instances().map((i) => i.instanceId).sort()).to.deep.equal(["early-1", "early-2"]);
    expect(p.stats.duplicatesClosed).to.be.at.least(1);

    servers.push(await spawnExecserver(oneSleepSlot("late", `127.0.0.1:${latePort}`)));
    if (p.covered) await once(p, "uncovered");
    const ran = await burst(replica, 9, "1");
    expect(ran).to.include("late");
    expect(replica.broker.instances().map((i) => i.instanceId).sort()).to.deep.equal(["early-1", "early-2", "late"]);
  });

  it("reconnects a dropped pool connection through the balancer onto a live pod", async () => {
    servers = await Promise.all(["keep-1", "keep-2"].map((id) => spawnExecserver(oneSleepSlot(id))));
    haproxy = await startHaproxy(servers.map((s) => s.grpcAddress));
    // A short re-probe: an early duplicate must not keep the pool from reaching both pods.
    replica = await startReplica({ ...lb(), reprobeInterval: "1s" }, "drop");
    const p = pool(replica.broker);
    await firstConnection(replica.broker);
    await burst(replica, 6, "0.5");
    expect(replica.broker.instances()).to.have.lengthOf(2);

    const victim = servers.find((s) => s.instanceId === replica!.broker.instances()[0]!.instanceId)!;
    await victim.kill("SIGKILL");
    // The dead pod's connection redials the balancer, lands on the survivor and, being a
    // duplicate there, is closed: the pool keeps exactly the reachable fleet.
    await awaitCondition("the pool to shrink to the survivor", [emitterOf(p, "removed", "instances")], () => p.connections().length === 1 && replica!.broker.instances().length === 1);
    const survivor = servers.find((s) => s !== victim)!;
    expect(replica.broker.instances()[0]!.instanceId).to.equal(survivor.instanceId);
    expect(await burst(replica, 2, "0.1")).to.deep.equal([survivor.instanceId, survivor.instanceId]);
  });
});
