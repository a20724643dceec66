import { expect } from "chai";
import { execFile } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { ConfigError } from "../../src/shared/errors.js";
import { contextFrom, formatTraceparent, parseTraceparent, tracingFromEnv } from "../../src/shared/tracing/index.js";
import { trace } from "@opentelemetry/api";

const run = promisify(execFile);
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const sample = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

describe("traces", () => {
  describe("traceparent", () => {
    it("reads and writes the W3C form", () => {
      const context = parseTraceparent(sample);
      expect(context).to.include({ traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1, isRemote: true });
      expect(formatTraceparent(context!)).to.equal(sample);
      expect(formatTraceparent(parseTraceparent(sample.replace(/01$/, "00"))!)).to.match(/-00$/);
      // A later version may append fields; its first four are read.
      expect(parseTraceparent(`cc-${sample.slice(3)}-what-comes-next`)?.spanId).to.equal("b7ad6b7169203331");
    });

    it("refuses malformed values without throwing", () => {
      const bad = [
        "",
        "garbage",
        sample.toUpperCase(),
        `ff-${sample.slice(3)}`,
        `${sample}-extra`, // version 00 has exactly four fields
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
        `${sample}${"x".repeat(600)}`,
      ];
      for (const value of bad) expect(parseTraceparent(value), value).to.equal(undefined);
      expect(trace.getSpanContext(contextFrom("garbage"))).to.equal(undefined);
      expect(trace.getSpanContext(contextFrom(sample))?.spanId).to.equal("b7ad6b7169203331");
    });
  });

  describe("OTEL_* variables", () => {
    it("are off unless an exporter or an endpoint is asked for", () => {
      expect(tracingFromEnv({})).to.equal(undefined);
      expect(tracingFromEnv({ OTEL_SERVICE_NAME: "x", OTEL_TRACES_SAMPLER: "always_on" })).to.equal(undefined);
      expect(tracingFromEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318" })).to.deep.equal({ exporters: ["otlp"] });
      expect(tracingFromEnv({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://127.0.0.1:4318/v1/traces" })).to.deep.equal({ exporters: ["otlp"] });
      expect(tracingFromEnv({ OTEL_TRACES_EXPORTER: "otlp, console" })).to.deep.equal({ exporters: ["otlp", "console"] });
      expect(tracingFromEnv({ OTEL_TRACES_EXPORTER: "none", OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318" })).to.equal(undefined);
      expect(tracingFromEnv({ OTEL_TRACES_EXPORTER: "otlp", OTEL_SDK_DISABLED: "true" })).to.equal(undefined);
      expect(tracingFromEnv({ OTEL_TRACES_EXPORTER: "otlp", OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf" })).to.deep.equal({ exporters: ["otlp"] });
    });

    it("name the variable they cannot honour", () => {
      expect(() => tracingFromEnv({ OTEL_TRACES_EXPORTER: "zipkin" })).to.throw(ConfigError, /^OTEL_TRACES_EXPORTER: unknown exporter "zipkin"/);
      expect(() => tracingFromEnv({ OTEL_TRACES_EXPORTER: "otlp", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" })).to.throw(ConfigError, /^OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" is not supported/);
      expect(() => tracingFromEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://h", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json" })).to.throw(
        ConfigError,
        /^OTEL_EXPORTER_OTLP_TRACES_PROTOCOL:/,
      );
    });
  });

  it("the fylr and execserver commands load the SDK only on demand", async function () {
    this.timeout(120_000);
    for (const entry of ["src/commands/fylr.ts", "src/commands/execserver.ts"]) {
      const { stdout } = await run(process.execPath, ["--import", "tsx", "test/support/loaded-modules.ts", entry], { cwd: root, timeout: 60_000 });
      const { esm, cjs } = JSON.parse(stdout) as { esm: string[]; cjs: string[] };
      const all = [...esm, ...cjs];
      expect(all.some((m) => m.includes("/node_modules/@opentelemetry/api/")), entry).to.equal(true);
      expect(all.filter((m) => /\/node_modules\/@opentelemetry\/(?!api\/)|\/src\/shared\/tracing\/sdk-start\.ts$/.test(m)), entry).to.deep.equal([]);
    }
  });
});
