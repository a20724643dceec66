// A scripted execserver for fuzzing a real fylr: a gRPC server on loopback whose Connect
// handler speaks raw bytes, so it can send valid frames, mutated ones and receipts no
// real execserver would write, and do hostile things to the fylr's pipe URLs.
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { ConnectRequestSchema, ConnectResponseSchema, type Job } from "../../gen/slotbroker/v1/broker_pb.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { rawBidiService } from "../../bench/lib/raw-bidi.js";

type Frame = MessageInitShape<typeof ConnectResponseSchema>["frame"];

/** What to do with one JOB: the fuzzer decides; `write` sends raw bytes on the stream. */
export type JobHandler = (job: Job, stream: { send(frame: Frame): void; write(bytes: Buffer): void; fail(): void }) => Promise<void> | void;

export class FakeExecserver {
  readonly address: string;
  /** Jobs received, by job id. */
  readonly jobs = new Map<string, Job>();
  private readonly calls = new Map<grpc.ServerDuplexStream<Buffer, Buffer>, (frame: Frame) => void>();

  private constructor(
    private readonly server: grpc.Server,
    port: number,
    private readonly handlers: { onJob: JobHandler; onWant?: (jobId: string, send: (frame: Frame) => void, write: (b: Buffer) => void) => void },
  ) {
    this.address = `127.0.0.1:${port}`;
  }

  static async start(handlers: FakeExecserver["handlers"]): Promise<FakeExecserver> {
    const server = new grpc.Server();
    const ref: { fake?: FakeExecserver } = {};
    const definition = rawBidiService("connect", "/slotbroker.v1.BrokerService/Connect");
    server.addService(definition, { connect: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => ref.fake!.serve(call) });
    const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
    ref.fake = new FakeExecserver(server, port, handlers);
    return ref.fake;
  }

  /** Sets what happens to later JOBs (e.g. well-behaved after the fuzzing). */
  setJobHandler(onJob: JobHandler): void {
    this.handlers.onJob = onJob;
  }

  /** Broker streams open now. */
  get streams(): number {
    return this.calls.size;
  }

  /** Drops every open stream (the fylr reconnects). */
  dropStreams(): void {
    for (const call of this.calls.keys()) call.emit("error", { code: grpc.status.UNAVAILABLE, details: "dropped" });
    this.calls.clear();
  }

  /** Sends one frame on every open stream. */
  sendAll(frame: Frame): void {
    for (const send of this.calls.values()) send(frame);
  }

  async close(): Promise<void> {
    for (const call of this.calls.keys()) call.destroy();
    await new Promise<void>((resolve) => this.server.tryShutdown(() => resolve()));
    this.server.forceShutdown();
  }

  private serve(call: grpc.ServerDuplexStream<Buffer, Buffer>): void {
    call.on("error", () => undefined);
    call.on("close", () => this.calls.delete(call));
    const write = (bytes: Buffer): void => {
      if (!call.destroyed && !call.writableEnded) void call.write(bytes);
    };
    const send = (frame: Frame): void => write(Buffer.from(toBinary(ConnectResponseSchema, create(ConnectResponseSchema, { frame }))));
    this.calls.set(call, send);
    const fail = (): void => {
      // grpc-js sends a status for an 'error' event; destroy() alone may leave the client waiting.
      call.emit("error", { code: grpc.status.UNAVAILABLE, details: "the fake execserver drops the stream" });
    };
    send({ case: "hello", value: { instanceId: "fake-exec", services: { fz: "w" }, waitgroups: [{ name: "w", processes: 4 }], clients: 1, peerAddress: call.getPeer() } });
    let tokens = 0;
    call.on("data", (bytes: Buffer) => {
      let request;
      try {
        request = fromBinary(ConnectRequestSchema, bytes);
      } catch {
        return;
      }
      const f = request.frame;
      if (f.case === "want") {
        if (this.handlers.onWant) this.handlers.onWant(f.value.jobId, send, write);
        else send({ case: "offer", value: { jobId: f.value.jobId, offerToken: `t${tokens++}`, expiresIn: durationFromMs(5000), waitgroup: "w" } });
      } else if (f.case === "job") {
        this.jobs.set(f.value.jobId, f.value);
        void Promise.resolve(this.handlers.onJob(f.value, { send, write, fail })).catch(() => undefined);
      } else if (f.case === "ping") {
        send({ case: "pong", value: { nonce: f.value.nonce } });
      }
    });
    call.on("end", () => void call.end());
  }
}
