import type { Position } from "../../../gen/slotbroker/v1/broker_pb.js";
import type { BrokerConnection } from "./connection.js";
import type { PolledSlot } from "./polled-slot.js";
import type { Slot } from "./slot.js";
import { WantRace } from "./want-race.js";

/** A slot won either way: a broker OFFER, or a token from an address that is polled. */
export type AcquiredSlot = Slot | PolledSlot;

/** One acquisition: the pure race bookkeeping plus the promise and timers around it. */
export class Acquisition extends WantRace<BrokerConnection> {
  timer: NodeJS.Timeout | undefined;
  positionTimer: NodeJS.Timeout | undefined;
  /** The next round of GET /token while some address is polled. */
  pollTimer: NodeJS.Timeout | undefined;
  /** True while a polling round is scheduled or running. */
  polling = false;
  detach: (() => void) | undefined;
  constructor(
    jobId: string,
    service: string,
    priority: number,
    /** Want.fairness_key: "" is the default key. */
    readonly fairnessKey: string,
    /** Want.fairness_weight: grants per turn of the key. */
    readonly fairnessWeight: number,
    readonly resolve: (slot: AcquiredSlot) => void,
    readonly reject: (err: Error) => void,
    readonly onPosition: ((position: Position, instanceId: string) => void) | undefined,
  ) {
    super(jobId, service, priority, Date.now());
  }
  clearTimers(): void {
    clearTimeout(this.timer);
    clearInterval(this.positionTimer);
    clearTimeout(this.pollTimer);
    this.detach?.();
  }
}

