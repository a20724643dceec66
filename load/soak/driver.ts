// The chaos driver: every few hundred milliseconds one random fault on the soak's fleet —
// SIGKILL and restart, SIGSTOP then SIGCONT (fylrs and execservers), a Postgres restart,
// broker connections severed or frozen at the chaos proxies. Every fault is logged with its
// time, so the checker can tell which extra executions a fault explains.
import type { Fleet, ServerProcess } from "./fleet.js";

/** One fault the driver injected. */
export interface FaultEvent {
  readonly at: number;
  readonly until: number;
  readonly kind: string;
  readonly target: string;
  /** pid of the process hit, when it was one. */
  readonly pid?: number;
}

export interface DriverOptions {
  readonly rand: () => number;
  /** Mean pause between faults. */
  readonly meanGapMs: number;
  /** Postgres restarts at most this often. */
  readonly postgresEveryMs: number;
  readonly log: (line: string) => void;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export class ChaosDriver {
  readonly events: FaultEvent[] = [];
  private stopped = false;
  private running: Promise<void> | undefined;
  private lastPostgres = Date.now();

  constructor(
    private readonly fleet: Fleet,
    private readonly o: DriverOptions,
  ) {}

  start(): void {
    this.running = this.loop();
  }

  /** Stops injecting and waits until the current fault is healed (everything running). */
  async stop(): Promise<void> {
    this.stopped = true;
    await this.running;
  }

  /** Faults by kind, for the report. */
  counts(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const e of this.events) out[e.kind] = (out[e.kind] ?? 0) + 1;
    return out;
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      await sleep(this.o.meanGapMs * (0.5 + this.o.rand()));
      if (this.stopped) break;
      try {
        await this.restartCrashed();
        await this.one();
      } catch (err) {
        this.o.log(`chaos: a fault failed to apply or heal: ${(err as Error).message}`);
        await this.healAll();
      }
    }
    await this.healAll();
  }

  private pick<T>(list: readonly T[]): T {
    return list[Math.floor(this.o.rand() * list.length)]!;
  }

  private async one(): Promise<void> {
    const r = this.o.rand();
    const { fleet } = this;
    if (Date.now() - this.lastPostgres >= this.o.postgresEveryMs) return this.restartPostgres();
    if (r < 0.2) return this.crash("kill-fylr", this.pick(fleet.fylrs), 300 + this.o.rand() * 1500);
    if (r < 0.35) return this.freeze("stop-fylr", this.pick(fleet.fylrs), 500 + this.o.rand() * 6000);
    if (r < 0.5) return this.crash("kill-execserver", this.pick(fleet.execservers), 300 + this.o.rand() * 1500);
    if (r < 0.6) return this.freeze("stop-execserver", this.pick(fleet.execservers), 500 + this.o.rand() * 4000);
    const i = Math.floor(this.o.rand() * fleet.proxies.length);
    const proxy = fleet.proxies[i]!;
    if (r < 0.8) {
      const at = Date.now();
      const n = proxy.sever();
      this.record({ at, until: at, kind: "sever-broker", target: `proxy-${i} (${n} connections)` });
      return;
    }
    const at = Date.now();
    proxy.freeze();
    await sleep(500 + this.o.rand() * 4000);
    proxy.thaw();
    this.record({ at, until: Date.now(), kind: "freeze-broker", target: `proxy-${i}` });
  }

  private async crash(kind: string, p: ServerProcess, downMs: number): Promise<void> {
    const at = Date.now();
    const pid = p.pid;
    await p.kill("SIGKILL");
    await sleep(downMs);
    await p.start();
    this.record({ at, until: Date.now(), kind, target: p.name, pid });
  }

  private async freeze(kind: string, p: ServerProcess, forMs: number): Promise<void> {
    const at = Date.now();
    const pid = p.pid;
    p.signal("SIGSTOP");
    await sleep(forMs);
    p.signal("SIGCONT");
    this.record({ at, until: Date.now(), kind, target: p.name, pid });
  }

  private async restartPostgres(): Promise<void> {
    const at = Date.now();
    this.lastPostgres = at;
    await this.fleet.restartPostgres(500 + this.o.rand() * 3000);
    this.record({ at, until: Date.now(), kind: "restart-postgres", target: "postgres" });
  }

  // A process that died on its own (a crash the soak did not cause) is started again, and
  // the checker reports the crash.
  private async restartCrashed(): Promise<void> {
    for (const p of [...this.fleet.fylrs, ...this.fleet.execservers]) {
      if (p.alive) continue;
      const crash = p.crashes.at(-1);
      this.o.log(`chaos: ${p.name} died on its own (${crash?.how ?? "?"}); starting it again`);
      await p.start();
    }
  }

  private record(e: FaultEvent): void {
    this.events.push(e);
    this.o.log(`chaos: ${e.kind} ${e.target} ${e.until - e.at} ms`);
  }

  // After a failed fault or at the end: everything thawed and running again.
  private async healAll(): Promise<void> {
    for (const proxy of this.fleet.proxies) proxy.thaw();
    for (const p of [...this.fleet.fylrs, ...this.fleet.execservers]) {
      p.signal("SIGCONT");
      if (!p.alive) await p.start();
    }
  }
}
