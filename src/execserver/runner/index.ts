// The job runner: spawns a job's command (no shell, ever) in its own process group and a
// fresh temp directory, streams stdin/stdout through the pipe URLs, and describes the end
// in a Receipt. Decisions worth knowing:
// - env is exactly the job's allow-listed variables plus PATH (the job's own if allowed,
//   else the execserver's, else FALLBACK_PATH); nothing else of the execserver leaks.
// - stdout is held until it passes 4000 bytes; output that fits never touches the stdout
//   URL. Without a stdout URL, output past the prefix is counted and dropped: no error,
//   stdout_streamed=false, stdout_bytes > prefix length tells the caller it was cut.
// - the upload ends cleanly only after exit code 0 and no runner failure; anything else
//   destroys it, so the receiver sees an aborted body.
// - when the job is over, whatever is left in its process group is SIGKILLed.
// - a job never outlives its execserver: a reaper outside the execserver's process group
//   and session (group-watchdog.ts) kills every running job's group when the execserver
//   dies, and removes its directory of job directories; an execserver that starts sweeps
//   what dead ones left when their reaper died too (leftover-jobs.ts).
// - on Linux the fork happens in the job launcher (job-launcher.ts), a small node process:
//   forking copies the forking process's page tables and blocks it until the child has
//   exec'd, which from the execserver cost milliseconds per job. The launcher passes the
//   job's stdin, and its stdout when it goes to a stdout URL, back over its IPC channel,
//   so the runner streams them itself as before; it reads stderr (and stdout with nowhere
//   to go but the receipt) itself and sends the last line (and stdout's first bytes) with
//   the exit status, registers the job's group with the reaper, and removes finished
//   jobs' directories.
export { createRunJob, runJob, type RunnerOptions } from "./run-job.js";
export { readPipeCa } from "./http-client.js";
export { jobDirRoot, jobDirsRemoved } from "./job-dir.js";
export { sweepLeftoverJobs, type SweepOptions, type SweepResult } from "./leftover-jobs.js";
export { JobLauncher, nativeLauncherPath, sharedJobLauncher, type JobLauncherOptions } from "./job-launcher.js";
export type { JobProcess, RunJob, RunRequest, StdoutSink } from "./types.js";
export { childEnv, FALLBACK_PATH } from "./child-env.js";
export { StdoutBuffer, STDOUT_BUFFER_LIMIT, type StdoutStep } from "./stdout-buffer.js";
export { LastLineTracker, STDERR_LINE_LIMIT, capUtf8 } from "./stderr-line.js";
export { receiptFromOutcome, receiptNotRun, type JobFailure, type JobOutcome } from "./receipt.js";
export { DEFAULT_KILL_GRACE_MS } from "./running-job.js";
