// A loopback TCP proxy a test or the soak controls: it forwards every connection to one
// upstream and can sever all of them at once (both sockets destroyed mid-stream) or freeze
// them (no byte moves either way until thaw), or refuse them (a server that is down). For
// broker streams and database connections, whose peers must notice on their own.
import { createServer, connect, type Server, type Socket } from "node:net";

/** One proxied connection: the client's socket and the one to the upstream. */
interface Pair {
  readonly client: Socket;
  readonly upstream: Socket;
}

export class ChaosProxy {
  private readonly pairs = new Set<Pair>();
  private frozen = false;
  private blocked = false;
  private server: Server | undefined;
  /** Connections accepted since start. */
  accepted = 0;
  /** Connections destroyed by sever(). */
  severed = 0;

  private constructor(private readonly upstream: { host: string; port: number }) {}

  /** Listens on a free loopback port in front of `upstream` ("host:port"). */
  static async start(upstream: string): Promise<ChaosProxy> {
    const [host, port] = splitAddress(upstream);
    const proxy = new ChaosProxy({ host, port });
    await proxy.listen();
    return proxy;
  }

  /** "127.0.0.1:PORT" to dial instead of the upstream. */
  get address(): string {
    const a = this.server?.address();
    if (!a || typeof a === "string") throw new Error("chaos proxy is not listening");
    return `127.0.0.1:${a.port}`;
  }

  /** Open proxied connections. */
  get connections(): number {
    return this.pairs.size;
  }

  /** Destroys every open connection (both sides): a severed network path. */
  sever(): number {
    const n = this.pairs.size;
    for (const pair of [...this.pairs]) this.drop(pair);
    this.severed += n;
    return n;
  }

  /** Severs every connection and refuses new ones (accepted, then closed at once) until unblock(). */
  block(): void {
    this.blocked = true;
    this.sever();
  }

  unblock(): void {
    this.blocked = false;
  }

  /** Stops moving bytes on every connection, new ones included, until thaw(). */
  freeze(): void {
    this.frozen = true;
    for (const { client, upstream } of this.pairs) {
      client.pause();
      upstream.pause();
    }
  }

  /** Moves bytes again. */
  thaw(): void {
    this.frozen = false;
    for (const { client, upstream } of this.pairs) {
      client.resume();
      upstream.resume();
    }
  }

  async close(): Promise<void> {
    this.sever();
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((done) => server.close(() => done()));
  }

  private listen(): Promise<void> {
    const server = createServer((client) => this.accept(client));
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
  }

  private accept(client: Socket): void {
    if (this.blocked) {
      client.destroy();
      return;
    }
    this.accepted += 1;
    const upstream = connect(this.upstream.port, this.upstream.host);
    const pair: Pair = { client, upstream };
    this.pairs.add(pair);
    client.on("error", () => this.drop(pair));
    upstream.on("error", () => this.drop(pair));
    client.on("close", () => this.drop(pair));
    upstream.on("close", () => this.drop(pair));
    // Forwarded by hand (not pipe()) so freeze() can hold bytes in both directions.
    client.on("data", (chunk) => {
      if (!upstream.write(chunk)) client.pause();
    });
    upstream.on("data", (chunk) => {
      if (!client.write(chunk)) upstream.pause();
    });
    upstream.on("drain", () => !this.frozen && client.resume());
    client.on("drain", () => !this.frozen && upstream.resume());
    client.on("end", () => upstream.end());
    upstream.on("end", () => client.end());
    if (this.frozen) {
      client.pause();
      upstream.pause();
    }
  }

  private drop(pair: Pair): void {
    if (!this.pairs.delete(pair)) return;
    pair.client.destroy();
    pair.upstream.destroy();
  }
}

function splitAddress(address: string): [string, number] {
  const at = address.lastIndexOf(":");
  const port = Number(address.slice(at + 1));
  if (at <= 0 || !Number.isInteger(port) || port <= 0) throw new Error(`expected host:port, got ${address}`);
  return [address.slice(0, at).replace(/^\[|\]$/g, ""), port];
}
