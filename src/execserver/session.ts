import { create } from "@bufbuild/protobuf";
import type { ServerDuplexStream } from "@grpc/grpc-js";
import {
  ConnectResponseSchema,
  PongSchema,
  PositionSchema,
  RejectCode,
  RejectSchema,
  type ConnectRequest,
  type ConnectResponse,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { toGrpcError } from "../shared/grpc.js";
import { LogBudget, type Logger } from "../shared/log.js";
import { ClientConnection, type BrokerCore, type FrameSink, type RejectInfo } from "./broker-core.js";
import { limits } from "./limits.js";
import { helloFrame } from "./frames.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

/** What a session needs from the server around it. */
export interface SessionHost {
  readonly broker: BrokerCore;
  /** The current Hello content version; bumped when clients/services/draining change. */
  readonly helloVersion: number;
  /** The current Hello without peer_address, encoded (see frames.ts helloFrame). */
  sharedHello(): Uint8Array;
  /** The clock for grant latency and runtimes (ms, monotonic). */
  now(): number;
  /** Called once when the stream is gone. */
  closed(session: Session, reason: string): void;
  /** Counts a frame received (for the requests-per-job figures). */
  frameReceived(kind: string): void;
}

// "half-closed": the peer ended its side; the stream ends after its last running job's DONE.
type Lifecycle = "open" | "half-closed" | "closed";

/**
 * One broker stream: decodes frames into BrokerCore calls and writes the answers. It holds no
 * scheduling state of its own; a handler failure is logged and the frame dropped, so no
 * frame can take the stream, let alone the server, down.
 */
export class Session implements FrameSink {
  /** The core's view of this stream. */
  readonly connection: ClientConnection;
  /** The Hello version this peer saw last. */
  helloVersion = -1;
  private state: Lifecycle = "open";
  private warnedUnknownFrame = false;
  // A peer that sends nothing but bad frames gets a few lines, not one per frame.
  private readonly rejectLog = new LogBudget(10, 10_000);

  constructor(
    private readonly call: ServerDuplexStream<ConnectRequest, ConnectResponse>,
    private readonly host: SessionHost,
    id: string,
    private readonly logger: Logger,
    /** Aborted when the server stops; the server then closes every session itself. */
    private readonly signal: AbortSignal,
  ) {
    const clientName = call.metadata.get("slotbroker-client")[0];
    this.connection = new ClientConnection(
      id,
      peerAddress(call.getPeer()),
      typeof clientName === "string" ? clientName.slice(0, 128) : "",
      new Date(),
      this,
    );
  }

  /** Registers with the broker, sends the first Hello and starts reading frames. */
  start(): void {
    this.logger.info({ peer: this.connection.peerAddress, client: this.connection.clientName || undefined }, "connection opened");
    // No listener of its own on the signal: with 10,000 sessions, adding and removing them
    // (a linear search each) cost seconds of CPU on joins and on a mass disconnect.
    if (this.signal.aborted) return this.close("execserver stopped");
    this.host.broker.connect(this.connection);
    this.sendHello();
    this.call.on("data", (frame: ConnectRequest) => this.onFrame(frame));
    // A half-close is a goodbye that still waits for the DONE of every running job.
    this.call.on("end", () => this.halfClosed());
    this.call.on("error", (err: Error) => this.close(`stream error: ${err.message}`));
    this.call.on("cancelled", () => this.close("cancelled"));
    this.call.on("close", () => this.close("closed"));
  }

  /** Sends a frame (a message, or pre-encoded bytes) unless the stream is gone. */
  send(frame: ConnectResponse | Uint8Array): void {
    if (this.state === "closed") return;
    try {
      // The server's Connect serializer passes Uint8Arrays through (see frames.ts).
      if (!this.call.write(frame as ConnectResponse) && this.call.writableLength > limits.maxQueuedFrames) {
        // A peer that stops reading would otherwise pin unbounded memory here.
        this.logger.warn({ queued: this.call.writableLength }, "peer is not reading its stream; closing it");
        this.call.emit("error", toGrpcError(new SlotbrokerError(Code.ResourceExhausted, "too many frames queued: the peer is not reading")));
        this.close("peer not reading");
      }
    } catch (err) {
      this.logger.debug({ err }, "write failed");
      this.close("write failed");
    }
  }

  /** Sends the current Hello if this peer has not seen it yet; `shared` saves re-encoding it per peer. */
  sendHello(shared?: Uint8Array): void {
    if (this.helloVersion === this.host.helloVersion) return;
    this.helloVersion = this.host.helloVersion;
    this.send(helloFrame(shared ?? this.host.sharedHello(), this.connection.peerAddress));
  }

  /** @inheritdoc */
  jobFinished(): void {
    if (this.state === "half-closed" && this.connection.running === 0) this.close("peer half-closed and its last job is done");
  }

  /** Ends the stream (OK status) and forgets the connection. Idempotent. */
  close(reason: string): void {
    if (this.state === "closed") return;
    this.state = "closed";
    const seconds = Math.round((Date.now() - this.connection.connectedAt.getTime()) / 100) / 10;
    this.logger.info({ reason, seconds, rejects: this.connection.rejects || undefined }, "connection closed");
    try {
      this.host.broker.disconnect(this.connection);
    } finally {
      this.host.closed(this, reason);
      try {
        this.call.end();
      } catch {
        // the transport is already gone; nothing to tell the peer
      }
    }
  }

  private halfClosed(): void {
    if (this.state !== "open") return;
    this.state = "half-closed";
    const running = this.host.broker.halfClose(this.connection);
    if (running === 0) this.close("peer ended the stream");
    else this.logger.debug({ running }, "peer half-closed; ending the stream after its running jobs' DONE");
  }

  private onFrame(request: ConnectRequest): void {
    if (this.state !== "open") return;
    try {
      this.handle(request);
    } catch (err) {
      this.logger.error({ err, frame: request.frame.case }, "frame handler failed; frame dropped");
    }
  }

  private handle(request: ConnectRequest): void {
    const broker = this.host.broker;
    const frame = request.frame;
    this.host.frameReceived(frame.case ?? "unknown");
    switch (frame.case) {
      case "want": {
        const w = frame.value;
        this.answer(w.jobId, broker.want(this.connection, w.jobId, w.service, w.priority, w.fairnessKey, w.fairnessWeight));
        return;
      }
      case "unwant":
        broker.unwant(this.connection, frame.value.jobId);
        return;
      case "job": {
        const j = frame.value;
        this.answer(j.jobId, broker.job(this.connection, j.jobId, j.offerToken, j.spec, j.traceparent));
        return;
      }
      case "decline":
        broker.decline(this.connection, frame.value.jobId, frame.value.offerToken);
        return;
      case "ping":
        this.send(create(ConnectResponseSchema, { frame: { case: "pong", value: create(PongSchema, { nonce: frame.value.nonce }) } }));
        return;
      case "query":
        this.sendPosition(frame.value.jobId);
        return;
      case "cancel":
        broker.cancel(this.connection, frame.value.jobId);
        return;
      default:
        // Forward compatibility: a newer peer may send frames we do not know.
        if (!this.warnedUnknownFrame) {
          this.warnedUnknownFrame = true;
          this.logger.warn("skipping an empty or unknown frame kind (logged once per connection)");
        }
    }
  }

  private sendPosition(jobId: string): void {
    const p = this.host.broker.position(this.connection, jobId);
    const value = create(PositionSchema, {
      jobId: echoId(jobId),
      state: p.state,
      waitgroup: p.waitgroup,
      running: p.running,
      ahead: p.ahead,
      capacity: p.capacity,
      eta: p.etaMs === undefined ? undefined : durationFromMs(Math.round(p.etaMs)),
    });
    this.send(create(ConnectResponseSchema, { frame: { case: "position", value } }));
  }

  private answer(jobId: string, reject: RejectInfo | undefined): void {
    if (!reject) return;
    const left = this.rejectLog.take();
    if (left !== undefined) {
      this.logger.info({ jobId: echoId(jobId), code: RejectCode[reject.code], message: reject.message, notLogged: left || undefined }, "frame rejected");
    }
    const value = create(RejectSchema, { jobId: echoId(jobId), code: reject.code, message: reject.message });
    this.send(create(ConnectResponseSchema, { frame: { case: "reject", value } }));
  }
}

// An oversize job_id is cut before it is echoed, so a Reject never amplifies a frame.
function echoId(jobId: string): string {
  return jobId.length > limits.jobIdBytes ? jobId.slice(0, limits.jobIdBytes) : jobId;
}

// grpc-js reports "host:port" with IPv6 hosts unbracketed; bracket them so the port is
// unambiguous.
function peerAddress(peer: string): string {
  const colon = peer.lastIndexOf(":");
  if (colon < 0) return peer;
  const host = peer.slice(0, colon);
  return host.includes(":") && !host.startsWith("[") ? `[${host}]${peer.slice(colon)}` : peer;
}
