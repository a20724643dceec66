import { expect } from "chai";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { release, track } from "../../harness/resources.js";
import { spawnExecserver, type ExecserverProcess } from "../../harness/execserver-process.js";
import { root } from "../integration/support.js";

// Fairness keys seen from outside: a real execserver process, and a client whose protocol
// code is protobufjs's, built from the .proto at run time (no generated code, none of the
// project's codecs), the way a client author in another stack would start.

interface Frame {
  hello?: object;
  offer?: { jobId: string; offerToken: string };
  done?: { jobId: string };
  reject?: { jobId: string; code: string; message: string };
  pong?: { nonce: string };
}

const definition = protoLoader.loadSync(join(root, "proto/slotbroker/v1/broker.proto"), {
  includeDirs: [join(root, "proto")],
  longs: String,
  enums: String,
  defaults: false,
});
const pkg = grpc.loadPackageDefinition(definition) as unknown as { slotbroker: { v1: { BrokerService: grpc.ServiceClientConstructor } } };

/** One raw Connect stream: frames in as plain objects, frames out as they arrive. */
class RawStream {
  private readonly frames: Frame[] = [];
  private readonly waiting: ((frame: Frame) => void)[] = [];
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<object, Frame>;

  constructor(address: string, name: string) {
    this.client = new pkg.slotbroker.v1.BrokerService(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
    const metadata = new grpc.Metadata();
    metadata.set("slotbroker-client", name);
    this.call = (this.client as unknown as { connect: (m: grpc.Metadata) => grpc.ClientDuplexStream<object, Frame> }).connect(metadata);
    this.call.on("data", (frame: Frame) => {
      const waiter = this.waiting.shift();
      if (waiter) waiter(frame);
      else this.frames.push(frame);
    });
    this.call.on("error", () => undefined);
    track(this, `raw stream ${name}`, (s) => s.close());
  }

  send(frame: object): void {
    this.call.write(frame);
  }

  /** The first frame: the Hello. */
  async hello(): Promise<{ capabilities: string[] }> {
    const frame = this.frames.shift() ?? (await new Promise<Frame>((resolve) => this.waiting.push(resolve)));
    return frame.hello as { capabilities: string[] };
  }

  /** The next frame that is not a Hello. */
  async next(): Promise<Frame> {
    for (;;) {
      const frame = this.frames.shift() ?? (await new Promise<Frame>((resolve) => this.waiting.push(resolve)));
      if (!frame.hello) return frame;
    }
  }

  /** Sends a Ping and returns every frame that came before its Pong (Hellos left out). */
  async barrier(nonce: string): Promise<Frame[]> {
    this.send({ ping: { nonce } });
    const before: Frame[] = [];
    for (let frame = await this.next(); frame.pong?.nonce !== nonce; frame = await this.next()) before.push(frame);
    return before;
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }
}

/** Answers each Offer with a Job of the builtin noop (its Done frees the slot again) until `count` offers came. */
async function takeOffers(streams: RawStream[], count: number): Promise<string[]> {
  const order: string[] = [];
  const pending = streams.map((s) => s.next().then((frame) => ({ s, frame })));
  while (order.length < count) {
    const { s, frame } = await Promise.race(pending);
    pending[streams.indexOf(s)] = s.next().then((next) => ({ s, frame: next }));
    if (frame.reject) throw new Error(`unexpected reject: ${JSON.stringify(frame.reject)}`);
    if (!frame.offer) continue;
    order.push(frame.offer.jobId);
    s.send({ job: { jobId: frame.offer.jobId, offerToken: frame.offer.offerToken, spec: {} } });
  }
  return order;
}

describe("fairness keys at a real execserver, driven by a client built from the .proto", function () {
  this.timeout(60_000);
  let server: ExecserverProcess;

  before(async () => {
    server = await spawnExecserver({
      instanceId: "keys-exec",
      waitgroups: { w: { processes: 1 } },
      services: { hold: { waitgroup: "w", command: ["sleep"] }, noop: { waitgroup: "w", builtin: "noop" } },
    });
  });
  after(() => release(server));

  // Holds the one slot with a sleeping job until cancelBlocker(), so that wants park.
  async function blockSlot(stream: RawStream): Promise<void> {
    stream.send({ want: { jobId: "blocker", service: "hold" } });
    const offer = (await stream.next()).offer!;
    stream.send({ job: { jobId: "blocker", offerToken: offer.offerToken, spec: { args: ["30"] } } });
  }

  it("offers one connection's keyed wants key by key, weighted, first in first out within a key", async () => {
    const stream = new RawStream(server.grpcAddress, "keyed");
    try {
      expect((await stream.hello()).capabilities).to.include("fairness-keys");
      await blockSlot(stream);
      for (const id of ["a1", "a2", "a3", "a4"]) stream.send({ want: { jobId: id, service: "noop", fairnessKey: "tenant-a", fairnessWeight: 3 } });
      for (const id of ["b1", "b2"]) stream.send({ want: { jobId: id, service: "noop", fairnessKey: "tenant-b" } });
      for (const id of ["c1", "c2"]) stream.send({ want: { jobId: id, service: "noop", fairnessKey: "tenant-c", fairnessWeight: 0 } });
      expect(await stream.barrier("1"), "nothing offered or rejected while the slot is held").to.deep.equal([]);
      const status = await server.status();
      expect(status.waitgroups[0]!.book.map((d) => [d.priority, Number(d.wants), d.keys])).to.deep.equal([[0, 8, 3]]);
      stream.send({ cancel: { jobId: "blocker" } });
      expect(await takeOffers([stream], 8)).to.deep.equal(["a1", "a2", "a3", "b1", "c1", "a4", "b2", "c2"]);
    } finally {
      await release(stream);
    }
  });

  it("serves an old client without keys beside a keyed one: connections alternate, each in its own order", async () => {
    const old = new RawStream(server.grpcAddress, "old");
    const keyed = new RawStream(server.grpcAddress, "new");
    try {
      await blockSlot(old);
      for (const id of ["o1", "o2", "o3", "o4"]) old.send({ want: { jobId: id, service: "noop" } });
      await old.barrier("2");
      for (const id of ["x1", "x2", "x3"]) keyed.send({ want: { jobId: id, service: "noop", fairnessKey: "x", fairnessWeight: 2 } });
      keyed.send({ want: { jobId: "y1", service: "noop", fairnessKey: "y" } });
      await keyed.barrier("3");
      old.send({ cancel: { jobId: "blocker" } });
      expect(await takeOffers([old, keyed], 8)).to.deep.equal(["o1", "x1", "o2", "x2", "o3", "y1", "o4", "x3"]);
    } finally {
      await release(old);
      await release(keyed);
    }
  });

  it("rejects an oversize key and an out-of-range weight naming the field, and keeps serving", async () => {
    const stream = new RawStream(server.grpcAddress, "hostile");
    try {
      stream.send({ want: { jobId: "long", service: "noop", fairnessKey: "k".repeat(129) } });
      stream.send({ want: { jobId: "heavy", service: "noop", fairnessKey: "t", fairnessWeight: 4294967295 } });
      stream.send({ want: { jobId: "ok", service: "noop", fairnessKey: "ü".repeat(64), fairnessWeight: 1000 } });
      const frames = await stream.barrier("4");
      expect(frames.filter((f) => f.reject).map((f) => f.reject)).to.deep.equal([
        { jobId: "long", code: "REJECT_CODE_INVALID_ARGUMENT", message: "fairness_key: longer than 128 bytes" },
        { jobId: "heavy", code: "REJECT_CODE_INVALID_ARGUMENT", message: "fairness_weight: 4294967295 is more than 1000" },
      ]);
      expect(frames.filter((f) => f.offer).map((f) => f.offer!.jobId)).to.deep.equal(["ok"]);
      const status = await server.status();
      const mine = status.connections.find((c) => c.clientName === "hostile")!;
      expect(Number(mine.rejects)).to.equal(2);
      expect(Number(mine.offers)).to.equal(1);
    } finally {
      await release(stream);
    }
  });
});
