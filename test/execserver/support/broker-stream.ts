import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import {
  BrokerService,
  ConnectRequestSchema,
  JobSpecSchema,
  type ConnectRequest,
  type ConnectResponse,
  type GetStatusResponse,
  type Hello,
  type JobSpec,
} from "../../../gen/slotbroker/v1/broker_pb.js";
import { grpcClientConstructor } from "../../../src/shared/grpc.js";
import { release, track } from "../../../harness/resources.js";

/** The kinds of frame an execserver sends. */
export type ResponseKind = NonNullable<ConnectResponse["frame"]["case"]>;
/** The message carried by a frame kind. */
export type ResponseValue<K extends ResponseKind> = Extract<ConnectResponse["frame"], { case: K }>["value"];

/** Options for opening a stream or a status client. */
export interface ClientOptions {
  /** Sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Sent as `slotbroker-client`. */
  clientName?: string;
  /** Raw authorization header value, overriding `token`. */
  authorization?: string;
  /** Channel credentials (default: insecure). */
  credentials?: grpc.ChannelCredentials;
  /** More channel options, e.g. grpc.ssl_target_name_override. */
  channelOptions?: grpc.ChannelOptions;
}

const Client = grpcClientConstructor(BrokerService);

const opened: object[] = [];

/** Remembers a tracked resource so `releaseAll()` closes it. */
export function closeLater<T extends object>(resource: T): T {
  opened.push(resource);
  return resource;
}

/** Releases everything opened through these helpers, newest first; for `afterEach`. */
export async function releaseAll(): Promise<void> {
  for (const resource of opened.splice(0).reverse()) await release(resource);
}

// Each client gets its own subchannel pool, i.e. its own HTTP/2 connection, like separate fylrs.
const channelOptions = { "grpc.use_local_subchannel_pool": 1 };

function metadataFor(options: ClientOptions): grpc.Metadata {
  const metadata = new grpc.Metadata();
  const auth = options.authorization ?? (options.token === undefined ? undefined : `Bearer ${options.token}`);
  if (auth !== undefined) metadata.set("authorization", auth);
  if (options.clientName) metadata.set("slotbroker-client", options.clientName);
  return metadata;
}

/**
 * A test-side broker stream: collects every frame the execserver sends, lets a test await
 * the next frame of a kind, and sends frames with small helpers. Tracked for leak checks;
 * close it with `release(stream)` or `stream.close()`.
 */
export class BrokerStream {
  /** Every frame received, in order (consumed or not). */
  readonly received: ConnectResponse[] = [];
  /** Resolves with the final status when the call ends. */
  readonly ended: Promise<grpc.StatusObject>;
  private readonly pending: ConnectResponse[] = [];
  private readonly waiters = new Set<{ kind: ResponseKind; resolve: (frame: ConnectResponse) => void }>();
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<ConnectRequest, ConnectResponse>;
  private endStatus: grpc.StatusObject | undefined;

  private constructor(address: string, options: ClientOptions) {
    this.client = new Client(address, options.credentials ?? grpc.credentials.createInsecure(), { ...channelOptions, ...options.channelOptions });
    const connect = (this.client as unknown as { connect: (m: grpc.Metadata) => grpc.ClientDuplexStream<ConnectRequest, ConnectResponse> }).connect;
    this.call = connect.call(this.client, metadataFor(options));
    this.call.on("data", (frame: ConnectResponse) => this.onFrame(frame));
    this.ended = new Promise((resolve) => {
      this.call.on("status", (status: grpc.StatusObject) => {
        this.endStatus = status;
        resolve(status);
      });
    });
    // Errors surface through `ended`; without a listener they would be thrown.
    this.call.on("error", () => undefined);
  }

  /** Opens a stream; with `awaitHello` (default) resolves after the first Hello. */
  static async open(address: string, options: ClientOptions & { awaitHello?: boolean } = {}): Promise<BrokerStream> {
    const stream = closeLater(track(new BrokerStream(address, options), `broker stream to ${address}`, (s) => s.shutdown()));
    if (options.awaitHello ?? true) await stream.next("hello");
    return stream;
  }

  /** The final status once the call has ended. */
  get status(): grpc.StatusObject | undefined {
    return this.endStatus;
  }

  /** Sends one frame. */
  send(frame: ConnectRequest["frame"]): void {
    this.call.write(create(ConnectRequestSchema, { frame }));
  }

  /** WANT; a fairness weight of 0 means 1. */
  want(jobId: string, service: string, priority = 0, fairnessKey = "", fairnessWeight = 0): void {
    this.send({ case: "want", value: { $typeName: "slotbroker.v1.Want", jobId, service, priority, fairnessKey, fairnessWeight } });
  }

  /** UNWANT. */
  unwant(jobId: string): void {
    this.send({ case: "unwant", value: { $typeName: "slotbroker.v1.Unwant", jobId } });
  }

  /** JOB accepting an offer. */
  job(jobId: string, offerToken: string, spec: Partial<Omit<JobSpec, "$typeName">> = {}, traceparent = ""): void {
    this.send({ case: "job", value: { $typeName: "slotbroker.v1.Job", jobId, offerToken, spec: create(JobSpecSchema, spec), traceparent } });
  }

  /** DECLINE. */
  decline(jobId: string, offerToken: string): void {
    this.send({ case: "decline", value: { $typeName: "slotbroker.v1.Decline", jobId, offerToken } });
  }

  /** QUERY. */
  query(jobId: string): void {
    this.send({ case: "query", value: { $typeName: "slotbroker.v1.Query", jobId } });
  }

  /** PING, resolving with the matching PONG: a barrier — every frame sent before it was handled. */
  async ping(nonce = BigInt(Math.floor(Math.random() * 1e9))): Promise<void> {
    this.send({ case: "ping", value: { $typeName: "slotbroker.v1.Ping", nonce } });
    for (;;) if ((await this.next("pong")).nonce === nonce) return;
  }

  /** Consumes and returns the next frame of `kind`, waiting up to `timeoutMs`. */
  next<K extends ResponseKind>(kind: K, timeoutMs = 5000): Promise<ResponseValue<K>> {
    return this.nextFrame(kind, timeoutMs).then((frame) => frame.frame.value as unknown) as Promise<ResponseValue<K>>;
  }

  private nextFrame(kind: ResponseKind, timeoutMs: number): Promise<ConnectResponse> {
    const index = this.pending.findIndex((f) => f.frame.case === kind);
    if (index >= 0) return Promise.resolve(this.pending.splice(index, 1)[0]!);
    return new Promise((resolve, reject) => {
      const waiter = {
        kind,
        resolve: (frame: ConnectResponse) => {
          clearTimeout(timer);
          resolve(frame);
        },
      };
      const timer = setTimeout(() => {
        this.waiters.delete(waiter);
        const seen = this.received.map((f) => f.frame.case).join(",");
        reject(new Error(`no ${kind} frame within ${timeoutMs} ms (received: ${seen || "nothing"}; status: ${this.endStatus?.details ?? "open"})`));
      }, timeoutMs);
      this.waiters.add(waiter);
    });
  }

  /** Frames of `kind` received but not yet consumed by next(). */
  unconsumed<K extends ResponseKind>(kind: K): ResponseValue<K>[] {
    return this.pending.filter((f) => f.frame.case === kind).map((f) => f.frame.value as ResponseValue<K>);
  }

  /** Drops the stream like a crashed peer would (cancel), and closes the client. */
  async close(): Promise<void> {
    await release(this);
  }

  /** Half-closes our side (a polite goodbye) and waits for the server to end the call. */
  async end(): Promise<grpc.StatusObject> {
    this.call.end();
    return this.ended;
  }

  private shutdown(): void {
    this.call.cancel();
    this.client.close();
  }

  private onFrame(frame: ConnectResponse): void {
    this.received.push(frame);
    for (const waiter of this.waiters) {
      if (waiter.kind === frame.frame.case) {
        this.waiters.delete(waiter);
        waiter.resolve(frame);
        return;
      }
    }
    this.pending.push(frame);
  }
}

/** A unary client for GetStatus. Tracked; close with `release()`. */
export function statusClient(address: string, options: ClientOptions = {}): { getStatus(): Promise<GetStatusResponse>; client: grpc.Client } {
  const client = closeLater(track(new Client(address, grpc.credentials.createInsecure(), channelOptions), `status client ${address}`, (c) => c.close()));
  const call = (client as unknown as {
    getStatus: (r: object, m: grpc.Metadata, cb: (e: grpc.ServiceError | null, r: GetStatusResponse) => void) => void;
  }).getStatus;
  return {
    client,
    getStatus: () =>
      new Promise((resolve, reject) => call.call(client, {}, metadataFor(options), (err, res) => (err ? reject(err) : resolve(res)))),
  };
}

/** Retries `check` until it stops throwing (or rethrows its last error after `timeoutMs`). */
export async function eventually<T>(check: () => T | Promise<T>, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}

/** The Hello type, re-exported for tests. */
export type { Hello };
