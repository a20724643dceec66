/**
 * A cleanup stack: steps registered as things are started, run in reverse order, every
 * one of them even when some fail, and then one error that names every failed step — not
 * only the first. Node 20 has Symbol.asyncDispose but no AsyncDisposableStack; this is the
 * part of it the project needs.
 */
import { Code, SlotbrokerError } from "./errors.js";

/** One cleanup step that failed. */
export interface FailedStep {
  readonly step: string;
  readonly error: unknown;
}

/** Some cleanup steps failed; `failures` has each one, in the order they ran. */
export class CleanupError extends SlotbrokerError {
  override name = "CleanupError";
  constructor(
    what: string,
    readonly failures: readonly FailedStep[],
  ) {
    const list = failures.map((f) => `${f.step}: ${f.error instanceof Error ? f.error.message : String(f.error)}`).join("; ");
    super(Code.Internal, `${what}: ${failures.length} cleanup step${failures.length === 1 ? "" : "s"} failed: ${list}`, {
      cause: failures[0]?.error,
      details: { steps: failures.map((f) => f.step) },
    });
  }
}

/** Cleanup steps, run last-in first-out. */
export class CleanupStack {
  private readonly steps: { readonly name: string; readonly run: () => unknown }[] = [];
  private running: Promise<void> | undefined;

  /** `what` names the owner in the error, e.g. "fylr stop". */
  constructor(private readonly what: string) {}

  /** Registers a step; it runs before every step registered earlier. */
  defer(name: string, run: () => unknown): void {
    if (this.running) throw new SlotbrokerError(Code.FailedPrecondition, `${this.what}: cannot add "${name}" to a cleanup stack that already ran`);
    this.steps.push({ name, run });
  }

  /** Runs every step once (later calls return the same promise); rejects with a CleanupError naming each failure. */
  run(): Promise<void> {
    this.running ??= this.runAll();
    return this.running;
  }

  /** The same as run(), for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.run();
  }

  private async runAll(): Promise<void> {
    const failures: FailedStep[] = [];
    for (const step of this.steps.reverse()) {
      try {
        await step.run();
      } catch (error) {
        failures.push({ step: step.name, error });
      }
    }
    if (failures.length > 0) throw new CleanupError(this.what, failures);
  }
}
