// Building and running k6, and reading the summary it exports.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { stopChild } from "./processes.js";

/** One threshold of one metric, as k6 evaluated it. */
export interface ThresholdResult {
  readonly metric: string;
  readonly expression: string;
  readonly ok: boolean;
}

/** The parts of k6's legacy summary export (--summary-export) the runner reads. */
export interface K6Summary {
  readonly metrics: Record<string, Record<string, unknown> & { thresholds?: Record<string, boolean> }>;
}

/** Runs scripts/build-k6.sh (builds once with Go, then reuses) and returns the binary's path. */
export async function buildK6(root: string): Promise<string> {
  const child = spawn(join(root, "scripts", "build-k6.sh"), [], { cwd: root, stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (out += chunk));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  const bin = out.trim().split("\n").pop() ?? "";
  if (code !== 0 || !existsSync(bin)) throw new Error(`scripts/build-k6.sh failed (exit ${code}): ${out}`);
  return bin;
}

/** What one k6 run needs. */
export interface K6Run {
  readonly bin: string;
  /** The script, load/scripts/<name>.js. */
  readonly script: string;
  /** Passed with -e NAME=VALUE (k6 reads them as __ENV). */
  readonly env: Record<string, string | number>;
  /** Where --summary-export writes the summary. */
  readonly summaryPath: string;
  /** k6's own output (progress, console.log of the scripts, end-of-test summary). */
  readonly logPath: string;
  /** Echo k6's output to our stdout as well. */
  readonly verbose: boolean;
}

/** A running k6; `exited` resolves with its exit code (99 = thresholds crossed). */
export interface K6Process {
  readonly child: ChildProcess;
  readonly exited: Promise<number>;
  /** Asks k6 to stop (it still writes its summary), then kills it after graceMs. */
  stop(graceMs?: number): Promise<void>;
}

/** Starts k6 with the summary export, quiet progress and the REST API on a free port. */
export function startK6(run: K6Run): K6Process {
  const args = ["run", "--quiet", "--no-color", "--address", "127.0.0.1:0", "--summary-export", run.summaryPath];
  for (const [key, value] of Object.entries(run.env)) args.push("-e", `${key}=${value}`);
  args.push(run.script);
  const child = spawn(run.bin, args, {
    cwd: join(run.script, ".."),
    env: { ...process.env, K6_NO_USAGE_REPORT: "true" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const log = createWriteStream(run.logPath);
  for (const stream of [child.stdout, child.stderr]) {
    stream.on("data", (chunk: Buffer) => {
      log.write(chunk);
      if (run.verbose) process.stdout.write(chunk);
    });
  }
  const exited = new Promise<number>((resolve) =>
    child.on("close", (code, signal) => {
      log.end();
      resolve(code ?? (signal ? 128 : 1));
    }),
  );
  return { child, exited, stop: (graceMs = 15_000) => stopChild(child, graceMs) };
}

/** Reads a summary export; undefined when k6 did not write one. */
export function readSummary(path: string): K6Summary | undefined {
  if (!existsSync(path)) return undefined;
  return JSON.parse(readFileSync(path, "utf8")) as K6Summary;
}

/**
 * Every threshold in the summary. In the legacy export `thresholds` maps each expression
 * to whether it FAILED (true = crossed).
 */
export function thresholdResults(summary: K6Summary): ThresholdResult[] {
  const results: ThresholdResult[] = [];
  for (const [metric, values] of Object.entries(summary.metrics)) {
    for (const [expression, failed] of Object.entries(values.thresholds ?? {})) results.push({ metric, expression, ok: !failed });
  }
  return results.sort((a, b) => a.metric.localeCompare(b.metric));
}

/** One figure of a metric (count, value, rate, p(95), …) or undefined. */
export function figure(summary: K6Summary | undefined, metric: string, stat: string): number | undefined {
  const value = summary?.metrics[metric]?.[stat];
  return typeof value === "number" ? value : undefined;
}
