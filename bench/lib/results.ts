// Result files of bench/run.ts: bench/results/latest.json (every run, git-ignored) and kept
// runs, bench/results/YYYY-MM-DD-<commit>-<what>.json (committed). docs/performance.md is
// generated from the kept ones (scripts/performance-doc.ts), so their shape is checked here.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { describeIssues } from "../../src/shared/config-parsing.js";

const figureSchema = z.object({
  bench: z.string().min(1),
  metric: z.string().min(1),
  value: z.number(),
  baseline: z.string(),
  baseline_value: z.number(),
  ratio: z.number(),
  params: z.record(z.string(), z.unknown()),
});

/** True for a line's JSON that is a figure (see figure.ts); anything else a bench prints is commentary. */
export function isFigure(json: unknown): json is z.infer<typeof figureSchema> {
  return figureSchema.safeParse(json).success;
}

const loadSchema = z.tuple([z.number(), z.number(), z.number()]);

/** The machine a run was measured on. */
const machineSchema = z.object({
  cpus: z.number().int().min(1),
  model: z.string(),
  memory_bytes: z.number().int().min(0),
  platform: z.string(),
  arch: z.string(),
  kernel: z.string(),
  /** os.loadavg() (1, 5, 15 min) when the run started and when it ended. */
  load_average: z.object({ start: loadSchema, end: loadSchema }),
});

/** What bench/run.ts writes. */
export const runRecordSchema = z.object({
  /** When the run started (ISO 8601, UTC). */
  at: z.string().regex(/^\d{4}-\d{2}-\d{2}T/, "an ISO 8601 time"),
  finished_at: z.string(),
  /** `git rev-parse HEAD` of the tree that ran. */
  commit: z.string().regex(/^[0-9a-f]{7,40}$|^unknown$/, "a commit id"),
  /** True when tracked files differed from the commit: the code that ran is not exactly the commit's. */
  dirty: z.boolean(),
  /** The command as typed, benchmark environment variables first. */
  command: z.string().min(1),
  node: z.string(),
  machine: machineSchema,
  /** The benchmarks this run started, in order. */
  benches: z.array(z.string()),
  /** Benchmarks whose process exited non-zero. */
  failed: z.array(z.string()),
  figures: z.array(figureSchema),
});

/** One run of bench/run.ts. */
export type RunRecord = z.infer<typeof runRecordSchema>;

/** A kept run and the file it came from. */
export interface KeptRun {
  readonly file: string;
  readonly run: RunRecord;
}

/** A kept run's file name: `bench/results/<name>`. */
export const keptFilePattern = /^\d{4}-\d{2}-\d{2}-[0-9a-z]+(?:-dirty)?-[A-Za-z0-9+._-]+\.json$/;

/**
 * The file name a kept run gets: `YYYY-MM-DD-<commit>[-dirty]-<what>.json`, `what` being
 * the label given, else the benchmarks joined by `+`, else `all`.
 */
export function keptFileName(run: Pick<RunRecord, "at" | "commit" | "dirty">, what: string): string {
  const commit = run.commit === "unknown" ? "nocommit" : run.commit.slice(0, 7);
  const safe = what.replace(/[^A-Za-z0-9+._-]+/g, "_");
  return `${run.at.slice(0, 10)}-${commit}${run.dirty ? "-dirty" : ""}-${safe}.json`;
}

/** Parses one result file's text; the error names the file and the key that is wrong. */
export function parseRunRecord(text: string, file: string): RunRecord {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new Error(`${file}: not JSON (${(error as Error).message})`);
  }
  const result = runRecordSchema.safeParse(json);
  if (!result.success) throw new Error(`${file}: ${describeIssues(result.error.issues)}`);
  return result.data;
}

/** Every kept run in `dir` (latest.json and other names are not kept runs), oldest first. */
export function readKeptRuns(dir: string): KeptRun[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw error;
  }
  return names
    .filter((name) => keptFilePattern.test(name))
    .map((name) => ({ file: name, run: parseRunRecord(readFileSync(join(dir, name), "utf8"), join(dir, name)) }))
    .sort(byTime);
}

/** Oldest first; runs started at the same time by file name. */
export function byTime(a: KeptRun, b: KeptRun): number {
  return a.run.at < b.run.at ? -1 : a.run.at > b.run.at ? 1 : a.file < b.file ? -1 : a.file > b.file ? 1 : 0;
}
