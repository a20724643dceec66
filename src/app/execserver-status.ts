/**
 * GetStatus calls to execservers, for the queue position of items not parked yet (the load
 * of a service's waitgroup) and for `slotbroker status`.
 */
import type * as grpc from "@grpc/grpc-js";
import { BrokerService, type GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import type { ExecLoadSource, ServiceLoad } from "../api/index.js";
import { callMetadata, channelCredentials, type BrokerTlsOptions } from "../fylr/broker/channel-setup.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { grpcClientConstructor } from "../shared/grpc.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

const StatusClient = grpcClientConstructor(BrokerService);

type GetStatusFn = (
  request: object,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (err: grpc.ServiceError | null, response: GetStatusResponse) => void,
) => void;

/** How to reach execservers for GetStatus. */
export interface StatusCallOptions {
  readonly token?: string;
  readonly tls?: BrokerTlsOptions;
  /** Per call (default 2 s). */
  readonly timeoutMs?: number;
  readonly clientName?: string;
}

/** A GetStatus client for one address; close() when done. */
export class ExecserverStatusClient {
  private client: grpc.Client;

  constructor(
    readonly address: string,
    private readonly options: StatusCallOptions = {},
  ) {
    this.client = this.newClient();
  }

  // The TLS files are read here: a channel made after a failure presents a renewed certificate.
  private newClient(): grpc.Client {
    const channel: grpc.ChannelOptions = this.options.tls?.serverName ? { "grpc.ssl_target_name_override": this.options.tls.serverName } : {};
    return new StatusClient(this.address, channelCredentials(this.options.tls), channel);
  }

  /** One GetStatus call; a failure names the address. */
  status(): Promise<GetStatusResponse> {
    const metadata = callMetadata(this.options.token, this.options.clientName ?? "slotbroker-status");
    const deadline = Date.now() + (this.options.timeoutMs ?? 2000);
    const call = (this.client as unknown as { getStatus: GetStatusFn }).getStatus.bind(this.client);
    return new Promise((resolve, reject) =>
      call({}, metadata, { deadline }, (err, response) => {
        if (!err) return resolve(response);
        const code = typeof err.code === "number" ? (err.code as number as Code) : Code.Unavailable;
        if (code === Code.Unavailable && this.options.tls) this.renew();
        reject(new SlotbrokerError(code, `GetStatus ${this.address}: ${err.details || err.message}`, { cause: err }));
      }),
    );
  }

  /** Closes the channel. */
  close(): void {
    this.client.close();
  }

  private renew(): void {
    try {
      const next = this.newClient();
      this.client.close();
      this.client = next;
    } catch {
      // The files cannot be read now: the current channel stays.
    }
  }
}

/** One GetStatus call to `address`. */
export async function fetchExecserverStatus(address: string, options: StatusCallOptions = {}): Promise<GetStatusResponse> {
  const client = new ExecserverStatusClient(address, options);
  try {
    return await client.status();
  } finally {
    client.close();
  }
}

/** Sums the waitgroup that runs `service` over the given statuses (one per instance). */
export function serviceLoad(statuses: readonly GetStatusResponse[], service: string): ServiceLoad | undefined {
  let found = false;
  let running = 0;
  let capacity = 0;
  let waiting = 0;
  let weighted = 0;
  let completed = 0;
  for (const status of statuses) {
    const group = status.services[service];
    const wg = group === undefined ? undefined : status.waitgroups.find((w) => w.name === group);
    if (!wg) continue;
    found = true;
    running += wg.running + wg.offered;
    capacity += wg.processes;
    waiting += Number(wg.waiting);
    const mean = wg.meanRuntime && durationMs(wg.meanRuntime);
    if (mean !== undefined) {
      // Weighted by jobs completed, so a fresh instance's few samples count for little.
      const n = Math.max(1, Number(wg.completed));
      weighted += mean * n;
      completed += n;
    }
  }
  if (!found) return undefined;
  return { running, capacity, waiting, meanRuntimeMs: completed > 0 ? weighted / completed : undefined };
}

/**
 * An ExecLoadSource over GetStatus of every configured address, cached for `maxAgeMs` so that
 * many Position/Watch calls cost one round of GetStatus a second. Instances reached through
 * two addresses count once. A failing address is left out; none answering gives undefined.
 */
export class ExecserverLoad implements ExecLoadSource {
  private readonly clients: ExecserverStatusClient[];
  private cached: { at: number; statuses: Promise<GetStatusResponse[]> } | undefined;

  constructor(
    addresses: readonly string[],
    options: StatusCallOptions & { maxAgeMs?: number } = {},
    private readonly maxAgeMs = options.maxAgeMs ?? 1000,
  ) {
    this.clients = addresses.map((address) => new ExecserverStatusClient(address, { timeoutMs: 1000, ...options }));
  }

  /** The load of the waitgroup that runs `service`, or undefined. */
  async load(service: string): Promise<ServiceLoad | undefined> {
    return serviceLoad(await this.statuses(), service);
  }

  /** The latest statuses (deduplicated by instance id). */
  statuses(): Promise<GetStatusResponse[]> {
    const now = Date.now();
    if (!this.cached || now - this.cached.at > this.maxAgeMs) {
      this.cached = { at: now, statuses: this.fetchAll() };
    }
    return this.cached.statuses;
  }

  /** Closes every channel. */
  close(): void {
    for (const client of this.clients) client.close();
  }

  private async fetchAll(): Promise<GetStatusResponse[]> {
    const results = await Promise.allSettled(this.clients.map((c) => c.status()));
    const byInstance = new Map<string, GetStatusResponse>();
    for (const r of results) if (r.status === "fulfilled" && !byInstance.has(r.value.instanceId)) byInstance.set(r.value.instanceId, r.value);
    return [...byInstance.values()];
  }
}
