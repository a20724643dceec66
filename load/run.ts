// The k6 load tests: builds k6, starts what each scenario needs on loopback, runs its
// script, checks k6's verdict (thresholds) and the runner's own checks, stops everything
// and prints a table. Exit code 1 when any scenario failed.
//   npm run load                              every scenario, ci profile
//   npm run load -- --profile local           longer, more VUs
//   npm run load -- broker-fairness priority  only those
// Options: --verbose (echo k6's output), --server-root DIR (start the servers from another
// checkout, e.g. a deliberately broken copy, to see the thresholds fail).
// Results: load/results/<scenario>.json (k6 summary export + the runner's checks),
// load/results/<scenario>.log (k6's output), load/results/latest.json (the table).
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { constants } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { buildK6, figure, readSummary, startK6, thresholdResults, type K6Process, type ThresholdResult } from "./k6.js";
import { RUN_MARKER, Supervisor, sweepLeftovers } from "./processes.js";
import type { ProfileName } from "./profiles.js";
import type { RunnerCheck, Scenario } from "./scenario.js";
import { scenarios } from "./scenarios.js";
import { runPostgres } from "./servers.js";
import { buildChildren, removeBuild } from "../harness/node-children.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..");
const resultsDir = join(here, "results");

/** The outcome of one scenario. */
interface Outcome {
  readonly scenario: string;
  readonly ok: boolean;
  readonly seconds: number;
  /** Where the seconds went: starting servers, k6, the runner's checks, stopping. */
  readonly phases: Record<string, number>;
  readonly k6Exit: number | undefined;
  readonly failedThresholds: readonly ThresholdResult[];
  readonly checks: readonly RunnerCheck[];
  readonly figures: Record<string, number | undefined>;
  readonly error?: string;
}

const { values, positionals } = parseArgs({
  args: process.argv.slice(2),
  options: {
    profile: { type: "string", default: "ci" },
    verbose: { type: "boolean", default: false },
    "server-root": { type: "string" },
    help: { type: "boolean", short: "h" },
  },
  allowPositionals: true,
});
if (values.help) {
  process.stdout.write(`usage: npm run load -- [--profile ci|local] [--verbose] [--server-root DIR] [SCENARIO...]\nscenarios: ${scenarios.map((s) => s.name).join(", ")}\n`);
  process.exit(0);
}
const profile = values.profile as ProfileName;
if (profile !== "ci" && profile !== "local") fail(`--profile: expected ci or local, got "${values.profile}"`);
const unknown = positionals.filter((p) => !scenarios.some((s) => s.name === p));
if (unknown.length > 0) fail(`unknown scenario: ${unknown.join(", ")}; available: ${scenarios.map((s) => s.name).join(", ")}`);
const selected = positionals.length > 0 ? scenarios.filter((s) => positionals.includes(s.name)) : scenarios;
const serverRoot = resolve(values["server-root"] ?? root);

// Every process this run starts inherits the marker; the final sweep looks for it.
const runId = randomBytes(6).toString("hex");
process.env[RUN_MARKER] = runId;

// What the scenarios share (the run's Postgres), stopped after the last scenario.
const shared = new Supervisor();
const postgres = runPostgres(shared);
let current: { sup: Supervisor; k6?: K6Process } | undefined;
let interrupted = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (interrupted) return;
    interrupted = true;
    process.stderr.write(`\nload: ${signal}: stopping k6 and every server…\n`);
    void (async () => {
      await current?.k6?.stop(5_000);
      await current?.sup.stopAll();
      await shared.stopAll();
      reportLeftovers();
      process.exit(128 + constants.signals[signal]);
    })();
  });
}

mkdirSync(resultsDir, { recursive: true });
process.stderr.write(`load: profile ${profile}, scenarios ${selected.map((s) => s.name).join(", ")}${serverRoot !== root ? `, servers from ${serverRoot}` : ""}\n`);
const buildStarted = Date.now();
const k6 = await buildK6(root);
// The servers run from one build of the project's JavaScript (not through tsx).
if (serverRoot === root) await buildChildren();
process.stderr.write(`load: k6 and the servers' build ready in ${Math.round((Date.now() - buildStarted) / 1000)} s\n`);
const outcomes: Outcome[] = [];
for (const scenario of selected) {
  if (interrupted) break;
  outcomes.push(await runScenario(scenario, k6));
}
const failedShared = await shared.stopAll();
if (failedShared.length > 0) process.stderr.write(`load: failed to stop: ${failedShared.join("; ")}\n`);
removeBuild();
const leftovers = reportLeftovers();
printTable(outcomes);
writeFileSync(join(resultsDir, "latest.json"), `${JSON.stringify({ at: new Date().toISOString(), profile, outcomes }, null, 2)}\n`);
process.exitCode = outcomes.every((o) => o.ok) && outcomes.length === selected.length && leftovers.length === 0 && failedShared.length === 0 ? 0 : 1;

async function runScenario(scenario: Scenario, bin: string): Promise<Outcome> {
  const started = Date.now();
  const sup = new Supervisor();
  current = { sup };
  const summaryPath = join(resultsDir, `${scenario.name}.json`);
  rmSync(summaryPath, { force: true });
  process.stderr.write(`\n== ${scenario.name}: starting servers\n`);
  let k6Exit: number | undefined;
  let checks: RunnerCheck[] = [];
  let error: string | undefined;
  const phases: Record<string, number> = {};
  let phaseStart = started;
  const phase = (name: string): void => {
    phases[name] = Math.round((Date.now() - phaseStart) / 1000);
    phaseStart = Date.now();
  };
  try {
    const prepared = await scenario.prepare({ sup, serverRoot, postgres }, profile);
    phase("servers");
    process.stderr.write(`== ${scenario.name}: k6 ${scenario.script} (${JSON.stringify(prepared.env)})\n`);
    const run = startK6({
      bin,
      script: join(here, "scripts", scenario.script),
      env: { ...prepared.env, PROTO_DIR: join(root, "proto") },
      summaryPath,
      logPath: join(resultsDir, `${scenario.name}.log`),
      verbose: values.verbose,
    });
    current.k6 = run;
    const limit = scenario.timeoutSeconds(profile);
    const watchdog = setTimeout(() => {
      error = `k6 ran longer than ${limit} s and was stopped`;
      void run.stop(10_000);
    }, limit * 1000);
    k6Exit = await run.exited;
    clearTimeout(watchdog);
    phase("k6");
    if (prepared.after && !interrupted) checks = await prepared.after(readSummary(summaryPath));
    phase("checks");
  } catch (err) {
    error = (err as Error).stack ?? String(err);
  } finally {
    phaseStart = Date.now();
    const failedStops = await sup.stopAll();
    phase("stop");
    if (failedStops.length > 0) checks.push({ name: "everything stopped", ok: false, detail: failedStops.join("; ") });
  }
  const summary = readSummary(summaryPath);
  const thresholds = summary ? thresholdResults(summary) : [];
  const failedThresholds = thresholds.filter((t) => !t.ok);
  const figures: Record<string, number | undefined> = {};
  for (const f of scenario.figures) figures[f.label] = figure(summary, f.metric, f.stat);
  const ok = !error && k6Exit === 0 && !!summary && failedThresholds.length === 0 && checks.every((c) => c.ok);
  const outcome: Outcome = { scenario: scenario.name, ok, seconds: Math.round((Date.now() - started) / 1000), phases, k6Exit, failedThresholds, checks, figures, error };
  if (summary) writeFileSync(summaryPath, `${JSON.stringify({ ...summary, runner: { profile, ...outcome, thresholds } }, null, 2)}\n`);
  report(scenario, outcome);
  return outcome;
}

function report(scenario: Scenario, o: Outcome): void {
  const phases = Object.entries(o.phases).map(([name, s]) => `${name} ${s} s`).join(", ");
  const lines = [`== ${scenario.name}: ${o.ok ? "passed" : "FAILED"} in ${o.seconds} s (${phases}; k6 exit ${o.k6Exit ?? "-"})`];
  for (const t of o.failedThresholds) lines.push(`   threshold crossed: ${t.metric} ${t.expression}`);
  for (const c of o.checks) lines.push(`   ${c.ok ? "ok  " : "FAIL"} ${c.name}: ${c.detail}`);
  if (o.error) lines.push(`   error: ${o.error}`);
  if (!o.ok && !values.verbose) {
    const log = join(resultsDir, `${scenario.name}.log`);
    lines.push(`   k6 output: load/results/${scenario.name}.log`, ...scriptErrors(log, 20), ...tail(log, 40));
  }
  process.stderr.write(`${lines.join("\n")}\n`);
}

/** The first `n` lines the script itself logged at error level (its console.error): what a threshold counted. */
function scriptErrors(path: string, n: number): string[] {
  try {
    const errors = readFileSync(path, "utf8").split("\n").filter((l) => l.includes("level=error") && l.includes("source=console"));
    const shown = errors.slice(0, n).map((l) => `   ! ${l}`);
    if (errors.length > n) shown.push(`   ! … ${errors.length - n} more`);
    return shown;
  } catch {
    return [];
  }
}

function tail(path: string, n: number): string[] {
  try {
    return readFileSync(path, "utf8").trimEnd().split("\n").slice(-n).map((l) => `   | ${l}`);
  } catch {
    return [];
  }
}

function printTable(all: readonly Outcome[]): void {
  const rows = all.map((o) => [
    o.scenario,
    o.ok ? "pass" : "FAIL",
    `${o.seconds}s`,
    Object.entries(o.figures)
      .map(([label, v]) => `${label} ${format(v, scenarios.find((s) => s.name === o.scenario)?.figures.find((f) => f.label === label)?.digits ?? 0)}`)
      .join(", "),
  ]);
  const header = ["scenario", "result", "time", "figures"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: readonly string[]): string => cells.map((c, i) => c.padEnd(widths[i]!)).join("  ").trimEnd();
  process.stdout.write(`\n${line(header)}\n${line(widths.map((w) => "-".repeat(w)))}\n${rows.map(line).join("\n")}\n`);
}

function format(value: number | undefined, digits: number): string {
  return value === undefined ? "-" : value.toFixed(digits);
}

function reportLeftovers(): string[] {
  const left = sweepLeftovers(runId);
  if (left.length > 0) process.stderr.write(`load: processes left running (killed now):\n  ${left.join("\n  ")}\n`);
  return left;
}

function fail(message: string): never {
  process.stderr.write(`load: ${message}\n`);
  process.exit(2);
}
