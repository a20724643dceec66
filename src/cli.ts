#!/usr/bin/env node
import { SlotbrokerError } from "./shared/errors.js";

/** A subcommand: parses its own argv and resolves with the process exit code. */
export type Command = (argv: string[]) => Promise<number>;

// Each subcommand lives in src/commands/<name>.ts and is loaded only when run.
const commands: Record<string, { summary: string; load: () => Promise<Command> }> = {
  execserver: { summary: "run an execserver (slots, want-book, jobs)", load: async () => (await import("./commands/execserver.js")).run },
  fylr: { summary: "run a fylr (queue dispatcher, QueueService, pipes)", load: async () => (await import("./commands/fylr.js")).run },
  up: { summary: "run the whole local stack (Postgres, execserver, fylr)", load: async () => (await import("./commands/up.js")).run },
  submit: { summary: "submit an item to the queue (and wait for it)", load: async () => (await import("./commands/submit.js")).run },
  output: { summary: "fetch the whole output of a finished item", load: async () => (await import("./commands/output.js")).run },
  cancel: { summary: "stop queued, claimed or running items", load: async () => (await import("./commands/control.js")).cancel },
  show: { summary: "show an item and its timeline: every step, with durations", load: async () => (await import("./commands/show.js")).run },
  list: { summary: "list queue items, newest first (filter by state, service)", load: async () => (await import("./commands/list.js")).run },
  retry: { summary: "send failed or cancelled items back to the queue", load: async () => (await import("./commands/control.js")).retry },
  delete: { summary: "remove finished items and their stored data", load: async () => (await import("./commands/control.js")).remove },
  status: { summary: "show execserver slots, want-books and the queue", load: async () => (await import("./commands/status.js")).run },
  migrate: { summary: "apply pending database migrations", load: async () => (await import("./commands/migrate.js")).run },
};

function usage(): string {
  const lines = Object.entries(commands).map(([name, c]) => `  ${name.padEnd(11)} ${c.summary}`);
  return `usage: slotbroker <command> [options]\n\ncommands:\n${lines.join("\n")}\n\nRun "slotbroker <command> --help" for a command's options.`;
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(`${usage()}\n`);
    return name ? 0 : 2;
  }
  const command = commands[name];
  if (!command) {
    process.stderr.write(`slotbroker: unknown command "${name}"\n\n${usage()}\n`);
    return 2;
  }
  return (await command.load())(rest);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    const e = SlotbrokerError.from(err);
    process.stderr.write(`slotbroker: ${e.message}\n`);
    process.exitCode = 1;
  },
);
