import * as grpc from "@grpc/grpc-js";
import type { HealthImplementation } from "grpc-health-check";
import { BrokerService, type ConnectRequest, type ConnectResponse, type GetStatusResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { addHealth, addReflection } from "../shared/grpc.js";
import { limits } from "./limits.js";
import { serverServiceDefinition } from "./wire.js";

/** The health service names that flip to NOT_SERVING while draining. */
export const healthServices = ["", BrokerService.typeName] as const;

/** The BrokerService calls an execserver answers. */
export interface BrokerHandlers {
  connect(call: grpc.ServerDuplexStream<ConnectRequest, ConnectResponse>): void;
  getStatus(call: grpc.ServerUnaryCall<unknown, GetStatusResponse>, callback: grpc.sendUnaryData<GetStatusResponse>): void;
}

/** The execserver's gRPC server (BrokerService, health, reflection), not yet bound. */
export function createGrpcServer(handlers: BrokerHandlers): { server: grpc.Server; health: HealthImplementation } {
  const server = new grpc.Server({
    "grpc.max_receive_message_length": limits.maxFrameBytes,
    // A connection carries a few streams (one broker stream, status and health calls);
    // one with no stream at all for 5 minutes is closed.
    "grpc.max_concurrent_streams": 1000,
    "grpc.max_connection_idle_ms": 5 * 60_000,
    "grpc.keepalive_time_ms": 30_000,
    "grpc.keepalive_timeout_ms": 10_000,
    // Let fylrs ping every few seconds for half-open detection without a GOAWAY.
    "grpc.http2.min_ping_interval_without_data_ms": 5_000,
    // channelz stamps every message sent and received (a Date each); nothing here reads it.
    "grpc.enable_channelz": 0,
  });
  server.addService(serverServiceDefinition(), {
    connect: (call: grpc.ServerDuplexStream<ConnectRequest, ConnectResponse>) => handlers.connect(call),
    getStatus: (call: grpc.ServerUnaryCall<unknown, GetStatusResponse>, callback: grpc.sendUnaryData<GetStatusResponse>) =>
      handlers.getStatus(call, callback),
  });
  addReflection(server, [BrokerService.typeName]);
  const health = addHealth(server, Object.fromEntries(healthServices.map((s) => [s, "SERVING" as const])));
  return { server, health };
}
