import { BrokerClient, compileBrokerConfig, type BrokerConfigInput } from "../../src/fylr/broker/index.js";
import { ExecClient } from "../../src/fylr/exec-client.js";
import { startFylrHttpServer, type FylrHttpServer } from "../../src/fylr/http/index.js";
import { PipeRegistry } from "../../src/fylr/pipes/index.js";
import { release, track } from "../../harness/resources.js";

/** Short timings so tests notice backpressure and failures quickly. */
export const fastBroker: Omit<BrokerConfigInput, "addresses"> = {
  connectTimeout: "10s",
  retryTick: "200ms",
  growInterval: "300ms",
  reconnectInitial: "50ms",
  reconnectMax: "500ms",
  startupGrace: "3s",
  pingInterval: "1s",
  pingTimeout: "2s",
  positionInterval: "100ms",
};

/** A started broker client, tracked; closed by `release`. */
export function startBroker(input: BrokerConfigInput, name = "broker"): BrokerClient {
  const broker = new BrokerClient(compileBrokerConfig({ ...fastBroker, ...input }));
  broker.start();
  return track(broker, name, (b) => b.close());
}

/** One fylr replica: its broker client, pipe registry, HTTP server and exec client. */
export interface FylrReplica {
  readonly broker: BrokerClient;
  readonly pipes: PipeRegistry;
  readonly http: FylrHttpServer;
  readonly exec: ExecClient;
}

/** Starts a replica on a free loopback port; every part is tracked. */
export async function startReplica(input: BrokerConfigInput, name = "fylr"): Promise<FylrReplica> {
  const broker = startBroker({ clientName: name, ...input }, `${name} broker`);
  const pipes = track(new PipeRegistry(), `${name} pipes`, (p) => p.close());
  const http = track(await startFylrHttpServer({ listen: "127.0.0.1:0", registry: pipes }), `${name} http`, (h) => h.close());
  const exec = new ExecClient({ broker, pipes, pipePort: http.port });
  return { broker, pipes, http, exec };
}

/** Closes a replica's parts (HTTP first, so no pipe is served after its registry closed). */
export async function stopReplica(replica: FylrReplica | undefined): Promise<void> {
  if (!replica) return;
  await release(replica.broker);
  await release(replica.http);
  await release(replica.pipes);
}
