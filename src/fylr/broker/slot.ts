import { create } from "@bufbuild/protobuf";
import { ReceiptSchema, type JobSpec, type Offer, type Receipt } from "../../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason, onAbort } from "../../shared/abort.js";
import { Code, SlotbrokerError } from "../../shared/errors.js";
import { Transitions } from "../../shared/lifecycle.js";
import type { BrokerConnection } from "./connection.js";
import { ConnectionLostError } from "./errors.js";
import type { LocalAddress } from "./local-address.js";
import type { RunningJobs } from "./running-jobs.js";
import { durationMs } from "@bufbuild/protobuf/wkt";

/** A won slot's lifecycle: offered until JOB or DECLINE is sent. */
export type SlotState = "offered" | "started" | "declined";

const transitions = new Transitions<SlotState>("slot", { offered: ["started", "declined"], started: [], declined: [] });

/**
 * A slot offered to this fylr: the winning OFFER and the connection it came on. Send the
 * job with `start` (before the offer expires) or give it back with `decline`.
 */
export class Slot {
  /** Tells this slot from a PolledSlot (the token protocol). */
  readonly transport = "broker" as const;
  readonly jobId: string;
  readonly service: string;
  readonly connection: BrokerConnection;
  readonly offer: Offer;
  /** The instance that offered the slot (and will run the job). */
  readonly instanceId: string;
  /** When the offer lapses (Date.now() based); JOB after that is rejected STALE_OFFER. */
  readonly expiresAt: number;
  private current: SlotState = "offered";
  private readonly jobs: RunningJobs;

  constructor(
    service: string,
    connection: BrokerConnection,
    offer: Offer,
    jobs: RunningJobs,
    now = Date.now(),
    /** After CANCEL for the running job, how long its DONE is waited for. */
    private readonly cancelWaitMs = 10_000,
  ) {
    this.jobId = offer.jobId;
    this.service = service;
    this.connection = connection;
    this.offer = offer;
    this.instanceId = connection.hello?.instanceId ?? "";
    this.expiresAt = now + ((offer.expiresIn && durationMs(offer.expiresIn)) ?? 5_000);
    this.jobs = jobs;
  }

  /** offered, started or declined. */
  get state(): SlotState {
    return this.current;
  }

  /** The address configured for the connection's pool. */
  get address(): string {
    return this.connection.address;
  }

  /** The waitgroup whose slot this is. */
  get waitgroup(): string {
    return this.offer.waitgroup;
  }

  /**
   * True when the execserver understands JobSpec.stdin_inline (its HELLO lists
   * "stdin-inline"); an older one would run the job with empty stdin instead.
   */
  get inlinesStdin(): boolean {
    return this.connection.inlinesStdin;
  }

  /** This fylr's address on the connection that will run the job (for pinned pipe URLs). */
  localAddress(): Promise<LocalAddress | undefined> {
    return this.connection.localAddress();
  }

  /**
   * Sends JOB and resolves with the receipt from DONE. Rejects with ConnectionLostError when
   * the connection drops first, JobRejectedError when the execserver refuses the job, or
   * the signal's reason when `signal` aborts. An abort sends CANCEL (the execserver stops the
   * job's processes); when its reason is an AbortReason of kind "cancel-requested", the DONE
   * that follows is still waited for, up to cancelWaitMs, and resolves with its receipt
   * (error CANCEL_REQUESTED); otherwise the DONE is ignored.
   */
  start(spec: JobSpec, signal?: AbortSignal, traceparent?: string): Promise<Receipt> {
    this.setState("started");
    if (signal?.aborted) {
      this.connection.decline(this.offer);
      return Promise.reject(signal.reason as Error);
    }
    const receipt = this.jobs.track(this.jobId, this.connection, this.instanceId);
    if (!this.connection.accept(this.offer, spec, traceparent)) {
      const err = new ConnectionLostError(this.jobId, this.instanceId, this.address, this.connection.lastError);
      this.jobs.forget(this.connection, this.jobId, err);
      return receipt;
    }
    if (!signal) return receipt;
    let waitTimer: NodeJS.Timeout | undefined;
    const detach = onAbort(signal, () => {
      const reason = signal.reason as Error;
      const sent = this.connection.cancel(this.jobId);
      if (sent && reason instanceof AbortReason && reason.kind === "cancel-requested") {
        waitTimer = setTimeout(() => this.jobs.forget(this.connection, this.jobId, reason), this.cancelWaitMs);
        return;
      }
      this.jobs.forget(this.connection, this.jobId, reason);
    });
    const cleanup = (): void => {
      clearTimeout(waitTimer);
      detach();
    };
    receipt.then(cleanup, cleanup);
    return receipt;
  }

  /** Gives the slot back at once (DECLINE). */
  decline(): void {
    if (this.current !== "offered") return;
    this.setState("declined");
    this.connection.decline(this.offer);
  }

  private setState(next: SlotState): void {
    this.current = transitions.check(this.current, next);
  }
}

/** An empty receipt, for a DONE that carried none. */
export function emptyReceipt(): Receipt {
  return create(ReceiptSchema, {});
}

/** The slot as a broker Slot; throws for a slot won by polling (for callers that only dial brokers). */
export function brokerSlot(slot: Slot | { readonly transport: "polling"; readonly jobId: string; readonly address: string }): Slot {
  if (slot.transport === "broker") return slot;
  throw new SlotbrokerError(Code.FailedPrecondition, `job ${slot.jobId}: the slot came from polling ${slot.address}, not from a broker offer`);
}
