// The job runner: spawns a job's command (no shell) in its own process group and temp
// directory, streams stdin/stdout through the pipe URLs, and describes the end in a Receipt.
export { createRunJob, runJob, type RunnerOptions } from "./run-job.js";
export type { RunJob, RunRequest } from "./types.js";
export { childEnv, FALLBACK_PATH } from "./child-env.js";
export { StdoutBuffer, STDOUT_BUFFER_LIMIT, type StdoutStep } from "./stdout-buffer.js";
export { LastLineTracker, STDERR_LINE_LIMIT, capUtf8 } from "./stderr-line.js";
export { receiptFromOutcome, receiptNotRun, type JobFailure, type JobOutcome } from "./receipt.js";
export { DEFAULT_KILL_GRACE_MS } from "./running-job.js";
