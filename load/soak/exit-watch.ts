// Sees every job end, even one killed by SIGKILL (which runs no trap and writes no "end"
// line): it follows the ledger's "start" lines and polls each started pid in /proc until
// it is gone or a zombie. Its "gone" records say by when an execution had ended at the
// latest; the start time in /proc/PID/stat tells a reused pid from the job.
import { closeSync, openSync, readFileSync, readSync } from "node:fs";

/** When the watcher saw a job's process gone (ms since epoch), by "TAG PID". */
export type GoneTimes = ReadonlyMap<string, number>;

interface Watched {
  readonly key: string;
  readonly pid: number;
  /** /proc/PID/stat field 22 when first seen; undefined when it was already gone. */
  readonly startTicks: string | undefined;
}

/** The pid's start time in clock ticks, or undefined when it is gone or a zombie. */
function liveStartTicks(pid: number): string | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // "PID (COMM) STATE ..." — COMM may contain spaces, so split after the last ")".
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  if (fields[0] === "Z" || fields[0] === "X") return undefined;
  return fields[19];
}

export class ExitWatcher {
  readonly #gone = new Map<string, number>();
  readonly #watching = new Map<string, Watched>();
  readonly #fd: number;
  readonly #buf = Buffer.alloc(1 << 16);
  #offset = 0;
  #partial = "";
  #timer: NodeJS.Timeout | undefined;

  constructor(ledgerPath: string, private readonly intervalMs = 100) {
    this.#fd = openSync(ledgerPath, "r");
  }

  start(): void {
    this.#timer = setInterval(() => this.poll(), this.intervalMs);
    this.#timer.unref();
  }

  /** Reads new ledger lines, then checks every watched pid once. */
  poll(): void {
    for (;;) {
      const n = readSync(this.#fd, this.#buf, 0, this.#buf.length, this.#offset);
      if (n <= 0) break;
      this.#offset += n;
      const lines = (this.#partial + this.#buf.toString("utf8", 0, n)).split("\n");
      this.#partial = lines.pop()!;
      for (const line of lines) this.#onLine(line);
    }
    const now = Date.now();
    for (const w of this.#watching.values()) {
      if (w.startTicks !== undefined && liveStartTicks(w.pid) === w.startTicks) continue;
      this.#gone.set(w.key, now);
      this.#watching.delete(w.key);
    }
  }

  /** Stops polling after one last look; returns pid → when it was seen gone. */
  stop(): GoneTimes {
    clearInterval(this.#timer);
    this.poll();
    closeSync(this.#fd);
    return this.#gone;
  }

  #onLine(line: string): void {
    const f = line.split(" ");
    const pid = Number(f[2]);
    if (!Number.isInteger(pid) || pid <= 0) return;
    const key = `${f[1]} ${pid}`;
    if (f[0] === "start") this.#watching.set(key, { key, pid, startTicks: liveStartTicks(pid) });
    // The job wrote its own end; the pid may be reused from here on.
    else if (f[0] === "end") this.#watching.delete(key);
  }
}
