// A broker stream over bare node:http2 (one HTTP/2 session = one TCP connection, one
// Connect call): gRPC's 5-byte length prefix by hand, frames encoded by the fylr's own
// encoders. A grpc-js channel costs a few hundred KiB in the client; the connections bench
// opens 10,000 of these, so its clients use this lighter one. The server is the real
// execserver either way.
import { connect, type ClientHttp2Session, type ClientHttp2Stream } from "node:http2";
import { fromBinary } from "@bufbuild/protobuf";
import { ConnectResponseSchema, type ConnectResponse } from "../../gen/slotbroker/v1/broker_pb.js";

const connectPath = "/slotbroker.v1.BrokerService/Connect";

/** One Connect stream; `onFrame` gets every decoded ConnectResponse. */
export class H2BrokerStream {
  private pending: Buffer = Buffer.alloc(0);
  private closedValue = false;
  /** Why the stream ended, once it has. */
  closeReason = "";

  private constructor(
    private readonly session: ClientHttp2Session,
    private readonly stream: ClientHttp2Stream,
    private readonly onFrame: (frame: ConnectResponse) => void,
  ) {
    stream.on("data", (chunk: Buffer) => this.receive(chunk));
    const closed = (why: string) => (err?: Error): void => {
      if (!this.closedValue) this.closeReason = `${why}${err ? `: ${err.message}` : ""} (rst ${stream.rstCode ?? "-"})`;
      this.closedValue = true;
    };
    stream.on("close", closed("stream closed"));
    stream.on("error", closed("stream error"));
    session.on("error", closed("session error"));
    session.on("goaway", (code: number) => closed(`GOAWAY ${code}`)());
  }

  /** Opens a session and its Connect stream. */
  static open(address: string, onFrame: (frame: ConnectResponse) => void): H2BrokerStream {
    const session = connect(`http://${address}`);
    const stream = session.request({ ":method": "POST", ":path": connectPath, "content-type": "application/grpc", te: "trailers" });
    return new H2BrokerStream(session, stream, onFrame);
  }

  get closed(): boolean {
    return this.closedValue;
  }

  /** Writes one encoded ConnectRequest with its gRPC prefix. */
  write(message: Uint8Array): void {
    const framed = Buffer.allocUnsafe(5 + message.length);
    framed[0] = 0;
    framed.writeUInt32BE(message.length, 1);
    framed.set(message, 5);
    this.stream.write(framed);
  }

  /** Closes the session at once (RST), like a client that goes away. */
  destroy(): void {
    this.stream.destroy();
    this.session.destroy();
  }

  private receive(chunk: Buffer): void {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    while (this.pending.length >= 5) {
      const length = this.pending.readUInt32BE(1);
      if (this.pending.length < 5 + length) return;
      const message = this.pending.subarray(5, 5 + length);
      this.pending = this.pending.subarray(5 + length);
      this.onFrame(fromBinary(ConnectResponseSchema, message));
    }
  }
}

/** Wall-clock milliseconds with sub-millisecond resolution, comparable across processes. */
export function epochMs(): number {
  return performance.timeOrigin + performance.now();
}
