/**
 * The small state file `slotbroker up` writes once its stack runs, and how client commands
 * find their fylr: --api, SLOTBROKER_API, that file, or the default address. Kept apart
 * from the stack itself so that a client command loads no server code.
 */
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";

/** What `up` writes once the stack is running. */
export interface UpState {
  /** The process that runs the stack; the file counts only while it is alive. */
  readonly pid: number;
  /** The fylr's base URL (QueueService, /status.json). */
  readonly api: string;
  /** The execserver's gRPC address. */
  readonly execserver: string;
  /** The execserver's admin URL. */
  readonly admin: string;
  readonly startedAt: string;
}

/** SLOTBROKER_STATE_FILE, else $XDG_STATE_HOME/slotbroker/up.json (~/.local/state by default). */
export function upStateFile(env: NodeJS.ProcessEnv = process.env): string {
  if (env.SLOTBROKER_STATE_FILE) return env.SLOTBROKER_STATE_FILE;
  return join(env.XDG_STATE_HOME || join(homedir(), ".local", "state"), "slotbroker", "up.json");
}

/** Writes the state atomically (readable by this user only). */
export function writeUpState(state: UpState, file: string = upStateFile()): void {
  mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  const temp = `${file}.${process.pid}.tmp`;
  writeFileSync(temp, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
  renameSync(temp, file);
}

/** Removes the file if it still describes the stack of `pid` (a newer `up` may have replaced it). */
export function removeUpState(pid: number, file: string = upStateFile()): void {
  if (readUpState(file, () => true)?.pid === pid) rmSync(file, { force: true });
}

/** The state of a running stack, or undefined when there is none (no file, unreadable, or its process is gone). */
export function readUpState(file: string = upStateFile(), isAlive: (pid: number) => boolean = processAlive): UpState | undefined {
  let state: Partial<UpState>;
  try {
    state = JSON.parse(readFileSync(file, "utf8")) as Partial<UpState>;
  } catch {
    return undefined;
  }
  if (typeof state.pid !== "number" || typeof state.api !== "string" || typeof state.execserver !== "string") return undefined;
  return isAlive(state.pid) ? (state as UpState) : undefined;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Which fylr a client command talks to, and why. */
export interface ApiTarget {
  readonly url: string;
  /** "--api", "SLOTBROKER_API", the state file's path, or "default". */
  readonly source: string;
}

/** --api, else SLOTBROKER_API, else the running `up` stack, else http://127.0.0.1:7700. */
export function resolveApi(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): ApiTarget {
  const trim = (url: string): string => url.replace(/\/+$/, "");
  if (flag) return { url: trim(flag), source: "--api" };
  if (env.SLOTBROKER_API) return { url: trim(env.SLOTBROKER_API), source: "SLOTBROKER_API" };
  const file = upStateFile(env);
  const state = readUpState(file);
  if (state) return { url: trim(state.api), source: `the running slotbroker up (${file})` };
  return { url: "http://127.0.0.1:7700", source: "default" };
}
