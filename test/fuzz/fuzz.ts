// Seeded fuzzing helpers: a seed from FUZZ_SEED or random, printed on failure; byte and
// JSON mutators. Bounded by count, so a run's duration is predictable.
import { prng } from "../../harness/prng.js";

/** A fuzzing source: the seed and random choices derived from it. */
export class Fuzz {
  readonly rand: () => number;
  constructor(readonly seed: number) {
    this.rand = prng(seed);
  }

  /** FUZZ_SEED when set (to replay a failure), else a fresh one. */
  static fromEnv(): Fuzz {
    const env = process.env.FUZZ_SEED;
    return new Fuzz(env ? Number(env) : Math.floor(Math.random() * 2 ** 31));
  }

  int(max: number): number {
    return Math.floor(this.rand() * max);
  }

  pick<T>(list: readonly T[]): T {
    return list[this.int(list.length)]!;
  }

  bytes(n: number): Buffer {
    const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }

  /** A mutation of `input`: bit flips, truncation, inserted or repeated bytes, or garbage. */
  mutate(input: Uint8Array): Buffer {
    let b: Buffer = Buffer.from(input);
    const rounds = 1 + this.int(4);
    for (let r = 0; r < rounds; r++) {
      const at = b.length === 0 ? 0 : this.int(b.length);
      switch (this.int(7)) {
        case 0:
          if (b.length) b[at] = b[at]! ^ (1 << this.int(8));
          break;
        case 1:
          b = b.subarray(0, at);
          break;
        case 2:
          b = Buffer.concat([b.subarray(0, at), this.bytes(1 + this.int(16)), b.subarray(at)]);
          break;
        case 3:
          b = Buffer.concat([b, b.subarray(at)]);
          break;
        case 4:
          if (b.length) b[at] = this.pick([0x00, 0xff, 0x7f, 0x80, 0x0a, 0x12, 0x1a]);
          break;
        case 5:
          b = Buffer.concat([b.subarray(0, at), Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f]), b.subarray(at)]);
          break;
        default:
          b = this.bytes(this.int(64));
      }
    }
    return b;
  }

  /** A random JSON value, up to `depth` levels deep. */
  json(depth = 3): unknown {
    const k = this.int(depth > 0 ? 9 : 6);
    switch (k) {
      case 0:
        return null;
      case 1:
        return this.rand() < 0.5;
      case 2:
        return this.pick([0, -1, 1.5, 2 ** 31, -(2 ** 31) - 1, 2 ** 64, 1e308, Number.MAX_SAFE_INTEGER]);
      case 3:
        return this.string();
      case 4:
        return this.pick(["", "0", "-1", "1e3", "NaN", "Infinity", "true", "null", "3s", "-5s", "99999999999s"]);
      case 5:
        return this.int(1000);
      case 6:
      case 7:
        return Object.fromEntries(Array.from({ length: this.int(5) }, () => [this.pick([this.string(), ...fieldNames]), this.json(depth - 1)]));
      default:
        return Array.from({ length: this.int(5) }, () => this.json(depth - 1));
    }
  }

  /** A short string with some awkward characters (NUL, surrogates, long runs). */
  string(): string {
    const parts = ["a", "é", "\u0000", "\ud800", "😀", "\n", "\"", "\\", "/", "%", "x".repeat(this.int(2000))];
    return Array.from({ length: this.int(6) }, () => this.pick(parts)).join("");
  }

  /** Replaces a random node of a JSON value with random JSON. */
  mutateJson(value: unknown, depth = 0): unknown {
    if (this.rand() < 0.25 || depth > 4) return this.json(2);
    if (Array.isArray(value)) {
      if (value.length === 0) return [this.json(2)];
      const copy: unknown[] = [...(value as unknown[])];
      const i = this.int(copy.length);
      copy[i] = this.mutateJson(copy[i], depth + 1);
      return copy;
    }
    if (value && typeof value === "object") {
      const copy: Record<string, unknown> = { ...(value as Record<string, unknown>) };
      const keys = Object.keys(copy);
      if (keys.length === 0 || this.rand() < 0.2) copy[this.pick(fieldNames)] = this.json(2);
      else {
        const key = this.pick(keys);
        if (this.rand() < 0.2) delete copy[key];
        else copy[key] = this.mutateJson(copy[key], depth + 1);
      }
      return copy;
    }
    return this.json(2);
  }
}

// Field names of the public messages, so random objects often hit a real field.
const fieldNames = [
  "calls", "service", "args", "stdinData", "stdinUrl", "stdinFromPrevious", "stdinUpload", "env", "timeout",
  "local", "name", "params", "input", "priority", "startAfter", "idempotencyKey", "maxAttempts", "id",
];

/** Runs `body`; on failure, rethrows with the seed so the run can be replayed. */
export async function withSeed(fuzz: Fuzz, body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (err) {
    const e = err as Error;
    e.message = `${e.message}\n(fuzz seed ${fuzz.seed}: replay with FUZZ_SEED=${fuzz.seed})`;
    throw e;
  }
}
