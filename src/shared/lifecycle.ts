/**
 * Checked state machines: every lifecycle in the project is a string union with a table of
 * legal moves, and one error type for an illegal one.
 */
import { Code, SlotbrokerError } from "./errors.js";

/** A move the table does not allow: a bug in the caller, or an operation in the wrong state. */
export class IllegalTransitionError extends SlotbrokerError {
  override name = "IllegalTransitionError";
  constructor(what: string, from: string, to: string) {
    super(Code.FailedPrecondition, `illegal ${what} transition ${from} → ${to}`, { details: { what, from, to } });
  }
}

/** The legal moves of one lifecycle, with its name for error messages. */
export class Transitions<S extends string> {
  constructor(
    /** What moves, e.g. "broker connection". */
    readonly what: string,
    private readonly table: Readonly<Record<S, readonly S[]>>,
  ) {}

  /** True when `from → to` is legal. */
  can(from: S, to: S): boolean {
    return this.table[from].includes(to);
  }

  /** Returns `to` when `from → to` is legal; throws IllegalTransitionError otherwise. */
  check(from: S, to: S): S {
    if (!this.can(from, to)) throw new IllegalTransitionError(this.what, from, to);
    return to;
  }

  /** True for a state with no way out. */
  isFinal(state: S): boolean {
    return this.table[state].length === 0;
  }
}
