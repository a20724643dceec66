import { expect } from "chai";
import { create, fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { ServerReflectionRequestSchema, type ServerReflectionRequest } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { descriptorFiles, ReflectionIndex } from "../../src/shared/reflection.js";

function ask(index: ReflectionIndex, messageRequest: ServerReflectionRequest["messageRequest"]) {
  return index.answer(create(ServerReflectionRequestSchema, { host: "h", messageRequest }));
}

function fileNames(index: ReflectionIndex, messageRequest: ServerReflectionRequest["messageRequest"]): string[] {
  const response = ask(index, messageRequest).messageResponse;
  if (response.case !== "fileDescriptorResponse") throw new Error(`expected files, got ${JSON.stringify(response.value)}`);
  return response.value.fileDescriptorProto.map((bytes) => fromBinary(FileDescriptorProtoSchema, bytes).name);
}

describe("reflection index", () => {
  const exec = new ReflectionIndex(["slotbroker.v1.BrokerService", "grpc.health.v1.Health"]);

  it("holds the files buf builds from proto/ and third_party/proto, with comments", () => {
    const files = descriptorFiles();
    for (const name of ["slotbroker/v1/broker.proto", "slotbroker/v1/queue.proto", "google/protobuf/duration.proto", "grpc/health/v1/health.proto"]) {
      expect(files.has(name), name).to.equal(true);
    }
    expect(files.get("slotbroker/v1/broker.proto")!.sourceCodeInfo?.location.length).to.be.greaterThan(100);
  });

  it("lists exactly the services it was built for, sorted", () => {
    const response = ask(exec, { case: "listServices", value: "" });
    expect(response.validHost).to.equal("h");
    expect(response.messageResponse.case).to.equal("listServicesResponse");
    const names = response.messageResponse.case === "listServicesResponse" ? response.messageResponse.value.service.map((s) => s.name) : [];
    expect(names).to.deep.equal(["grpc.health.v1.Health", "slotbroker.v1.BrokerService"]);
  });

  it("answers a symbol with its file first and every file it imports after it", () => {
    expect(fileNames(exec, { case: "fileContainingSymbol", value: "slotbroker.v1.BrokerService" })).to.deep.equal([
      "slotbroker/v1/broker.proto",
      "google/protobuf/duration.proto",
      "google/protobuf/timestamp.proto",
    ]);
    // Methods, nested map entries, fields, enum values and a leading dot resolve too.
    for (const symbol of [
      "slotbroker.v1.BrokerService.Connect",
      "slotbroker.v1.Hello.ServicesEntry",
      "slotbroker.v1.Offer.expires_in",
      "slotbroker.v1.REJECT_CODE_STALE_OFFER",
      ".slotbroker.v1.Receipt",
    ]) {
      expect(fileNames(exec, { case: "fileContainingSymbol", value: symbol })[0], symbol).to.equal("slotbroker/v1/broker.proto");
    }
    expect(fileNames(exec, { case: "fileContainingSymbol", value: "google.protobuf.Duration" })).to.deep.equal(["google/protobuf/duration.proto"]);
  });

  it("serves the real well-known-type files by name", () => {
    expect(fileNames(exec, { case: "fileByFilename", value: "google/protobuf/duration.proto" })).to.deep.equal(["google/protobuf/duration.proto"]);
    const health = fileNames(exec, { case: "fileByFilename", value: "grpc/health/v1/health.proto" });
    expect(health).to.deep.equal(["grpc/health/v1/health.proto"]);
  });

  it("answers NOT_FOUND for files and symbols outside what it serves", () => {
    for (const request of [
      { case: "fileByFilename", value: "slotbroker/v1/queue.proto" },
      { case: "fileContainingSymbol", value: "slotbroker.v1.QueueService" },
      { case: "fileContainingSymbol", value: "nope.Nothing" },
      { case: "allExtensionNumbersOfType", value: "slotbroker.v1.Nope" },
    ] as const) {
      const response = ask(exec, request).messageResponse;
      expect(response.case, request.value).to.equal("errorResponse");
      expect(response.case === "errorResponse" && response.value.errorCode).to.equal(5);
      expect(response.case === "errorResponse" && response.value.errorMessage).to.include(request.value);
    }
  });

  it("reports no extensions for a known message and refuses an empty request", () => {
    const response = ask(exec, { case: "allExtensionNumbersOfType", value: "slotbroker.v1.Want" }).messageResponse;
    expect(response.case).to.equal("allExtensionNumbersResponse");
    expect(ask(exec, { case: undefined }).messageResponse.case).to.equal("errorResponse");
  });

  it("refuses to be built for a service no file defines", () => {
    expect(() => new ReflectionIndex(["slotbroker.v1.Nope"])).to.throw(/no file in the descriptor set defines slotbroker.v1.Nope/);
  });
});
