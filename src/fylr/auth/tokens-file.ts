import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { describeIssues } from "../../shared/config-parsing.js";
import { ConfigError } from "../../shared/errors.js";
import { silentLogger, type Logger } from "../../shared/log.js";
import type { ApiAuthConfig } from "./config.js";
import { tokenEntrySchema } from "./config.js";
import { TokenSet, type TokenEntry } from "./token-set.js";

const tokensFileSchema = z.strictObject({ tokens: z.array(tokenEntrySchema) });

// A tokens file is a handful of lines; anything this big is the wrong file.
const MAX_FILE_BYTES = 1024 * 1024;

/** The entries of a tokens file's text; throws an Error naming the bad key. Pure. */
export function parseTokensFile(text: string): TokenEntry[] {
  let raw: unknown;
  try {
    raw = parseYaml(text) ?? {};
  } catch (err) {
    throw new Error(`invalid YAML: ${(err as Error).message}`);
  }
  const result = tokensFileSchema.safeParse(raw);
  if (!result.success) throw new Error(describeIssues(result.error.issues));
  return result.data.tokens;
}

/** What a reload did. */
export type ReloadOutcome =
  | { readonly outcome: "unchanged" | "replaced"; readonly tokens: number }
  | { readonly outcome: "failed"; readonly error: string; readonly tokens: number };

/**
 * The API tokens: those of the config plus those of `auth.tokensFile`, which is read again
 * every `reloadInterval` (and on reload(), e.g. from SIGHUP) and replaces the set when its
 * content changed. A file that cannot be read or is invalid keeps the tokens loaded before
 * and is logged as an error; only at start is it fatal.
 */
export class ApiTokens {
  private current: TokenSet;
  private lastDigest: string | undefined;
  private lastFailure: string | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<ReloadOutcome> | undefined;
  private readonly log: Logger;

  private constructor(
    private readonly config: ApiAuthConfig,
    private readonly apply: (tokens: TokenSet) => void,
    logger: Logger,
  ) {
    this.log = logger.child({ component: "api-tokens" });
    this.current = new TokenSet(config.tokens);
  }

  /**
   * Loads the tokens (the file too) and hands them to `apply`; then re-reads the file every
   * reloadInterval. Throws ConfigError naming auth.tokensFile when the file is unusable.
   */
  static async start(config: ApiAuthConfig, apply: (tokens: TokenSet) => void, logger: Logger = silentLogger): Promise<ApiTokens> {
    const tokens = new ApiTokens(config, apply, logger);
    if (config.tokensFile !== undefined) {
      const first = await tokens.reload();
      if (first.outcome === "failed") throw new ConfigError(`auth.tokensFile: ${first.error}`);
      if (config.reloadIntervalMs > 0) {
        tokens.timer = setInterval(() => void tokens.reload(), config.reloadIntervalMs);
        tokens.timer.unref();
      }
    }
    apply(tokens.current);
    return tokens;
  }

  /** The tokens in force. */
  get set(): TokenSet {
    return this.current;
  }

  /** Reads the tokens file again now; one reload at a time (a second call joins the first). */
  reload(): Promise<ReloadOutcome> {
    this.running ??= this.readFile().finally(() => (this.running = undefined));
    return this.running;
  }

  /** Stops re-reading. Idempotent. */
  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  private async readFile(): Promise<ReloadOutcome> {
    const path = this.config.tokensFile;
    if (path === undefined) return { outcome: "unchanged", tokens: this.current.size };
    let bytes: Buffer;
    try {
      bytes = await readFile(path);
    } catch (err) {
      return this.refused(path, `cannot read it: ${(err as Error).message}`, undefined);
    }
    if (bytes.length > MAX_FILE_BYTES) return this.refused(path, `${bytes.length} bytes; a tokens file has at most ${MAX_FILE_BYTES}`, undefined);
    const digest = createHash("sha256").update(bytes).digest("hex");
    if (digest === this.lastDigest) return { outcome: "unchanged", tokens: this.current.size };
    let next: TokenSet;
    try {
      next = new TokenSet([...this.config.tokens, ...parseTokensFile(bytes.toString("utf8"))]);
    } catch (err) {
      return this.refused(path, (err as Error).message, digest);
    }
    const before = new Set(this.current.names());
    const after = next.names();
    this.current = next;
    this.lastDigest = digest;
    this.lastFailure = undefined;
    this.apply(next);
    this.log.info(
      { file: path, tokens: next.size, added: after.filter((n) => !before.has(n)), removed: [...before].filter((n) => !after.includes(n)) },
      "api tokens loaded",
    );
    return { outcome: "replaced", tokens: next.size };
  }

  // The same broken content (or the same read error) is logged once, not every interval.
  private refused(path: string, message: string, digest: string | undefined): ReloadOutcome {
    const error = `${path}: ${message}`;
    const key = digest ?? error;
    if (key !== this.lastFailure) {
      this.lastFailure = key;
      this.log.error({ file: path, err: error, tokens: this.current.size }, "api tokens file refused; the tokens loaded before stay in force");
    }
    return { outcome: "failed", error, tokens: this.current.size };
  }
}
