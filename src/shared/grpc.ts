import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, type DescService, type MessageInitShape } from "@bufbuild/protobuf";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
  HealthCheckResponseSchema,
  HealthListResponseSchema,
  type HealthCheckRequest,
  type HealthCheckResponse,
} from "../../gen/grpc/health/v1/health_pb.js";
import {
  ServerReflection,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { Code, SlotbrokerError } from "./errors.js";
import { lazyReflectionIndex, reflectionServiceNames } from "./reflection.js";

/**
 * A grpc-js service definition whose (de)serializers are the protobuf-es codecs of the
 * generated schemas, so grpc-js carries protobuf-es messages without a second codegen.
 * Methods are keyed by their protobuf-es local name (e.g. "connect", "getStatus").
 */
export function grpcServiceDefinition(service: DescService): grpc.ServiceDefinition {
  const definition: Record<string, grpc.MethodDefinition<object, object>> = {};
  for (const method of service.methods) {
    const clientStreams = method.methodKind === "client_streaming" || method.methodKind === "bidi_streaming";
    const serverStreams = method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming";
    definition[method.localName] = {
      path: `/${service.typeName}/${method.name}`,
      requestStream: clientStreams,
      responseStream: serverStreams,
      requestSerialize: (message: object) => asBuffer(toBinary(method.input, message as never)),
      requestDeserialize: (bytes: Buffer) => fromBinary(method.input, bytes),
      responseSerialize: (message: object) => asBuffer(toBinary(method.output, message as never)),
      responseDeserialize: (bytes: Buffer) => fromBinary(method.output, bytes),
      originalName: method.name,
    };
  }
  return definition;
}

/** A grpc-js client constructor for a generated service. */
export function grpcClientConstructor(service: DescService): grpc.ServiceClientConstructor {
  return grpc.makeGenericClientConstructor(grpcServiceDefinition(service), service.name);
}

// Wraps without copying: toBinary returns a fresh Uint8Array we own.
function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/**
 * Adds gRPC server reflection (v1 and v1alpha) for `services` (plus health and reflection
 * themselves), answered from the real file descriptors with their dependencies, so grpcurl
 * and k6 can discover and call everything without the .proto files on disk.
 */
export function addReflection(server: grpc.Server, services: readonly string[]): void {
  const index = lazyReflectionIndex(services);
  // v1alpha is the same wire format under another name: one codec serves both paths.
  const method = grpcServiceDefinition(ServerReflection).serverReflectionInfo!;
  const handler = (call: grpc.ServerDuplexStream<ServerReflectionRequest, ServerReflectionResponse>): void => {
    call.on("data", (request: ServerReflectionRequest) => {
      try {
        call.write(index().answer(request));
      } catch (err) {
        // The descriptors could not be read (a broken install): this call fails, not the server.
        call.emit("error", toGrpcError(err));
      }
    });
    call.on("end", () => call.end());
    call.on("error", () => undefined);
  };
  for (const name of reflectionServiceNames) {
    server.addService({ serverReflectionInfo: { ...method, path: `/${name}/ServerReflectionInfo` } }, { serverReflectionInfo: handler });
  }
}

/** A service's health as grpc.health.v1 names it. */
export type HealthStatus = "SERVING" | "NOT_SERVING";

/**
 * grpc.health.v1.Health (Check, Watch, List) over the generated codecs: statuses by service
 * name ("" is the whole server), and the Watch streams that follow each one.
 */
export class HealthService {
  private readonly statuses = new Map<string, HealthStatus>();
  private readonly watchers = new Map<string, Set<(status: HealthStatus) => void>>();

  constructor(initial: Readonly<Record<string, HealthStatus>>) {
    for (const [service, status] of Object.entries(initial)) this.statuses.set(service, status);
  }

  setStatus(service: string, status: HealthStatus): void {
    this.statuses.set(service, status);
    for (const watcher of this.watchers.get(service) ?? []) watcher(status);
  }

  addToServer(server: grpc.Server): void {
    const response = (status: HealthStatus | "SERVICE_UNKNOWN"): HealthCheckResponse => create(HealthCheckResponseSchema, { status: ServingStatus[status] });
    server.addService(grpcServiceDefinition(Health), {
      check: (call: grpc.ServerUnaryCall<HealthCheckRequest, HealthCheckResponse>, callback: grpc.sendUnaryData<HealthCheckResponse>) => {
        const status = this.statuses.get(call.request.service);
        if (status) callback(null, response(status));
        else callback({ code: grpc.status.NOT_FOUND, details: `no health status for service "${call.request.service}"` });
      },
      watch: (call: grpc.ServerWritableStream<HealthCheckRequest, HealthCheckResponse>) => {
        const service = call.request.service;
        const watcher = (status: HealthStatus): void => void call.write(response(status));
        let set = this.watchers.get(service);
        if (!set) this.watchers.set(service, (set = new Set()));
        set.add(watcher);
        call.on("cancelled", () => {
          set.delete(watcher);
          if (set.size === 0 && this.watchers.get(service) === set) this.watchers.delete(service);
        });
        call.on("error", () => undefined);
        call.write(response(this.statuses.get(service) ?? "SERVICE_UNKNOWN"));
      },
      list: (_call: unknown, callback: grpc.sendUnaryData<object>) => {
        const statuses: Record<string, MessageInitShape<typeof HealthCheckResponseSchema>> = {};
        for (const [service, status] of this.statuses) statuses[service] = { status: ServingStatus[status] };
        callback(null, create(HealthListResponseSchema, { statuses }));
      },
    });
  }
}

/** Adds grpc.health.v1.Health; returns it to flip statuses on drain. */
export function addHealth(server: grpc.Server, statuses: Readonly<Record<string, HealthStatus>>): HealthService {
  const health = new HealthService(statuses);
  health.addToServer(server);
  return health;
}

/** Maps a SlotbrokerError (or anything) to a grpc-js ServiceError-shaped object. */
export function toGrpcError(err: unknown): Partial<grpc.StatusObject> & Error {
  const e = SlotbrokerError.from(err, Code.Internal);
  const status: grpc.status = Number(e.code);
  return Object.assign(new Error(e.message), { code: status, details: e.message });
}

/** Binds a grpc-js server; resolves with the actual port (useful with port 0). */
export function bindServer(server: grpc.Server, address: string, credentials: grpc.ServerCredentials): Promise<number> {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, credentials, (err, port) => (err ? reject(err) : resolve(port)));
  });
}
