import { once } from "node:events";
import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { Health, HealthCheckRequestSchema, type HealthCheckResponse } from "../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection as ReflectionV1, type ServerReflectionResponse } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ReflectionV1alpha } from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import type { FylrHttpServer } from "../../src/fylr/index.js";
import { grpcClientConstructor } from "../../src/shared/grpc.js";
import { track } from "../../harness/resources.js";
import { curl, releaseAll, statusAndBody, trackedRegistry, trackedServer } from "./pipes-support.js";

type Unary<Res> = (request: object, callback: (err: grpc.ServiceError | null, res: Res) => void) => void;

const clients: grpc.Client[] = [];

function client(server: FylrHttpServer, service?: Parameters<typeof grpcClientConstructor>[0]): grpc.Client {
  const Client = service ? grpcClientConstructor(service) : grpc.Client;
  const c = track(new Client(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure()), "grpc client", (x) => x.close());
  clients.push(c);
  return c;
}

function unary<Res>(c: grpc.Client, method: string, request: object): Promise<Res> {
  const fn = (c as unknown as Record<string, Unary<Res>>)[method]!.bind(c);
  return new Promise((resolve, reject) => fn(request, (err, res) => (err ? reject(err) : resolve(res))));
}

describe("fylr gRPC introspection (health, reflection, unknown paths)", () => {
  let server: FylrHttpServer | undefined;
  const registry = trackedRegistry();
  after(() => releaseAll(registry));
  afterEach(() => releaseAll(...clients.splice(0), server));

  it("answers a gRPC call to an unknown method with UNIMPLEMENTED, not an HTTP 404", async () => {
    server = await trackedServer({ registry });
    const c = client(server);
    for (const path of ["/slotbroker.v1.Nope/Nope", "/slotbroker.v1.PipeService/Nope"]) {
      const err = await new Promise<grpc.ServiceError | null>((resolve) =>
        c.makeUnaryRequest(path, (b: Buffer) => b, (b: Buffer) => b, Buffer.alloc(0), (e) => resolve(e)),
      );
      expect(err?.code, `${path}: ${err?.details}`).to.equal(grpc.status.UNIMPLEMENTED);
      expect(err?.details).to.include(path);
    }
  });

  it("answers a Connect call to an unknown procedure with 404 and code unimplemented", async () => {
    server = await trackedServer({ registry });
    const res = statusAndBody(
      await curl(["-w", "\n%{http_code}", "-X", "POST", "-H", "content-type: application/json", "-d", "{}", `${server.url}/slotbroker.v1.PipeService/Nope`]),
    );
    expect(res.status).to.equal(404);
    expect(JSON.parse(res.body)).to.deep.equal({ code: "unimplemented", message: "no procedure at /slotbroker.v1.PipeService/Nope" });
    const plain = statusAndBody(await curl(["-w", "\n%{http_code}", `${server.url}/nothing-here`]));
    expect(plain.status).to.equal(404);
    expect(plain.body).to.include("no route for GET /nothing-here");
  });

  it("serves grpc.health.v1 Check and List for the server and each of its services", async () => {
    let ok = true;
    server = await trackedServer({ registry, health: () => ({ ok }) });
    const health = client(server, Health);
    const check = (service: string) => unary<HealthCheckResponse>(health, "check", create(HealthCheckRequestSchema, { service }));
    expect((await check("")).status).to.equal(1);
    expect((await check("slotbroker.v1.PipeService")).status).to.equal(1);
    const unknown = await check("slotbroker.v1.Nope").catch((e: grpc.ServiceError) => e);
    expect((unknown as grpc.ServiceError).code).to.equal(grpc.status.NOT_FOUND);
    ok = false;
    expect((await check("")).status).to.equal(2);
    const list = await unary<{ statuses: Record<string, HealthCheckResponse> }>(health, "list", {});
    expect(Object.keys(list.statuses).sort()).to.deep.equal(["", "slotbroker.v1.PipeService"]);
  });

  it("ends a health Watch with NOT_SERVING when the server closes", async () => {
    server = await trackedServer({ registry });
    const health = client(server, Health);
    const call = (health as unknown as { watch: (r: object) => grpc.ClientReadableStream<HealthCheckResponse> }).watch(
      create(HealthCheckRequestSchema, { service: "" }),
    );
    const seen: number[] = [];
    const first = once(call, "data");
    const ended = new Promise<void>((resolve) => {
      call.on("data", (r: HealthCheckResponse) => seen.push(r.status));
      call.on("error", () => resolve());
      call.on("end", () => resolve());
    });
    await first;
    const closed = server.close();
    await ended;
    await closed;
    expect(seen).to.deep.equal([1, 2]);
  });

  it("lists its services by reflection, v1 and v1alpha alike", async () => {
    server = await trackedServer({ registry });
    for (const service of [ReflectionV1, ReflectionV1alpha]) {
      const c = client(server, service);
      const call = (c as unknown as { serverReflectionInfo: () => grpc.ClientDuplexStream<object, ServerReflectionResponse> }).serverReflectionInfo();
      const response = new Promise<ServerReflectionResponse>((resolve, reject) => {
        call.once("data", resolve);
        call.once("error", reject);
      });
      call.write(create(service.method.serverReflectionInfo.input, { host: "", messageRequest: { case: "listServices", value: "*" } }));
      const r = await response;
      call.end();
      const names = r.messageResponse.case === "listServicesResponse" ? r.messageResponse.value.service.map((s) => s.name) : [];
      expect(names, service.typeName).to.deep.equal([
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "slotbroker.v1.PipeService",
      ]);
    }
  });
});
