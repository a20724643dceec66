/** What the Hello broadcast needs from the server around it. */
export interface HelloAudience {
  /** How many streams a broadcast goes to. */
  streams(): number;
  /** Sends the shared Hello to every stream that has not seen the latest version. */
  broadcast(): void;
  /** No broadcast is scheduled once the server has stopped. */
  stopped(): boolean;
}

export interface HelloBroadcastOptions {
  /** How long Hello changes are gathered before one broadcast (default 100 ms). */
  readonly coalesceMs?: number;
  /** HELLO frames per second a run of changes may cost at most (default 2,000). */
  readonly framesPerSecond?: number;
}

/**
 * The Hello content version and its coalesced broadcast.
 *
 * Hello content changed (clients, draining): one coalesced broadcast per window, and only
 * to peers that have not seen the latest version, so N connects cost O(N) frames per
 * window. A broadcast to every stream costs O(streams), so the window grows with them: a
 * storm of joins at 10,000 streams would otherwise send 100,000 frames a second and starve
 * the grants (bench/connections). A newcomer's own HELLO still goes out at once, and a
 * drain is announced at once (flush).
 */
export class HelloBroadcast {
  private versionValue = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly audience: HelloAudience,
    private readonly options: HelloBroadcastOptions = {},
  ) {}

  /** The current Hello content version. */
  get version(): number {
    return this.versionValue;
  }

  /** The content changed: bump the version and schedule a broadcast if none is. */
  changed(): void {
    this.versionValue++;
    if (this.timer || this.audience.stopped()) return;
    this.timer = setTimeout(() => this.flush(), this.windowMs());
  }

  /** How long Hello changes are gathered before the next broadcast. */
  windowMs(): number {
    const floor = this.options.coalesceMs ?? 100;
    const budget = this.options.framesPerSecond ?? 2_000;
    return Math.max(floor, Math.ceil((this.audience.streams() / budget) * 1000));
  }

  /** Broadcasts now, instead of at the end of the window. */
  flush(): void {
    this.cancel();
    if (this.audience.streams() === 0) return;
    this.audience.broadcast();
  }

  /** Drops a scheduled broadcast. */
  cancel(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
