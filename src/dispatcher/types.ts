import type { Receipt } from "../../gen/slotbroker/v1/broker_pb.js";

/** Where an item runs: on an execserver through the broker, or inside this fylr. */
export type ItemKind = "exec" | "local";

/** An item's lifecycle in the database (the `queue_items.state` column). */
export type ItemState = "queued" | "claimed" | "running" | "succeeded" | "failed" | "cancelled";

/** Where one exec call's stdin comes from. */
export type StdinSource =
  | { readonly kind: "data"; readonly data: Buffer }
  | { readonly kind: "url"; readonly url: string }
  /** An input uploaded to the store (POST /queue/inputs), by its id. */
  | { readonly kind: "upload"; readonly id: string }
  | { readonly kind: "previous" };

/** One command for an execserver, as submitted. */
export interface ExecCallSpec {
  readonly service: string;
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  /** Job timeout; unset uses the service's own. */
  readonly timeoutMs?: number;
  /** Unset means empty stdin. */
  readonly stdin?: StdinSource;
}

/** A local action, as submitted. */
export interface LocalActionSpec {
  readonly name: string;
  readonly params: Readonly<Record<string, string>>;
  readonly input: Buffer;
}

/** What a caller submits: exactly one of `calls` or `local`. */
export interface SubmitInput {
  readonly calls?: readonly ExecCallSpec[];
  readonly local?: LocalActionSpec;
  /** Larger is more urgent; default 0. */
  readonly priority?: number;
  /** Not claimed before this time; default now. */
  readonly startAfter?: Date;
  /** A repeated submit with the same key returns the first item. */
  readonly idempotencyKey?: string;
  /** Attempts allowed before the item fails; default from config. */
  readonly maxAttempts?: number;
  /** The W3C traceparent of the Submit span, stored so that the claim continues its trace. */
  readonly traceparent?: string;
  /** The fairness key (a tenant, a user); "" or unset is the default key. */
  readonly fairnessKey?: string;
  /** The key's weight in the claim turn; default 1. */
  readonly fairnessWeight?: number;
  /** At most this many items of the key held at once across the fleet; unset: no limit. */
  readonly fairnessLimit?: number;
}

/** The outcome of one exec call: the execserver's receipt. */
export interface CallResult {
  readonly service: string;
  readonly receipt: Receipt;
  /** This fylr's timing of the call, for the item's timeline; absent on results read back. */
  readonly timing?: CallTiming;
}

/** When one call got its slot and ended, by the clock of the fylr that ran it. */
export interface CallTiming {
  /** From the WANT to the slot's grant (the JOB sent). */
  readonly slotWaitMs: number;
  readonly startedAt: Date;
  readonly endedAt: Date;
}

/** A queue item as stored. */
export interface QueueItem {
  readonly id: string;
  readonly kind: ItemKind;
  readonly priority: number;
  readonly state: ItemState;
  /** Exec items: the calls, run in order. */
  readonly calls: readonly ExecCallSpec[];
  /** Local items: the action. */
  readonly local: LocalActionSpec | undefined;
  readonly claimedBy: string | undefined;
  /** Fencing counter, bumped on every claim. */
  readonly lease: number;
  readonly attempts: number;
  readonly maxAttempts: number;
  readonly startAfter: Date;
  readonly createdAt: Date;
  readonly claimedAt: Date | undefined;
  readonly updatedAt: Date;
  readonly finishedAt: Date | undefined;
  /** Receipts of the calls that ran in the latest attempt. */
  readonly results: readonly CallResult[];
  /** The final stdout (exec) or the action's output (local); only its first bytes when `outputBlob` is set. */
  readonly output: Buffer | undefined;
  /** The whole output in the store, when it was too large for the row. */
  readonly outputBlob: string | undefined;
  /** Size of the whole output. */
  readonly outputSize: number | undefined;
  /** SHA-256 of the whole output, hex. */
  readonly outputSha256: string | undefined;
  readonly error: string | undefined;
  readonly idempotencyKey: string | undefined;
  /** When a cancel was asked for while the item was held; undefined otherwise. */
  readonly cancelRequestedAt: Date | undefined;
  /** The fairness key; "" is the default key. */
  readonly fairnessKey: string;
  /** The key's weight in the claim turn (1 by default). */
  readonly fairnessWeight: number;
  /** Items of the key that may be held at once across the fleet; undefined: no limit. */
  readonly fairnessLimit: number | undefined;
  /** The W3C traceparent of its Submit span; undefined when it was submitted untraced. */
  readonly traceparent?: string;
}

/** What happened to an item: one step of its timeline (migration 0009). */
export type ItemEventKind =
  | "submitted"
  | "claimed"
  | "running"
  | "call-started"
  | "call-ended"
  | "requeued"
  | "cancel-requested"
  | "cancelled"
  | "retried"
  | "succeeded"
  | "failed";

/** One event of an item's timeline; fields that do not apply are undefined. */
export interface ItemEvent {
  /** Its number in the item's history, from 1. */
  readonly n: number;
  readonly at: Date;
  readonly kind: ItemEventKind;
  readonly fylr?: string;
  readonly attempt?: number;
  readonly execserver?: string;
  readonly service?: string;
  readonly slotWaitMs?: number;
  readonly durationMs?: number;
  readonly exitCode?: number;
  /** A receipt's ErrorKind name, e.g. ERROR_KIND_TIMEOUT. */
  readonly errorKind?: string;
  readonly detail?: string;
}

/** An item's timeline: its kept events, oldest first, and how many earlier ones were overwritten. */
export interface ItemHistory {
  readonly events: readonly ItemEvent[];
  readonly dropped: number;
}

/** What a claim hands the loop: enough to run the item and to fence its completion. */
export interface ClaimedItem extends QueueItem {
  readonly claimedBy: string;
}

/** The fence a completion must present: only the current claim may write. */
export interface Fence {
  readonly id: string;
  readonly claimedBy: string;
  readonly lease: number;
}
