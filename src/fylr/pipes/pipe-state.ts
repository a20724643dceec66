import { Events } from "../../shared/typed-events.js";
import { Transitions } from "../../shared/lifecycle.js";
import type { Logger } from "../../shared/log.js";
import { PipeError } from "./errors.js";

/**
 * A pipe's lifecycle. "waiting" until its one consumer arrives, "streaming" while bytes
 * flow, then exactly one terminal state. Only "waiting" can expire.
 */
export type PipeState = "waiting" | "streaming" | "done" | "aborted" | "expired";

const transitions = new Transitions<PipeState>("pipe", {
  waiting: ["streaming", "expired", "aborted"],
  streaming: ["done", "aborted"],
  done: [],
  aborted: [],
  expired: [],
});

/** True for the states a pipe never leaves. */
export function isTerminal(state: PipeState): boolean {
  return transitions.isFinal(state);
}

/** Which way a pipe's bytes go, seen from the job: stdin ("in") or stdout ("out"). */
export type PipeDirection = "in" | "out";

/** What the registry learns when a pipe settles. */
export interface PipeSettlement {
  readonly id: string;
  readonly direction: PipeDirection;
  readonly state: PipeState;
  /** True when a consumer opened the pipe before it settled. */
  readonly opened: boolean;
}

/** What every pipe gets from the registry. */
export interface PipeContext {
  readonly id: string;
  readonly ttlMs: number;
  readonly logger: Logger;
  readonly onSettled: (settlement: PipeSettlement) => void;
}

/** A pipe's events, name → listener arguments. */
export interface PipeEvents {
  /** The pipe moved to `state`. */
  state: [state: PipeState];
}
// One error for every retired pipe: building (and capturing a stack for) one per job is a
// measurable part of a busy fylr's CPU, and nobody reads it.
const retiredUnused = new PipeError("cancelled", "pipe retired unused by its owner");

/** The owner's view of a pipe, returned by the registry's create calls. */
export interface PipeHandle {
  /** The pipe id; put it in the pipe URL. */
  readonly id: string;
  /** Resolves with the bytes moved on a clean end; rejects with a PipeError otherwise. */
  readonly done: Promise<number>;
  /** The current lifecycle state. */
  readonly state: PipeState;
  /** Lifecycle events: `state` on every move (the consumer arrived, the pipe settled). */
  readonly events: Events<PipeEvents>;
  /** Aborts the pipe unless it already settled; its consumer sees an error. */
  cancel(reason?: unknown): void;
  /**
   * Cancels a pipe that was never opened, quietly: its stream is closed without an error
   * and `done` rejects with one shared "cancelled" error. No-op once opened or settled.
   */
  retire(): void;
}

/**
 * Lifecycle, TTL timer and completion promise shared by in- and out-pipes. Subclasses
 * release their stream in `release(error)` when the pipe fails.
 */
export abstract class PipeBase implements PipeHandle {
  readonly id: string;
  protected bytes = 0;
  private childLogger: Logger | undefined;
  private current: PipeState = "waiting";
  private opened = false;
  private failure: PipeError | undefined;
  private timer: NodeJS.Timeout | undefined;
  // `done` and `events` are made when first asked for: most out-pipes are retired unused
  // and nobody awaits or watches them.
  private donePromise: Promise<number> | undefined;
  private resolveDone: ((bytes: number) => void) | undefined;
  private rejectDone: ((err: PipeError) => void) | undefined;
  private stateEvents: Events<PipeEvents> | undefined;

  protected constructor(
    readonly direction: PipeDirection,
    private readonly context: PipeContext,
  ) {
    this.id = context.id;
    this.timer = setTimeout(() => this.expire(), context.ttlMs);
    this.timer.unref();
  }

  /** Resolves with the bytes moved on a clean end; rejects with a PipeError otherwise. */
  get done(): Promise<number> {
    if (this.donePromise) return this.donePromise;
    if (this.current === "done") return (this.donePromise = Promise.resolve(this.bytes));
    this.donePromise = isTerminal(this.current)
      ? Promise.reject(this.failure!)
      : new Promise<number>((resolve, reject) => {
          this.resolveDone = resolve;
          this.rejectDone = reject;
        });
    // An owner that never awaits `done` must not crash the process with an unhandled
    // rejection; the failure also reaches the owner's stream itself.
    this.donePromise.catch(() => undefined);
    return this.donePromise;
  }

  /** Lifecycle events: `state` on every move. */
  get events(): Events<PipeEvents> {
    return (this.stateEvents ??= new Events<PipeEvents>());
  }

  // Made at the first line logged: there is a pipe per job, and its lines are debug ones,
  // usually off.
  private get logger(): Logger {
    return (this.childLogger ??= this.context.logger.child({ pipe: this.direction, pipeId: shortId(this.id) }));
  }

  private debug(fields: Record<string, unknown>, message: string): void {
    if (this.context.logger.isLevelEnabled("debug")) this.logger.debug(fields, message);
  }

  /** The current lifecycle state. */
  get state(): PipeState {
    return this.current;
  }

  /** Aborts the pipe unless it already settled. */
  cancel(reason?: unknown): void {
    const message = reason instanceof Error ? reason.message : typeof reason === "string" ? reason : "cancelled by its owner";
    this.fail(new PipeError(this.opened ? "aborted" : "cancelled", `pipe cancelled: ${message}`, { cause: reason }));
  }

  /** Cancels the pipe unopened without building an error per pipe (see PipeHandle). */
  retire(): void {
    if (this.current !== "waiting") return;
    this.fail(retiredUnused, { quiet: true });
  }

  /**
   * Fails the pipe with `error` (no-op once settled): rejects `done`, releases the stream
   * (with the error, or without one when `quiet`).
   */
  fail(error: PipeError, options: { quiet?: boolean } = {}): void {
    if (isTerminal(this.current)) return;
    this.failure = error;
    this.setState(error.kind === "expired" ? "expired" : "aborted");
    this.release(options.quiet ? undefined : error);
    this.rejectDone?.(error);
    this.debug({ bytes: this.bytes, err: error.message }, "pipe failed");
    this.settle();
  }

  /** Releases the owner's stream after a failure (`undefined`: closed quietly). */
  protected abstract release(error: PipeError | undefined): void;

  /** waiting → streaming, for the one consumer. */
  protected markOpened(): void {
    if (this.current === "streaming") throw new PipeError("busy", `${this.direction}-pipe is already in use by another request`);
    this.setState("streaming");
    this.opened = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** streaming → done, resolving `done` with the byte count. */
  protected markDone(): void {
    this.setState("done");
    this.resolveDone?.(this.bytes);
    this.debug({ bytes: this.bytes }, "pipe done");
    this.settle();
  }

  /** Throws the pipe's failure when it is no longer streaming (e.g. aborted meanwhile). */
  protected assertStreaming(): void {
    if (this.current === "streaming") return;
    throw this.failure ?? new PipeError("aborted", `pipe is ${this.current}, not streaming`);
  }

  private expire(): void {
    this.timer = undefined;
    this.fail(new PipeError("expired", `pipe expired unused after ${this.context.ttlMs} ms`));
  }

  private setState(next: PipeState): void {
    this.current = transitions.check(this.current, next);
    this.stateEvents?.emit("state", next);
  }

  private settle(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.context.onSettled({ id: this.id, direction: this.direction, state: this.current, opened: this.opened });
  }
}

/** The first characters of an id, enough to correlate logs without leaking the credential. */
export function shortId(id: string): string {
  return `${id.slice(0, 6)}…`;
}
