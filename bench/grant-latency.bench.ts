// grant-latency: WANT → OFFER on an idle slot over loopback gRPC, the execserver in its own
// process (the real CLI), p50 and p99; baseline: a raw grpc-js bidi ping-pong round trip
// between two processes, measured in the same run, in alternating blocks so machine noise
// hits both alike. Each OFFER is answered with JOB on the builtin noop service and DONE is
// awaited before the next WANT, so the slot is idle every time; only WANT→OFFER is timed.
// The client side speaks the fylr's own wire code (src/fylr/broker/frames.ts: WANT and JOB
// encoded by hand, OFFER/DONE/PONG decoded by hand), as a fylr does; the raw baseline pays
// no (de)serialization at all.
//   npm run bench -- grant-latency
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { ConnectRequestSchema, JobSpecSchema, type ConnectResponse } from "../gen/slotbroker/v1/broker_pb.js";
import { brokerClientConstructor, encodeJob, encodeWant, type OutgoingFrame } from "../src/fylr/broker/frames.js";
import { echoServerScript, openEchoStream, startChild } from "./lib/raw-grpc.js";
import { emit, nowUs, percentile } from "./lib/figure.js";

const blocks = 10;
const perBlock = 1000;
const warmup = 1000;


async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "bench-grant-latency-"));
  const config = join(dir, "exec.yaml");
  writeFileSync(
    config,
    "listen: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nwaitgroups: {bench: {processes: 1}}\nservices: {noop: {waitgroup: bench, builtin: noop}}\n",
  );
  const here = fileURLToPath(import.meta.url);
  const cli = join(here, "..", "..", "src", "cli.ts");
  const exec = await startChild([cli, "execserver", "--config", config]);
  const echo = await startChild([echoServerScript]);
  try {
    const broker = await BrokerClient.open(exec.address);
    const raw = await RawEcho.open(echo.address);
    for (let i = 0; i < warmup; i++) {
      await broker.cycle(i);
      await raw.roundTrip();
    }
    const grants: number[] = [];
    const rtts: number[] = [];
    const pings: number[] = [];
    for (let b = 0; b < blocks; b++) {
      for (let i = 0; i < perBlock; i++) rtts.push(await raw.roundTrip());
      for (let i = 0; i < perBlock; i++) grants.push(await broker.cycle(b * perBlock + i));
      for (let i = 0; i < perBlock; i++) pings.push(await broker.ping(i));
    }
    broker.close();
    raw.close();
    grants.sort((x, y) => x - y);
    pings.sort((x, y) => x - y);
    rtts.sort((x, y) => x - y);
    const params = { samples: grants.length, blocks, slot: "idle, builtin noop, 1 process", server: "separate process", better: "lower" };
    for (const p of [50, 99]) {
      emit({
        bench: "grant-latency",
        metric: `p${p}_us`,
        value: percentile(grants, p),
        baseline: "grpc-js raw bidi rtt",
        baseline_value: percentile(rtts, p),
        params: { ...params, goal: p === 50 ? "≤ 1.5" : "≤ 1.8" },
      });
    }
    // Context for the ratio: the same stream's PING→PONG, i.e. what protobuf-es framing
    // alone costs over the raw transport; WANT→OFFER minus this is the broker's own work.
    emit({
      bench: "grant-latency",
      metric: "protocol_ping_p50_us",
      value: percentile(pings, 50),
      baseline: "grpc-js raw bidi rtt",
      baseline_value: percentile(rtts, 50),
      params: { ...params, what: "PING→PONG on the broker stream (no grant)" },
    });
  } finally {
    exec.child.kill("SIGTERM");
    echo.child.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}


/** One broker stream; cycle() runs WANT→OFFER (timed) →JOB→DONE. */
class BrokerClient {
  private waiting: ((frame: ConnectResponse) => void) | undefined;
  private readonly spec = create(JobSpecSchema, {});

  private constructor(
    private readonly client: grpc.Client,
    private readonly call: grpc.ClientDuplexStream<OutgoingFrame, ConnectResponse>,
  ) {
    call.on("data", (frame: ConnectResponse) => {
      if (frame.frame.case === "hello" && !this.waiting) return;
      const waiting = this.waiting;
      this.waiting = undefined;
      waiting?.(frame);
    });
    call.on("error", () => undefined);
  }

  static async open(address: string): Promise<BrokerClient> {
    const Client = brokerClientConstructor();
    const client = new Client(address, grpc.credentials.createInsecure());
    const call = (client as unknown as { connect: () => grpc.ClientDuplexStream<OutgoingFrame, ConnectResponse> }).connect();
    const broker = new BrokerClient(client, call);
    await broker.next(); // Hello
    return broker;
  }

  async cycle(i: number): Promise<number> {
    const jobId = `j${i}`;
    const start = nowUs();
    this.call.write(encodeWant(jobId, "noop", 0));
    const offer = await this.next();
    const elapsed = nowUs() - start;
    if (offer.frame.case !== "offer") throw new Error(`expected an offer, got ${offer.frame.case}`);
    this.call.write(encodeJob(jobId, offer.frame.value.offerToken, this.spec));
    const done = await this.next();
    if (done.frame.case !== "done") throw new Error(`expected done, got ${done.frame.case}`);
    return elapsed;
  }

  // PING→PONG on the same stream: the protocol's own floor (protobuf-es both ends, no grant).
  async ping(i: number): Promise<number> {
    const start = nowUs();
    this.call.write(create(ConnectRequestSchema, { frame: { case: "ping", value: { nonce: BigInt(i) } } }));
    const pong = await this.next();
    if (pong.frame.case !== "pong") throw new Error(`expected a pong, got ${pong.frame.case}`);
    return nowUs() - start;
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }

  private next(): Promise<ConnectResponse> {
    return new Promise((resolve) => (this.waiting = resolve));
  }
}

/** The baseline: a raw bidi stream whose server echoes each message. */
class RawEcho {
  private waiting: (() => void) | undefined;
  private readonly payload = Buffer.alloc(32, 7);

  private constructor(
    private readonly client: grpc.Client,
    private readonly call: grpc.ClientDuplexStream<Buffer, Buffer>,
  ) {
    call.on("data", () => {
      const waiting = this.waiting;
      this.waiting = undefined;
      waiting?.();
    });
    call.on("error", () => undefined);
  }

  static open(address: string): Promise<RawEcho> {
    const { client, call } = openEchoStream(address);
    return Promise.resolve(new RawEcho(client, call));
  }

  roundTrip(): Promise<number> {
    const start = nowUs();
    return new Promise((resolve) => {
      this.waiting = () => resolve(nowUs() - start);
      this.call.write(this.payload);
    });
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }
}

await main();
