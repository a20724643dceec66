/** What a dispatcher is built from, what it reports, and how its stop can fail. */
import type pg from "pg";
import { Code, SlotbrokerError } from "../shared/errors.js";
import type { Logger } from "../shared/log.js";
import type { InstanceShare } from "./admission.js";
import type { CapacitySource } from "./capacity.js";
import type { DispatcherConfig } from "./config.js";
import type { DispatcherState } from "./events.js";
import type { ExecBackend } from "./exec-backend.js";
import type { LiveItem } from "./live.js";
import type { LocalActionRegistry } from "./local-actions.js";
import type { DispatcherCounters } from "./settle.js";
import type { StoredPosition } from "./store.js";
import type { StoreConfig } from "./store-config.js";

/** Everything a dispatcher is built from. */
export interface DispatcherOptions {
  readonly pool: pg.Pool;
  readonly capacity: CapacitySource;
  readonly backend: ExecBackend;
  /** Default: the built-in actions (checksum, count). */
  readonly actions?: LocalActionRegistry;
  /** Compiled config; missing keys take the defaults. */
  readonly config?: Partial<DispatcherConfig>;
  /** The store for inputs and outputs of any size; missing keys take the defaults. */
  readonly store?: Partial<StoreConfig>;
  /**
   * Connections for streaming stored data (long transactions); default `pool`. A fylr
   * gives it a pool of its own so uploads never starve heartbeats and claims.
   */
  readonly blobPool?: pg.Pool;
  readonly logger?: Logger;
  /** This fylr's id in the `fylrs` table; default a random UUID. */
  readonly fylrId?: string;
  /** This fylr's QueueService URL, recorded for operators. */
  readonly apiUrl?: string;
  /** Apply pending migrations in start() (default true). */
  readonly migrate?: boolean;
  /** Makes the LISTEN connection's client (default: a pg.Client with the pool's settings). */
  readonly listenClient?: () => pg.Client;
}

/** A snapshot for QueueService.Stats. */
export interface DispatcherStats {
  readonly fylrId: string;
  readonly state: DispatcherState;
  readonly execHeld: number;
  readonly execAdmission: number;
  readonly shares: readonly InstanceShare[];
  readonly localRunning: number;
  readonly localCapacity: number;
  readonly localReservedForHigh: number;
  readonly counters: Readonly<DispatcherCounters>;
}

/** An item's place in line as this fylr knows it: the database's count plus its own live view. */
export interface ItemPosition extends StoredPosition {
  /** Present while this fylr holds the item. */
  readonly live: LiveItem | undefined;
}

/** Running items did not end within the force timeout after being aborted. */
export class DispatcherStopTimeoutError extends SlotbrokerError {
  override name = "DispatcherStopTimeoutError";
  constructor(left: number, waitedMs: number) {
    super(Code.DeadlineExceeded, `${left} item task(s) still running ${waitedMs} ms after being aborted`);
  }
}
