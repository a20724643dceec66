import { expect } from "chai";
import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";
import pg from "pg";
import {
  BrokerService,
  GetStatusResponseSchema,
  type GetStatusResponse,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { addReflection, bindServer, grpcClientConstructor, grpcServiceDefinition } from "../../src/shared/grpc.js";
import { applyEnvOverrides, parseConfig, durationMs, splitHostPort } from "../../src/shared/config-parsing.js";
import { parseDuration } from "../../src/shared/duration.js";
import { z } from "zod";
import { createTestDatabase } from "../support/postgres.js";

describe("shared foundation", () => {
  it("parses durations only with a unit", () => {
    expect(parseDuration("5s")).to.equal(5000);
    expect(parseDuration("250ms")).to.equal(250);
    expect(parseDuration("1.5m")).to.equal(90_000);
    expect(parseDuration("5")).to.equal(undefined);
  });

  it("splits host:port including bracketed IPv6", () => {
    expect(splitHostPort("127.0.0.1:80")).to.deep.equal({ host: "127.0.0.1", port: 80 });
    expect(splitHostPort("[::1]:7600")).to.deep.equal({ host: "::1", port: 7600 });
    expect(splitHostPort("nohost")).to.equal(undefined);
  });

  it("names the bad key and unknown keys in config errors", () => {
    const schema = z.strictObject({ a: z.strictObject({ timeout: durationMs }) });
    expect(() => parseConfig(schema, { a: { timeout: "5" } }, "x.yaml")).to.throw(/x\.yaml: a\.timeout: expected a duration/);
    expect(() => parseConfig(schema, { a: { timeout: "5s" }, b: 1 }, "x.yaml")).to.throw(/unknown key "b"/);
    const raw = applyEnvOverrides({ a: {} }, { T: "2s" }, { T: "a.timeout" }, schema);
    expect(parseConfig(schema, raw, "x")).to.deep.equal({ a: { timeout: 2000 } });
  });

  it("converts an environment value only where the schema wants a number, boolean or list", () => {
    const schema = z.strictObject({
      token: z.string(),
      n: z.number().int().default(1),
      b: z.boolean().optional(),
      list: z.array(z.string()).optional(),
      nested: z.strictObject({ d: durationMs.prefault("1s") }).prefault({}),
    });
    const mapping = { T: "token", N: "n", B: "b", L: "list", D: "nested.d" };
    const raw = applyEnvOverrides({}, { T: "007", N: "12", B: "true", L: '["a","b"]', D: "2s" }, mapping, schema);
    expect(parseConfig(schema, raw, "x")).to.deep.equal({ token: "007", n: 12, b: true, list: ["a", "b"], nested: { d: 2000 } });
    const bad = applyEnvOverrides({}, { T: "x", N: "twelve" }, mapping, schema);
    expect(() => parseConfig(schema, bad, "env")).to.throw(/env: n: .*expected number, received string/);
  });

  it("carries protobuf-es messages over a real grpc-js server with reflection", async () => {
    const server = new grpc.Server();
    server.addService(grpcServiceDefinition(BrokerService), {
      connect: (call: grpc.ServerDuplexStream<unknown, unknown>) => call.end(),
      getStatus: (_call: unknown, cb: grpc.sendUnaryData<GetStatusResponse>) =>
        cb(null, create(GetStatusResponseSchema, { instanceId: "abc", services: { cat: "default" } })),
    });
    addReflection(server, [BrokerService.typeName]);
    const port = await bindServer(server, "127.0.0.1:0", grpc.ServerCredentials.createInsecure());
    const Client = grpcClientConstructor(BrokerService);
    const client = new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    try {
      const status = await new Promise<GetStatusResponse>((resolve, reject) =>
        (client as unknown as { getStatus: (r: object, cb: (e: Error | null, r: GetStatusResponse) => void) => void }).getStatus(
          {},
          (err, res) => (err ? reject(err) : resolve(res)),
        ),
      );
      expect(status.instanceId).to.equal("abc");
      expect(status.services).to.deep.equal({ cat: "default" });
    } finally {
      client.close();
      server.forceShutdown();
    }
  });

  it("gets a fresh real Postgres database", async () => {
    const client = new pg.Client(await createTestDatabase());
    await client.connect();
    try {
      const { rows } = await client.query<{ n: number }>("select count(*)::int as n from pg_tables where schemaname = 'public'");
      expect(rows[0]!.n).to.equal(0);
    } finally {
      await client.end();
    }
  });
});
