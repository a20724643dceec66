import { expect } from "chai";
import http2 from "node:http2";
import * as grpc from "@grpc/grpc-js";
import type { ExecserverConfigInput } from "../../src/execserver/index.js";
import { PolledSlot, UnknownServiceError, type BrokerClient, type BrokerConfigInput } from "../../src/fylr/index.js";
import { ConfigError } from "../../src/shared/errors.js";
import { compileBrokerConfig } from "../../src/fylr/broker/config.js";
import { release, track } from "../../harness/resources.js";
import { spawnExecserver, waitFor, type ExecserverProcess, type SpawnExecserverConfig } from "../../harness/execserver-process.js";
import { awaitCondition, eventsOf } from "../support/event-monitor.js";
import { startReplica, stopReplica, type FylrReplica } from "../support/fylr-replica.js";

// The fylr's per-address fallback to the token protocol, against real execserver processes:
// legacy-only ones (no BrokerService; `listen` speaks plain HTTP) and broker ones.

const services: ExecserverConfigInput["services"] = {
  cat: { waitgroup: "w", command: ["cat"] },
  sleep: { waitgroup: "w", command: ["sleep"] },
  noop: { waitgroup: "w", builtin: "noop" },
};

function execConfig(instanceId: string, mode: "broker" | "legacy-only", processes = 1): SpawnExecserverConfig {
  return { instanceId, waitgroups: { w: { processes } }, services, ...(mode === "legacy-only" ? { brokerService: false } : {}) };
}

const fastPolling: BrokerConfigInput["polling"] = { interval: "200ms", reprobe: "300ms" };

async function metric(server: ExecserverProcess, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`http://${server.adminAddress}/metrics`)).text();
  let total = 0;
  for (const line of text.split("\n")) if (pattern.test(line)) total += Number(line.slice(line.lastIndexOf(" ") + 1));
  return total;
}

function transports(broker: BrokerClient): string[] {
  return broker.pools().map((p) => p.transport);
}

describe("fylr polling fallback", function () {
  this.timeout(60_000);
  const started: object[] = [];
  const keep = <T extends object>(r: T): T => {
    started.push(r);
    return r;
  };
  afterEach(async () => {
    for (const r of started.splice(0).reverse()) {
      if ("exec" in r) await stopReplica(r as FylrReplica);
      else await release(r);
    }
  });

  it("polls a legacy-only execserver for tokens and returns to the broker once it serves BrokerService", async () => {
    const exec = keep(await spawnExecserver(execConfig("old-exec", "legacy-only")));
    const replica = keep(await startReplica({ addresses: [exec.grpcAddress], clientName: "fallback", polling: fastPolling }, "fallback"));
    await awaitCondition("the pool to poll", [eventsOf(replica.broker.events, "pool:transport")], () => transports(replica.broker)[0] === "polling");
    expect(replica.broker.instances()).to.deep.equal([
      {
        instanceId: `polling:${exec.grpcAddress}`,
        address: exec.grpcAddress,
        capacity: 4,
        processes: 4,
        clients: 1,
        services: {},
        draining: false,
        connection: "polling",
        transport: "polling",
      },
    ]);
    const input = Buffer.alloc(50_000, "z");
    const polled = await replica.exec.run({ service: "cat", stdin: input });
    expect(polled).to.include({ transport: "polling", instanceId: "old-exec", stdinUrl: undefined });
    expect(polled.stdout!.equals(input)).to.equal(true);
    expect(polled.receipt).to.include({ exitCode: 0, stdoutStreamed: true, stdoutBytes: 50_000n });
    expect(await metric(exec, /^slotbroker_legacy_jobs_done_total/)).to.equal(1);
    expect(replica.broker.stats.polled).to.equal(1);

    await exec.restart("SIGTERM", execConfig("new-exec", "broker"));
    await awaitCondition(
      "the pool to return to the broker",
      [eventsOf(replica.broker.events, "pool:transport", "instances")],
      () => transports(replica.broker)[0] === "broker" && replica.broker.instances().length === 1,
      20_000,
    );
    expect(replica.broker.pools()[0]!.stats).to.include({ fallbacks: 1, recoveries: 1 });
    const brokered = await replica.exec.run({ service: "cat", stdin: Buffer.from("back\n") });
    expect(brokered).to.include({ transport: "broker", instanceId: "new-exec" });
    expect(brokered.stdout!.toString()).to.equal("back\n");
    const status = await exec.status();
    expect(status.connections.map((c) => c.clientName)).to.deep.equal(["fallback"]);
    expect(Number(status.connections[0]!.grants)).to.equal(1);
  });

  it("serves every job of a mixed fleet (one broker execserver, one legacy-only) and uses both", async () => {
    const [fresh, old] = await Promise.all([spawnExecserver(execConfig("mixed-new", "broker", 2)), spawnExecserver(execConfig("mixed-old", "legacy-only", 2))]);
    keep(fresh);
    keep(old);
    const replica = keep(await startReplica({ addresses: [fresh.grpcAddress, old.grpcAddress], clientName: "mixed", polling: fastPolling }, "mixed"));
    await awaitCondition(
      "one broker and one polling pool",
      [eventsOf(replica.broker.events, "pool:transport", "instances")],
      () => transports(replica.broker).join() === "broker,polling" && replica.broker.instances().length === 2,
    );
    const results = await Promise.all(Array.from({ length: 16 }, (_, i) => replica.exec.run({ service: "sleep", args: ["0.3"], labels: { i: String(i) } })));
    for (const r of results) expect(r.receipt.exitCode).to.equal(0);
    const by = (id: string): number => results.filter((r) => r.instanceId === id).length;
    expect(by("mixed-new") + by("mixed-old")).to.equal(16);
    expect(by("mixed-new")).to.be.at.least(1);
    expect(by("mixed-old")).to.be.at.least(1);
    expect(results.filter((r) => r.transport === "polling").length).to.equal(by("mixed-old"));
    // No token was left to expire: surplus tokens were given back.
    await waitFor("no outstanding token", async () => (await metric(old, /^slotbroker_slots_used\{waitgroup="w",state="legacy_token"/)) === 0);
  });

  it("falls back on UNIMPLEMENTED (a gRPC server without BrokerService) and polls the URL configured for that address", async () => {
    const old = keep(await spawnExecserver(execConfig("unimpl-old", "legacy-only")));
    const server = new grpc.Server();
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
    );
    keep(track(server, "grpc server without BrokerService", (s) => s.forceShutdown()));
    const address = `127.0.0.1:${port}`;
    const replica = keep(
      await startReplica({ addresses: [address], clientName: "unimpl", polling: { ...fastPolling, urls: { [address]: `http://${old.grpcAddress}` } } }, "unimpl"),
    );
    await awaitCondition("the pool to poll", [eventsOf(replica.broker.events, "pool:transport")], () => transports(replica.broker)[0] === "polling");
    expect(replica.broker.pools()[0]!.connections()).to.have.length(0);
    const slot = await replica.broker.acquire({ service: "noop" });
    expect(slot).to.be.instanceOf(PolledSlot);
    expect((slot as PolledSlot).endpoint.url.href).to.equal(`http://${old.grpcAddress}/`);
    (slot as PolledSlot).decline();
    await waitFor("the declined token to be given back", async () => (await metric(old, /^slotbroker_legacy_tokens_total\{outcome="released"/)) === 1);
  });

  it("falls back when an HTTP/2 server answers the gRPC call with 404", async () => {
    const old = keep(await spawnExecserver(execConfig("h2-old", "legacy-only")));
    const server = http2.createServer();
    server.on("stream", (stream) => {
      stream.on("error", () => undefined);
      stream.respond({ ":status": 404 });
      stream.end("not here");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    keep(track(server, "h2 server answering 404", (s) => new Promise<void>((done) => s.close(() => done()))));
    const address = `127.0.0.1:${(server.address() as { port: number }).port}`;
    const replica = keep(
      await startReplica({ addresses: [address], clientName: "h2-404", polling: { ...fastPolling, urls: { [address]: `http://${old.grpcAddress}` } } }, "h2-404"),
    );
    await awaitCondition("the pool to poll", [eventsOf(replica.broker.events, "pool:transport")], () => transports(replica.broker)[0] === "polling");
    const r = await replica.exec.run({ service: "cat", stdin: Buffer.from("via 404\n") });
    expect(r).to.include({ transport: "polling", instanceId: "h2-old" });
    expect(r.stdout!.toString()).to.equal("via 404\n");
  });

  it("fails fast with UnknownServiceError when every polled address answers 404", async () => {
    const old = keep(await spawnExecserver(execConfig("unknown-old", "legacy-only")));
    const replica = keep(await startReplica({ addresses: [old.grpcAddress], clientName: "unknown", polling: fastPolling }, "unknown"));
    await awaitCondition("the pool to poll", [eventsOf(replica.broker.events, "pool:transport")], () => transports(replica.broker)[0] === "polling");
    const before = Date.now();
    const err = await replica.broker.acquire({ service: "ffmpeg", connectTimeoutMs: 20_000 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).to.be.instanceOf(UnknownServiceError);
    expect(Date.now() - before).to.be.below(5_000);
  });

  it("polls once per interval per waiting job and gives up after connectTimeout with no slot", async () => {
    const old = keep(await spawnExecserver(execConfig("busy-old", "legacy-only")));
    const replica = keep(await startReplica({ addresses: [old.grpcAddress], clientName: "busy", polling: { ...fastPolling, interval: "250ms" } }, "busy"));
    await awaitCondition("the pool to poll", [eventsOf(replica.broker.events, "pool:transport")], () => transports(replica.broker)[0] === "polling");
    const running = replica.exec.run({ service: "sleep", args: ["3"] });
    await waitFor("the long job to run", async () => (await metric(old, /^slotbroker_slots_used\{waitgroup="w",state="legacy_running"/)) === 1);
    const requestsBefore = replica.broker.stats.tokenRequests;
    const err = await replica.broker.acquire({ service: "sleep", connectTimeoutMs: 1_300 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((err as { code?: unknown }).code, String(err)).to.equal(8); // RESOURCE_EXHAUSTED: the dispatcher requeues
    const polls = replica.broker.stats.tokenRequests - requestsBefore;
    // 1.3 s at one GET per 250 ms: 6 rounds (the first at once); never more, and fewer
    // only when the host is slow enough to delay the timers.
    expect(polls).to.be.within(3, 7);
    expect(await metric(old, /^slotbroker_legacy_refused_total\{reason="no-slot"/)).to.be.at.least(5);
    expect((await running).receipt.exitCode).to.equal(0);
  });

  it("does not fall back for an address that refuses connections (a dead execserver is not an old one)", async () => {
    const replica = keep(await startReplica({ addresses: ["127.0.0.1:1"], clientName: "dead", polling: fastPolling }, "dead"));
    await waitFor("a failed attempt", () => replica.broker.pools()[0]!.connections()[0]?.lastError !== undefined);
    // The thing under test is that nothing happens: half a second of retries, no fallback.
    await new Promise((r) => setTimeout(r, 500));
    expect(transports(replica.broker)).to.deep.equal(["broker"]);
    expect(replica.broker.instances()).to.deep.equal([]);
  });

  it("checks the polling config", () => {
    expect(() => compileBrokerConfig({ addresses: ["127.0.0.1:7600"], polling: { urls: { "127.0.0.1:9": "http://x" } } })).to.throw(
      ConfigError,
      /polling\.urls: "127\.0\.0\.1:9" is not one of addresses/,
    );
    expect(() => compileBrokerConfig({ addresses: ["127.0.0.1:7600"], polling: { interval: "0s" } })).to.throw(ConfigError, /polling\.interval: must be more than 0/);
    expect(compileBrokerConfig({ addresses: ["127.0.0.1:7600"], polling: { enabled: false } }).polling).to.equal(undefined);
    expect(compileBrokerConfig({ addresses: ["127.0.0.1:7600"] }).polling).to.deep.include({ intervalMs: 1000, reprobeMs: 10_000, parallel: 4 });
  });
});
