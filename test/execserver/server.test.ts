import { expect } from "chai";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { service as healthService } from "grpc-health-check";
import { RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { compileExecserverConfig } from "../../src/execserver/index.js";
import { startExecserver } from "../../src/app/execserver.js";
import { ConfigError } from "../../src/shared/errors.js";
import { track } from "../../harness/resources.js";
import { BrokerStream, closeLater, eventually, releaseAll } from "./support/broker-stream.js";
import { startTestServer } from "./support/server.js";

const HealthClient = grpc.makeClientConstructor(healthService, "Health");

function checkHealth(address: string, service: string): Promise<string> {
  const client = closeLater(track(new HealthClient(address, grpc.credentials.createInsecure()), "health client", (c) => c.close()));
  return new Promise((resolve, reject) =>
    (client as unknown as { check: (r: object, cb: (e: Error | null, r: { status: string }) => void) => void }).check(
      { service },
      (err, res) => (err ? reject(err) : resolve(res.status)),
    ),
  );
}

/** A Health Watch on `service`: the statuses it received so far. */
function watchHealth(address: string, service: string): string[] {
  const client = closeLater(track(new HealthClient(address, grpc.credentials.createInsecure()), "health client", (c) => c.close()));
  const seen: string[] = [];
  const call = (client as unknown as { watch: (r: object) => grpc.ClientReadableStream<{ status: string }> }).watch({ service });
  call.on("data", (res: { status: string }) => seen.push(res.status));
  call.on("error", () => undefined);
  closeLater(track(call, "health watch", (c) => c.cancel()));
  return seen;
}

// A reflection client from the .proto that ships with @grpc/reflection.
function listServices(address: string): Promise<string[]> {
  const require = createRequire(import.meta.url);
  const root = join(dirname(require.resolve("@grpc/reflection/package.json")), "build", "proto");
  const definition = protoLoader.loadSync(join(root, "grpc/reflection/v1/reflection.proto"), { includeDirs: [root] });
  const pkg = grpc.loadPackageDefinition(definition) as unknown as {
    grpc: { reflection: { v1: { ServerReflection: grpc.ServiceClientConstructor } } };
  };
  const client = closeLater(
    track(new pkg.grpc.reflection.v1.ServerReflection(address, grpc.credentials.createInsecure()), "reflection client", (c) => c.close()),
  );
  type Response = { listServicesResponse?: { service: { name: string }[] } };
  const call = (client as unknown as { serverReflectionInfo: () => grpc.ClientDuplexStream<object, Response> }).serverReflectionInfo();
  return new Promise((resolve, reject) => {
    call.on("data", (response: Response) => {
      resolve((response.listServicesResponse?.service ?? []).map((s) => s.name));
      call.end();
    });
    call.on("error", reject);
    call.write({ listServices: "*" });
  });
}

async function get(url: string): Promise<{ status: number; body: string }> {
  const response = await fetch(url);
  return { status: response.status, body: await response.text() };
}

describe("execserver server", () => {
  afterEach(releaseAll);

  it("sends HELLO first and re-sends it when a client joins", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress, { awaitHello: false });
    const hello = await a.next("hello");
    expect(a.received[0]!.frame.case).to.equal("hello");
    expect(hello).to.include({ instanceId: "test-exec", clients: 1, draining: false });
    expect(hello.services).to.deep.equal({ noop: "one", noop2: "two", sleep: "slow" });
    expect(hello.waitgroups.map((w) => [w.name, w.processes])).to.deep.equal([["one", 1], ["two", 2], ["slow", 1]]);
    expect(hello.peerAddress).to.match(/^127\.0\.0\.1:\d+$/);
    expect(hello.capabilities).to.include("query");
    await BrokerStream.open(server.grpcAddress);
    expect((await a.next("hello")).clients).to.equal(2);
  });

  it("coalesces HELLOs during a burst of connects instead of fanning out N²", async () => {
    const server = await startTestServer({}, { helloCoalesceMs: 200 });
    const first = await BrokerStream.open(server.grpcAddress);
    const burst = await Promise.all(Array.from({ length: 30 }, () => BrokerStream.open(server.grpcAddress)));
    await eventually(() => expect(first.received.at(-1)?.frame.value).to.include({ clients: 31 }));
    const hellos = [first, ...burst].reduce((n, s) => n + s.received.filter((f) => f.frame.case === "hello").length, 0);
    // One on connect each, plus at most a couple of broadcasts each — far from 31².
    expect(hellos).to.be.below(31 * 4);
  });

  it("widens the HELLO window with the number of streams, so a broadcast storm stays within its frame budget", async () => {
    // 20 streams at 100 frames/s: one broadcast per 200 ms at most (the floor is 10 ms).
    const server = await startTestServer({}, { helloCoalesceMs: 10, helloFramesPerSecond: 100 });
    const streams = await Promise.all(Array.from({ length: 19 }, () => BrokerStream.open(server.grpcAddress)));
    await eventually(() => expect(streams[0]!.received.at(-1)?.frame.value).to.include({ clients: 19 }));
    const before = streams.reduce((n, s) => n + s.received.filter((f) => f.frame.case === "hello").length, 0);
    const joined = performance.now();
    const newcomer = await BrokerStream.open(server.grpcAddress);
    // The newcomer's own HELLO goes out at once and already counts it.
    expect(newcomer.received[0]!.frame.value).to.include({ clients: 20 });
    await eventually(() => expect(streams[0]!.received.at(-1)?.frame.value).to.include({ clients: 20 }));
    expect(performance.now() - joined).to.be.at.least(190);
    // Five more joins inside one window: everyone hears about them in one broadcast.
    await Promise.all(Array.from({ length: 5 }, () => BrokerStream.open(server.grpcAddress)));
    await eventually(() => expect(streams[0]!.received.at(-1)?.frame.value).to.include({ clients: 25 }));
    const after = streams.reduce((n, s) => n + s.received.filter((f) => f.frame.case === "hello").length, 0);
    expect(after - before).to.be.at.most(19 * 3);
  });

  it("answers gRPC health for the server and BrokerService, and lists BrokerService by reflection", async () => {
    const server = await startTestServer();
    expect(await checkHealth(server.grpcAddress, "")).to.equal("SERVING");
    expect(await checkHealth(server.grpcAddress, "slotbroker.v1.BrokerService")).to.equal("SERVING");
    const unknown = await checkHealth(server.grpcAddress, "no.such.Service").catch((err: grpc.ServiceError) => err);
    expect(unknown).to.include({ code: grpc.status.NOT_FOUND });
    const watched = watchHealth(server.grpcAddress, "no.such.Service");
    await eventually(() => expect(watched).to.deep.equal(["SERVICE_UNKNOWN"]));
    const services = await listServices(server.grpcAddress);
    expect(services).to.include("slotbroker.v1.BrokerService");
  });

  it("serves /healthz, /metrics and /status.json on the admin port", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("m", "noop");
    const offer = await a.next("offer");
    a.job("m", offer.offerToken);
    await a.next("done");
    expect(await get(`${server.adminUrl}/healthz`)).to.deep.equal({ status: 200, body: "ok\n" });
    const metrics = (await get(`${server.adminUrl}/metrics`)).body;
    expect(metrics).to.match(/slotbroker_slots\{waitgroup="one",instance_id="test-exec"\} 1/);
    expect(metrics).to.match(/slotbroker_grant_latency_seconds_count\{[^}]*waitgroup="one"[^}]*\} 1\n/);
    expect(metrics).to.match(/slotbroker_offer_outcomes_total\{outcome="accepted",instance_id="test-exec"\} 1/);
    expect(metrics).to.match(/slotbroker_connections\{instance_id="test-exec"\} 1/);
    const status = JSON.parse((await get(`${server.adminUrl}/status.json`)).body) as { instanceId: string; connections: unknown[] };
    expect(status.instanceId).to.equal("test-exec");
    expect(status.connections).to.have.length(1);
    expect((await get(`${server.adminUrl}/nope`)).status).to.equal(404);
    server.admin.route("/extra", (_req, res) => void res.end("added"));
    expect((await get(`${server.adminUrl}/extra`)).body).to.equal("added");
  });

  it("drains: announces it, refuses new wants, lets running jobs finish, then stops", async () => {
    const server = await startTestServer();
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("nap", "sleep");
    const offer = await a.next("offer");
    a.job("nap", offer.offerToken, { args: ["0.5"] });
    await eventually(() => expect(server.status().waitgroups.find((w) => w.name === "slow")!.running).to.equal(1));
    const watched = watchHealth(server.grpcAddress, "");
    await eventually(() => expect(watched).to.deep.equal(["SERVING"]));
    const closed = server.close();
    expect((await a.next("hello")).draining).to.equal(true);
    expect(await checkHealth(server.grpcAddress, "")).to.equal("NOT_SERVING");
    expect(await checkHealth(server.grpcAddress, "slotbroker.v1.BrokerService")).to.equal("NOT_SERVING");
    await eventually(() => expect(watched).to.deep.equal(["SERVING", "NOT_SERVING"]));
    expect((await get(`${server.adminUrl}/healthz`)).status).to.equal(503);
    a.want("late", "noop");
    expect((await a.next("reject")).code).to.equal(RejectCode.DRAINING);
    const done = await a.next("done", 10_000);
    expect(done.receipt?.exitCode).to.equal(0);
    await closed;
    expect(server.state).to.equal("stopped");
    expect((await a.ended).code).to.equal(grpc.status.OK);
    await server.close(); // idempotent
    await server.forceClose();
  });

  it("has removed the working directory of every finished job once close() resolved", async () => {
    const server = await startTestServer({
      services: { where: { waitgroup: "slow", command: ["sh", "-c", "pwd; mkdir sub; touch sub/left"] } },
    });
    const a = await BrokerStream.open(server.grpcAddress);
    a.want("w", "where");
    a.job("w", (await a.next("offer")).offerToken);
    const done = await a.next("done", 10_000);
    expect(done.receipt?.exitCode).to.equal(0);
    const cwd = Buffer.from(done.receipt!.stdoutPrefix).toString().trim();
    expect(cwd).to.match(/slotbroker-job-/);
    await server.close();
    expect(existsSync(cwd)).to.equal(false);
  });

  it("ends every open stream when it stops (one shutdown listener for all of them)", async () => {
    const server = await startTestServer();
    const streams = await Promise.all([1, 2, 3].map(() => BrokerStream.open(server.grpcAddress)));
    streams[1]!.want("parked", "noop");
    await server.close();
    for (const s of streams) expect((await s.ended).code).to.equal(grpc.status.OK);
    expect(server.status().connections).to.have.length(0);
  });

  it("refuses to start on a non-loopback address without a token", async () => {
    const config = { ...compileExecserverConfig({ waitgroups: {}, services: {} }, "t"), listen: "0.0.0.0:0", adminListen: "127.0.0.1:0" };
    let error: unknown;
    try {
      const handle = await startExecserver(config);
      await handle.forceClose();
    } catch (err) {
      error = err;
    }
    expect(error).to.be.instanceOf(ConfigError);
    expect((error as Error).message).to.match(/^token: required/);
  });
});
