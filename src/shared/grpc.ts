import * as grpc from "@grpc/grpc-js";
import { fromBinary, toBinary, type DescService } from "@bufbuild/protobuf";
import { HealthImplementation, type ServingStatusMap } from "grpc-health-check";
import {
  ServerReflection,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { Code, SlotbrokerError } from "./errors.js";
import { healthServiceName, ReflectionIndex, reflectionServiceNames } from "./reflection.js";

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
export function addReflection(server: grpc.Server, services: readonly string[]): ReflectionIndex {
  const index = new ReflectionIndex([...services, healthServiceName, ...reflectionServiceNames]);
  // v1alpha is the same wire format under another name: one codec serves both paths.
  const method = grpcServiceDefinition(ServerReflection).serverReflectionInfo!;
  const handler = (call: grpc.ServerDuplexStream<ServerReflectionRequest, ServerReflectionResponse>): void => {
    call.on("data", (request: ServerReflectionRequest) => call.write(index.answer(request)));
    call.on("end", () => call.end());
    call.on("error", () => undefined);
  };
  for (const name of reflectionServiceNames) {
    server.addService({ serverReflectionInfo: { ...method, path: `/${name}/ServerReflectionInfo` } }, { serverReflectionInfo: handler });
  }
  return index;
}

/** Adds grpc.health.v1.Health; returns the implementation to flip statuses on drain. */
export function addHealth(server: grpc.Server, statuses: ServingStatusMap): HealthImplementation {
  const health = new HealthImplementation(statuses);
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
