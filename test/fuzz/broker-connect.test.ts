// Fuzzing BrokerService.Connect of a real execserver process: valid, mutated and random
// protobuf frames on many streams, some cancelled mid-way. The execserver must stay up,
// keep serving a well-behaved fylr throughout, and strand nothing: once the fuzzing
// streams are gone, no slot is running or offered and no want is parked.
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { ConnectRequestSchema, ConnectResponseSchema, type ConnectRequest } from "../../gen/slotbroker/v1/broker_pb.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { BrokerStream, releaseAll } from "../execserver/support/broker-stream.js";
import { spawnExecserver, stopExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { track, release } from "../../harness/resources.js";
import { Fuzz, withSeed } from "./fuzz.js";

const STREAMS = 40;
const FRAMES_PER_STREAM = 30;
const identity = (b: Buffer): Buffer => b;

describe("fuzz: BrokerService.Connect of a real execserver", function () {
  this.timeout(60_000);
  let exec: ExecserverProcess | undefined;
  before(async () => {
    exec = await spawnExecserver({
      instanceId: "fuzz-exec",
      offerTimeout: "1s",
      waitgroups: { w: { processes: 3 } },
      services: { noop: { waitgroup: "w", builtin: "noop" }, sleep: { waitgroup: "w", command: ["sleep"], timeout: "5s" } },
    });
  });
  after(() => stopExecserver(exec));
  afterEach(releaseAll);

  it("stays up, serves a well-behaved stream throughout and strands nothing", async () => {
    const fuzz = Fuzz.fromEnv();
    await withSeed(fuzz, async () => {
      const address = exec!.grpcAddress;
      const control = await BrokerStream.open(address);
      let controlRounds = 0;
      const fuzzing = (async () => {
        for (let s = 0; s < STREAMS; s += 4) await Promise.all([0, 1, 2, 3].map((k) => fuzzStream(fuzz, address, s + k)));
      })();
      // A fylr that does everything right keeps getting slots while the others misbehave.
      let done = false;
      void fuzzing.finally(() => (done = true));
      while (!done || controlRounds === 0) {
        const jobId = `control-${controlRounds}`;
        control.want(jobId, "noop");
        const offer = await control.next("offer", 15_000);
        control.job(jobId, offer.offerToken);
        expect((await control.next("done", 15_000)).jobId).to.equal(jobId);
        controlRounds += 1;
      }
      await fuzzing;
      expect(exec!.child.exitCode, `execserver exited:\n${exec!.stderr().slice(-2000)}`).to.equal(null);
      await control.close();
      const status = await waitFor("no slot running or offered, no want parked, no stream left", async () => {
        const s = await exec!.status();
        const w = s.waitgroups[0]!;
        return w.running === 0 && w.offered === 0 && w.waiting === 0n && s.connections.length === 0 ? s : undefined;
      }, 20_000);
      expect(status.waitgroups[0]!.free).to.equal(3);
      expect(controlRounds).to.be.greaterThan(0);
    });
  });
});

// One stream: a mix of valid frames (using offers it got), mutated valid frames and random
// bytes; ended, half-closed or cancelled at random.
async function fuzzStream(fuzz: Fuzz, address: string, n: number): Promise<void> {
  const client = track(new grpc.Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 }), "fuzz client", (c) => c.close());
  try {
    const call = client.makeBidiStreamRequest("/slotbroker.v1.BrokerService/Connect", identity, identity, new grpc.Metadata());
    const offers: { jobId: string; offerToken: string }[] = [];
    call.on("data", (b: Buffer) => {
      try {
        const frame = fromBinary(ConnectResponseSchema, b);
        if (frame.frame.case === "offer") offers.push(frame.frame.value);
      } catch {
        /* the execserver's frames are not under test here */
      }
    });
    call.on("error", () => undefined);
    const ended = new Promise<void>((resolve) => call.on("status", () => resolve()));
    for (let i = 0; i < FRAMES_PER_STREAM; i++) {
      const valid = toBinary(ConnectRequestSchema, validFrame(fuzz, n, offers));
      const r = fuzz.rand();
      call.write(r < 0.35 ? Buffer.from(valid) : r < 0.85 ? fuzz.mutate(valid) : fuzz.bytes(fuzz.int(200)));
      if (fuzz.rand() < 0.2) await new Promise((resolve) => setTimeout(resolve, fuzz.int(30)));
      if (call.closed) break;
    }
    const how = fuzz.rand();
    if (how < 0.4) call.end();
    else if (how < 0.8) call.cancel();
    else {
      await new Promise((resolve) => setTimeout(resolve, 200));
      call.cancel();
    }
    await Promise.race([ended, new Promise((resolve) => setTimeout(resolve, 3_000))]);
    call.cancel();
  } finally {
    await release(client);
  }
}

function validFrame(fuzz: Fuzz, n: number, offers: readonly { jobId: string; offerToken: string }[]): ConnectRequest {
  const jobId = `s${n}-j${fuzz.int(6)}`;
  const offer = offers.length > 0 && fuzz.rand() < 0.6 ? fuzz.pick(offers) : { jobId, offerToken: fuzz.bytes(8).toString("hex") };
  const spec = {
    args: fuzz.pick([["0.2"], ["x"], [], ["1", "2"]]),
    env: fuzz.rand() < 0.2 ? { PATH: "/bin" } : ({} as Record<string, string>),
    timeout: durationFromMs(fuzz.pick([0, 100, 1000])),
    stdinUrl: fuzz.pick(["", "http://127.0.0.1:1/pipe/in/x", "not a url"]),
    stdoutUrl: fuzz.pick(["", "http://127.0.0.1:1/pipe/out/x"]),
    // Empty, small, at the 64 KiB limit, one past it (INVALID_ARGUMENT), or next to stdin_url.
    stdinInline: fuzz.bytes(fuzz.pick([0, 0, 0, 10, 65_536, 65_537])),
  };
  const frames: MessageInitShape<typeof ConnectRequestSchema>["frame"][] = [
    { case: "want", value: { jobId, service: fuzz.pick(["noop", "sleep", "nope", ""]), priority: fuzz.pick([0, 5, -1, 2 ** 31 - 1]) } },
    { case: "unwant", value: { jobId } },
    { case: "job", value: { jobId: offer.jobId, offerToken: offer.offerToken, spec } },
    { case: "decline", value: { jobId: offer.jobId, offerToken: offer.offerToken } },
    { case: "ping", value: { nonce: BigInt(fuzz.int(1e9)) } },
    { case: "query", value: { jobId } },
  ];
  return create(ConnectRequestSchema, { frame: fuzz.pick(frames) });
}
