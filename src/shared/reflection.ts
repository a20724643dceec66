/**
 * gRPC server reflection (grpc.reflection.v1 and v1alpha) answered from the real file
 * descriptors: gen/descriptors.binpb is what `buf build` makes from proto/ and
 * third_party/proto (comments included), so a stock tool sees exactly the files a client
 * generates stubs from, with their dependencies (google/protobuf/duration.proto, …).
 * The core is pure — a request in, a response out — and both servers wrap it: grpc-js on
 * the execserver (src/shared/grpc.ts), Connect on the fylr.
 */
import { readFileSync } from "node:fs";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  FileDescriptorProtoSchema,
  FileDescriptorSetSchema,
  type DescriptorProto,
  type EnumDescriptorProto,
  type FileDescriptorProto,
} from "@bufbuild/protobuf/wkt";
import {
  ServerReflectionResponseSchema,
  type ServerReflectionRequest,
  type ServerReflectionResponse,
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { Code } from "./errors.js";

/** The reflection services every slotbroker server offers next to its own. */
export const reflectionServiceNames = ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"] as const;

/** The health service every slotbroker server offers. */
export const healthServiceName = "grpc.health.v1.Health";

const descriptorsUrl = new URL("../../gen/descriptors.binpb", import.meta.url);
let allFiles: Map<string, FileDescriptorProto> | undefined;

/** Every file of gen/descriptors.binpb by name (read once). */
export function descriptorFiles(): ReadonlyMap<string, FileDescriptorProto> {
  if (!allFiles) {
    const set = fromBinary(FileDescriptorSetSchema, readFileSync(descriptorsUrl));
    allFiles = new Map(set.file.map((f) => [f.name, f]));
  }
  return allFiles;
}

/**
 * The index for a server offering `services` (health and reflection added), built at the
 * first call: reading the descriptors costs ~0.1 s of CPU, which every start would pay for
 * a tool that may never ask.
 */
export function lazyReflectionIndex(services: readonly string[]): () => ReflectionIndex {
  let built: ReflectionIndex | undefined;
  return () => (built ??= new ReflectionIndex([...services, healthServiceName, ...reflectionServiceNames]));
}

/**
 * The files, symbols and services one server exposes: the files that define its services
 * and everything they import, nothing else. Immutable once built; share it across streams.
 */
export class ReflectionIndex {
  /** Service names, sorted, as list_services answers them. */
  readonly services: readonly string[];
  private readonly files = new Map<string, Uint8Array>();
  private readonly closure = new Map<string, readonly string[]>();
  private readonly symbols = new Map<string, string>();
  private readonly messages = new Set<string>();

  constructor(serviceNames: readonly string[], available: ReadonlyMap<string, FileDescriptorProto> = descriptorFiles()) {
    this.services = [...new Set(serviceNames)].sort();
    const all = new Map<string, string>();
    for (const file of available.values()) indexSymbols(file, all, new Set());
    const visit = (name: string): void => {
      if (this.files.has(name)) return;
      const file = available.get(name);
      if (!file) throw new Error(`reflection: ${name} is not in the descriptor set (run npm run generate)`);
      this.files.set(name, toBinary(FileDescriptorProtoSchema, file));
      for (const dep of file.dependency) visit(dep);
      indexSymbols(file, this.symbols, this.messages);
    };
    for (const service of this.services) {
      const file = all.get(service);
      if (!file) throw new Error(`reflection: no file in the descriptor set defines ${service}`);
      visit(file);
    }
    for (const name of this.files.keys()) this.closure.set(name, dependencyOrder(name, available));
  }

  /** Answers one reflection request; never throws (bad requests get an error_response). */
  answer(request: ServerReflectionRequest): ServerReflectionResponse {
    const base: ResponseBase = { validHost: request.host, originalRequest: request };
    const r = request.messageRequest;
    const files = (name: string | undefined, what: string): ServerReflectionResponse =>
      name === undefined
        ? error(base, Code.NotFound, `${what} not found`)
        : create(ServerReflectionResponseSchema, {
            ...base,
            messageResponse: {
              case: "fileDescriptorResponse",
              value: { fileDescriptorProto: this.closure.get(name)!.map((n) => this.files.get(n)!) },
            },
          });
    switch (r.case) {
      case "listServices":
        return create(ServerReflectionResponseSchema, {
          ...base,
          messageResponse: { case: "listServicesResponse", value: { service: this.services.map((name) => ({ name })) } },
        });
      case "fileByFilename":
        return files(this.files.has(r.value) ? r.value : undefined, `file "${r.value}"`);
      case "fileContainingSymbol":
        return files(this.symbols.get(stripDot(r.value)), `symbol "${r.value}"`);
      case "fileContainingExtension":
        // Nothing served here declares extensions.
        return error(base, Code.NotFound, `extension ${r.value.extensionNumber} of "${r.value.containingType}" not found`);
      case "allExtensionNumbersOfType": {
        const type = stripDot(r.value);
        if (!this.messages.has(type)) return error(base, Code.NotFound, `message type "${r.value}" not found`);
        return create(ServerReflectionResponseSchema, {
          ...base,
          messageResponse: { case: "allExtensionNumbersResponse", value: { baseTypeName: type, extensionNumber: [] } },
        });
      }
      default:
        return error(base, Code.InvalidArgument, "message_request: none of the known request kinds is set");
    }
  }
}

interface ResponseBase {
  readonly validHost: string;
  readonly originalRequest: ServerReflectionRequest;
}

function error(base: ResponseBase, code: Code, message: string): ServerReflectionResponse {
  return create(ServerReflectionResponseSchema, {
    ...base,
    messageResponse: { case: "errorResponse", value: { errorCode: code, errorMessage: message } },
  });
}

function stripDot(name: string): string {
  return name.startsWith(".") ? name.slice(1) : name;
}

// The requested file first, then every file it imports, transitively, each once: a client
// can build the file from this one response (grpc-go answers the same way).
function dependencyOrder(name: string, available: ReadonlyMap<string, FileDescriptorProto>): string[] {
  const order: string[] = [];
  const seen = new Set<string>();
  const visit = (n: string): void => {
    if (seen.has(n)) return;
    seen.add(n);
    order.push(n);
    for (const dep of available.get(n)?.dependency ?? []) visit(dep);
  };
  visit(name);
  return order;
}

// Every fully qualified name a client may ask for: services and their methods, messages
// (nested too) with their fields and oneofs, enums and their values (scoped like C++: a
// value lives next to its enum), extensions.
function indexSymbols(file: FileDescriptorProto, into: Map<string, string>, messages: Set<string>): void {
  const prefix = file.package ? `${file.package}.` : "";
  const add = (symbol: string): void => {
    if (!into.has(symbol)) into.set(symbol, file.name);
  };
  const addEnum = (scope: string, e: EnumDescriptorProto): void => {
    add(`${scope}${e.name}`);
    for (const v of e.value) add(`${scope}${v.name}`);
  };
  const addMessage = (scope: string, m: DescriptorProto): void => {
    const full = `${scope}${m.name}`;
    add(full);
    messages.add(full);
    for (const f of m.field) add(`${full}.${f.name}`);
    for (const o of m.oneofDecl) add(`${full}.${o.name}`);
    for (const x of m.extension) add(`${full}.${x.name}`);
    for (const nested of m.nestedType) addMessage(`${full}.`, nested);
    for (const e of m.enumType) addEnum(`${full}.`, e);
  };
  for (const m of file.messageType) addMessage(prefix, m);
  for (const e of file.enumType) addEnum(prefix, e);
  for (const x of file.extension) add(`${prefix}${x.name}`);
  for (const s of file.service) {
    add(`${prefix}${s.name}`);
    for (const m of s.method) add(`${prefix}${s.name}.${m.name}`);
  }
}
