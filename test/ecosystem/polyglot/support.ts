// Helpers for the tests that drive slotbroker from other languages and stock tools: the
// Go tools built by the project's script, running a command with its output kept, and the
// symbols a server's reflection should describe.
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import type { DescriptorProto, EnumDescriptorProto } from "@bufbuild/protobuf/wkt";
import { descriptorFiles } from "../../../src/shared/reflection.js";
import { root } from "../../integration/support.js";
export { run, type Run } from "../../support/run-program.js";

const execFileP = promisify(execFile);

/**
 * Builds (first time) or reuses grpcurl, protoc-gen-go and protoc-gen-go-grpc in tools/bin
 * through scripts/build-go-tools.sh; returns the bin directory. Fails loudly without Go.
 */
export async function goTools(): Promise<string> {
  try {
    const { stdout } = await execFileP(join(root, "scripts/build-go-tools.sh"), { timeout: 600_000, maxBuffer: 16 * 1024 * 1024 });
    return stdout.trim();
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`scripts/build-go-tools.sh failed (Go is required for the polyglot tests): ${e.stderr ?? e.message}`);
  }
}

/** A message or enum a server's reflection must describe, with the names inside it. */
export interface Symbol {
  readonly name: string;
  readonly kind: "message" | "enum" | "service" | "map entry";
  /** Field, value or method names. */
  readonly members: readonly string[];
}

/**
 * Every service, message (nested and map entries too) and enum of the files that define
 * `services`, and of the files those import: what `grpcurl describe` must resolve.
 */
export function symbolsOf(services: readonly string[]): Symbol[] {
  const files = descriptorFiles();
  const seen = new Set<string>();
  const out: Symbol[] = [];
  const visitEnum = (scope: string, e: EnumDescriptorProto): void => {
    out.push({ name: `${scope}${e.name}`, kind: "enum", members: e.value.map((v) => v.name) });
  };
  const visitMessage = (scope: string, m: DescriptorProto): void => {
    const name = `${scope}${m.name}`;
    // A map entry is shown as the map field that uses it ("map<string, string> env = 2;").
    out.push(m.options?.mapEntry ? { name, kind: "map entry", members: [] } : { name, kind: "message", members: m.field.map((f) => f.name) });
    for (const n of m.nestedType) visitMessage(`${name}.`, n);
    for (const e of m.enumType) visitEnum(`${name}.`, e);
  };
  const visitFile = (fileName: string): void => {
    if (seen.has(fileName)) return;
    seen.add(fileName);
    const file = files.get(fileName)!;
    const prefix = file.package ? `${file.package}.` : "";
    for (const m of file.messageType) visitMessage(prefix, m);
    for (const e of file.enumType) visitEnum(prefix, e);
    for (const s of file.service) out.push({ name: `${prefix}${s.name}`, kind: "service", members: s.method.map((m) => m.name) });
    file.dependency.forEach(visitFile);
  };
  for (const service of services) {
    const file = [...files.values()].find((f) => f.service.some((s) => `${f.package}.${s.name}` === service));
    if (!file) throw new Error(`no file defines ${service}`);
    visitFile(file.name);
  }
  return out;
}

/** Runs `fn` over `items`, at most `limit` at a time; resolves with the results in order. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}
