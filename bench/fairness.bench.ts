// fairness: 100 connections park 1…100 wants each in one priority class on a 4-slot
// waitgroup; every OFFER is answered with JOB (builtin noop) and the connection parks a new
// want at once, so every connection keeps wants parked throughout. Grants per connection
// are counted over a window; the figure is Jain's index against perfectly equal shares
// (1.0). A second run parks wants of mixed priorities behind a held slot and counts
// priority inversions in the grant order (goal 0).
//   npm run bench -- fairness
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { BrokerService, ConnectRequestSchema, type ConnectRequest, type ConnectResponse } from "../gen/slotbroker/v1/broker_pb.js";
import { compileExecserverConfig } from "../src/execserver/index.js";
import { startExecserver } from "../src/app/execserver.js";
import { grpcClientConstructor } from "../src/shared/grpc.js";
import { emit } from "./lib/figure.js";

const connections = 100;
const processes = 4;
const warmupGrants = 1_000;
const windowGrants = 100 * connections;
const Client = grpcClientConstructor(BrokerService);

type OfferHandler = (jobId: string, token: string, client: BenchClient) => void;

/** One broker stream with its own TCP connection. */
class BenchClient {
  offers = 0;
  private next = 0;
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<ConnectRequest, ConnectResponse>;
  private pongWaiter: (() => void) | undefined;

  constructor(
    address: string,
    readonly index: number,
    private readonly onOffer: OfferHandler,
  ) {
    this.client = new Client(address, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
    this.call = (this.client as unknown as { connect: () => grpc.ClientDuplexStream<ConnectRequest, ConnectResponse> }).connect();
    this.call.on("data", (frame: ConnectResponse) => {
      if (frame.frame.case === "offer") {
        this.offers++;
        this.onOffer(frame.frame.value.jobId, frame.frame.value.offerToken, this);
      } else if (frame.frame.case === "pong") {
        this.pongWaiter?.();
      } else if (frame.frame.case === "reject") {
        throw new Error(`rejected: ${frame.frame.value.message}`);
      }
    });
    this.call.on("error", () => undefined);
  }

  want(service: string, priority = 0): string {
    const jobId = `c${this.index}-${this.next++}`;
    this.write({ case: "want", value: { jobId, service, priority } });
    return jobId;
  }

  job(jobId: string, offerToken: string): void {
    this.write({ case: "job", value: { jobId, offerToken } });
  }

  decline(jobId: string, offerToken: string): void {
    this.write({ case: "decline", value: { jobId, offerToken } });
  }

  /** Resolves once every frame sent before it has been handled. */
  barrier(): Promise<void> {
    return new Promise((resolve) => {
      this.pongWaiter = resolve;
      this.write({ case: "ping", value: { nonce: 1n } });
    });
  }

  close(): void {
    this.call.cancel();
    this.client.close();
  }

  private write(frame: MessageInitShape<typeof ConnectRequestSchema>["frame"]): void {
    this.call.write(create(ConnectRequestSchema, { frame }));
  }
}

function jain(shares: readonly number[]): number {
  const sum = shares.reduce((a, b) => a + b, 0);
  const squares = shares.reduce((a, b) => a + b * b, 0);
  return (sum * sum) / (shares.length * squares);
}

/** Deterministic PRNG for the mixed-priority run. */
function random(seed: number): () => number {
  return () => {
    seed = (seed * 1664525 + 1013904223) >>> 0;
    return seed / 4294967296;
  };
}

const config = compileExecserverConfig(
  {
    listen: "127.0.0.1:0",
    adminListen: "127.0.0.1:0",
    maxWantsPerConnection: 1_000,
    waitgroups: { fair: { processes }, single: { processes: 1 } },
    services: { noop: { waitgroup: "fair", builtin: "noop" }, single: { waitgroup: "single", builtin: "noop" } },
  },
  "fairness bench",
);
const server = await startExecserver(config);
try {
  await equalShares();
  await priorityOrder();
} finally {
  await server.forceClose();
}

async function equalShares(): Promise<void> {
  let total = 0;
  let counting = false;
  const counted = new Array<number>(connections).fill(0);
  let finished: () => void = () => undefined;
  const done = new Promise<void>((resolve) => (finished = resolve));
  const clients = Array.from(
    { length: connections },
    (_, i) =>
      new BenchClient(server.grpcAddress, i, (jobId, token, client) => {
        total++;
        if (total === warmupGrants) counting = true;
        if (counting) {
          counted[client.index]!++;
          if (total === warmupGrants + windowGrants) finished();
        }
        client.job(jobId, token);
        client.want("noop"); // keep this connection's parked count where it was
      }),
  );
  // Connection i parks i+1 wants: 1…100.
  for (const client of clients) for (let k = 0; k <= client.index; k++) client.want("noop");
  await done;
  clients.forEach((c) => c.close());
  const min = Math.min(...counted);
  const max = Math.max(...counted);
  const parked = clients.map((c) => c.index + 1);
  emit({
    bench: "fairness",
    metric: "jain_index",
    value: jain(counted),
    baseline: "perfectly equal shares",
    baseline_value: 1,
    params: {
      connections,
      parked_per_connection: "1…100",
      processes,
      window_grants: windowGrants,
      jain_exact: Number(jain(counted).toFixed(5)),
      min_grants: min,
      max_grants: max,
      fifo_by_want_would_give: Number(jain(parked).toFixed(3)),
      goal: "≥ 0.99",
      better: "higher",
    },
  });
}

async function priorityOrder(): Promise<void> {
  const rnd = random(42);
  const order: number[] = [];
  const priorityOf = new Map<string, number>();
  let finished: () => void = () => undefined;
  const expected = 20 * 50;
  const done = new Promise<void>((resolve) => (finished = resolve));
  let holding: { jobId: string; token: string } | undefined;
  const holder = new BenchClient(server.grpcAddress, 999, (jobId, token) => (holding = { jobId, token }));
  holder.want("single", 100);
  await holder.barrier();
  while (!holding) await new Promise((r) => setImmediate(r));
  const clients = Array.from(
    { length: 20 },
    (_, i) =>
      new BenchClient(server.grpcAddress, i, (jobId, token, client) => {
        order.push(priorityOf.get(jobId)!);
        client.job(jobId, token);
        if (order.length === expected) finished();
      }),
  );
  for (const client of clients) {
    for (let k = 0; k < 50; k++) {
      const priority = Math.floor(rnd() * 5);
      priorityOf.set(client.want("single", priority), priority);
    }
  }
  await Promise.all(clients.map((c) => c.barrier()));
  holder.decline(holding.jobId, holding.token);
  await done;
  // With one slot each offer follows the previous JOB, so arrival order is grant order.
  let inversions = 0;
  for (let i = 1; i < order.length; i++) if (order[i]! > order[i - 1]!) inversions++;
  holder.close();
  clients.forEach((c) => c.close());
  emit({
    bench: "fairness",
    metric: "priority_inversions",
    value: inversions,
    baseline: "none allowed",
    baseline_value: 0,
    params: { connections: 20, wants: expected, priorities: 5, processes: 1, goal: "0", better: "lower" },
  });
}
