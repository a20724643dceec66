import { parseArgs } from "node:util";
import { ensureDatabase, migrate } from "../dispatcher/index.js";
import { SlotbrokerError } from "../shared/errors.js";
import { createLogger } from "../shared/log.js";

const help = `usage: slotbroker migrate [--database-url URL]

Applies pending schema migrations (the queue tables of the dispatcher) and exits.
Safe to run while fylrs are starting: all of them take the same advisory lock, and a
migration that is already applied is skipped. A missing database is created first when the
role may create databases. A fylr does both at start-up.

options:
  --database-url URL   PostgreSQL URL (default: the DATABASE_URL environment variable)
  -h, --help           this text

Prints one line on stdout: "schema version N (applied: …)".`;

/** `slotbroker migrate [--database-url URL]`: resolves with the exit code. */
export async function run(argv: string[]): Promise<number> {
  let url: string | undefined;
  try {
    const { values } = parseArgs({
      args: argv,
      options: { "database-url": { type: "string" }, help: { type: "boolean", short: "h" } },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(`${help}\n`);
      return 0;
    }
    url = values["database-url"] ?? process.env.DATABASE_URL;
  } catch (err) {
    process.stderr.write(`slotbroker migrate: ${(err as Error).message}\n\n${help}\n`);
    return 2;
  }
  if (!url) {
    process.stderr.write(`slotbroker migrate: no database: pass --database-url URL or set DATABASE_URL\n`);
    return 2;
  }
  const logger = createLogger();
  try {
    if ((await ensureDatabase(url, { logger })) === "created") process.stdout.write(`created database ${new URL(url).pathname.slice(1)}\n`);
    const report = await migrate(url, { logger });
    const applied = report.applied.length > 0 ? report.applied.join(", ") : "none";
    process.stdout.write(`schema version ${report.version} (applied: ${applied})\n`);
    return 0;
  } catch (err) {
    process.stderr.write(`slotbroker migrate: ${SlotbrokerError.from(err).message}\n`);
    return 1;
  } finally {
    logger.flush();
  }
}
