/**
 * Local actions: work a fylr does itself (no execserver), bounded by the local semaphore.
 * A registry maps a name to a function; unknown names and bad parameters are refused when
 * the item is submitted, not when it runs.
 */
import { createHash, getHashes } from "node:crypto";
import { setImmediate as yieldToLoop } from "node:timers/promises";
import { Code, SlotbrokerError } from "../../shared/errors.js";

/** Runs one local action over its input; honours `signal`. */
export type LocalActionFn = (
  params: Readonly<Record<string, string>>,
  input: Buffer,
  signal: AbortSignal,
) => Promise<Buffer>;

/** A registered action. */
export interface LocalActionDefinition {
  /** One line for help and errors. */
  readonly summary: string;
  /** Throws an Error naming the bad parameter; called at submit time. */
  readonly validate?: (params: Readonly<Record<string, string>>) => void;
  readonly run: LocalActionFn;
}

/** name → action. */
export class LocalActionRegistry {
  private readonly actions = new Map<string, LocalActionDefinition>();

  /** Adds (or replaces) an action; returns the registry for chaining. */
  register(name: string, definition: LocalActionDefinition): this {
    if (!/^[a-z][a-z0-9_-]*$/.test(name)) throw new TypeError(`invalid local action name "${name}"`);
    this.actions.set(name, definition);
    return this;
  }

  /** The action, or undefined. */
  get(name: string): LocalActionDefinition | undefined {
    return this.actions.get(name);
  }

  /** Registered names, sorted. */
  names(): string[] {
    return [...this.actions.keys()].sort();
  }

  /** Throws an INVALID_ARGUMENT error for an unknown action or bad parameters. */
  validate(name: string, params: Readonly<Record<string, string>>): void {
    const action = this.actions.get(name);
    if (!action) {
      throw new SlotbrokerError(Code.InvalidArgument, `local.name: unknown local action "${name}"; known: ${this.names().join(", ")}`);
    }
    try {
      action.validate?.(params);
    } catch (err) {
      throw new SlotbrokerError(Code.InvalidArgument, `local.params: ${(err as Error).message}`, { cause: err });
    }
  }
}

// Hashing big inputs in slices keeps the event loop (heartbeats, other items) responsive
// and lets an abort take effect between slices.
const slice = 1 << 20;

const hashNames = new Set(getHashes());

/** checksum: the hex digest of the input plus a newline; params.algorithm (default sha256). */
export const checksumAction: LocalActionDefinition = {
  summary: "hex digest of the input (params: algorithm = sha256 | sha1 | md5 | sha512 | …)",
  validate(params) {
    for (const key of Object.keys(params)) if (key !== "algorithm") throw new Error(`unknown parameter "${key}" for checksum`);
    const algorithm = params.algorithm ?? "sha256";
    if (!hashNames.has(algorithm)) throw new Error(`algorithm: unsupported hash "${algorithm}"`);
  },
  async run(params, input, signal) {
    const hash = createHash(params.algorithm ?? "sha256");
    for (let offset = 0; offset < input.length; offset += slice) {
      signal.throwIfAborted();
      hash.update(input.subarray(offset, offset + slice));
      if (offset + slice < input.length) await yieldToLoop();
    }
    signal.throwIfAborted();
    return Buffer.from(`${hash.digest("hex")}\n`);
  },
};

/** count: "lines words bytes\n" of the input, like `wc`. */
export const countAction: LocalActionDefinition = {
  summary: "lines, words and bytes of the input, like wc",
  validate(params) {
    const keys = Object.keys(params);
    if (keys.length > 0) throw new Error(`count takes no parameters, got "${keys[0]}"`);
  },
  async run(_params, input, signal) {
    let lines = 0;
    let words = 0;
    let inWord = false;
    for (let offset = 0; offset < input.length; offset += slice) {
      signal.throwIfAborted();
      const end = Math.min(input.length, offset + slice);
      for (let i = offset; i < end; i++) {
        const c = input[i]!;
        if (c === 0x0a) lines += 1;
        const space = c === 0x20 || (c >= 0x09 && c <= 0x0d);
        if (!space && !inWord) words += 1;
        inWord = !space;
      }
      if (end < input.length) await yieldToLoop();
    }
    return Buffer.from(`${lines} ${words} ${input.length}\n`);
  },
};

/** A registry with the built-in actions: checksum and count. */
export function createDefaultActions(): LocalActionRegistry {
  return new LocalActionRegistry().register("checksum", checksumAction).register("count", countAction);
}
