// Shared pieces of the broker load scripts: env parsing, the gRPC client with the proto
// loaded from proto/, GetStatus helpers and Jain's index. Imported by load/scripts/*.js.
import grpc from 'k6/net/grpc';

export const CONNECT = 'slotbroker.v1.BrokerService/Connect';
export const GET_STATUS = 'slotbroker.v1.BrokerService/GetStatus';

/** An integer from the environment (set by load/run.ts), or `fallback`. */
export function envInt(name, fallback) {
  const raw = __ENV[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n)) throw new Error(`${name}=${raw}: not a number`);
  return n;
}

/** A string from the environment, required. */
export function envString(name) {
  const raw = __ENV[name];
  if (!raw) throw new Error(`${name} is not set (run through: npm run load)`);
  return raw;
}

/**
 * A gRPC client with broker.proto loaded from proto/. Must be called in the init context
 * (k6 only parses protos there). The runner passes PROTO_DIR as an absolute path; the
 * fallback is relative to the main script in load/scripts/.
 */
export function brokerClient() {
  const client = new grpc.Client();
  client.load([__ENV.PROTO_DIR || '../../proto'], 'slotbroker/v1/broker.proto');
  return client;
}

/** GetStatus over an already connected client; uint64 fields arrive as strings in JSON. */
export function getStatus(client) {
  const res = client.invoke(GET_STATUS, {}, { timeout: '5s' });
  if (res.status !== grpc.StatusOK) throw new Error(`GetStatus failed: ${res.status} ${JSON.stringify(res.error)}`);
  return res.message;
}

/** Jain's fairness index of a list of non-negative shares: 1 = perfectly equal, 1/n = one takes all. */
export function jain(shares) {
  if (shares.length === 0) return 0;
  let sum = 0;
  let squares = 0;
  for (const s of shares) {
    sum += s;
    squares += s * s;
  }
  return squares === 0 ? 0 : (sum * sum) / (shares.length * squares);
}

/** The waitgroup serving `service`, from a Hello or a GetStatus response. */
export function waitgroupOf(snapshot, service) {
  const name = snapshot.services[service];
  return snapshot.waitgroups.find((w) => w.name === name);
}

/** Milliseconds since the scenario's start (all scenarios here start at 0s). */
export function sinceStart(startTime) {
  return Date.now() - startTime;
}

/** Blocks (this VU only) until `ms` after the scenario start. */
export function sleepUntil(sleep, startTime, ms) {
  const wait = ms - sinceStart(startTime);
  if (wait > 0) sleep(wait / 1000);
}
