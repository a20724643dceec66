// A gRPC bidi stream of raw bytes: identity (de)serializers, no protobuf. The fuzzing
// execserver writes frames no real one would; the benches' baselines pay no encoding cost.
// No other imports: the benches' lean child processes load it from their compiled copy.
import type * as grpc from "@grpc/grpc-js";

/** Bytes in, bytes out. */
export const identity = (b: Buffer): Buffer => b;

/** A one-method service definition for a raw bidi stream at `path` (e.g. "/pkg.Service/Method"). */
export function rawBidiService(name: string, path: string): grpc.ServiceDefinition {
  return {
    [name]: {
      path,
      requestStream: true,
      responseStream: true,
      requestSerialize: identity,
      requestDeserialize: identity,
      responseSerialize: identity,
      responseDeserialize: identity,
    },
  };
}
