import { create } from "@bufbuild/protobuf";
import {
  ConnectResponseSchema,
  DoneSchema,
  ErrorKind,
  ReceiptSchema,
  type Receipt,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason } from "../shared/abort.js";
import { LogBudget, type Logger } from "../shared/log.js";
import { durationFromMs } from "../shared/proto-time.js";
import type { Broker, BrokerEffects, JobRecord, OfferOutcome } from "./broker.js";
import type { BuiltinService } from "./config.js";
import type { CheckedJob } from "./limits.js";
import type { ExecserverMetrics } from "./metrics.js";
import { runJob as defaultRunJob, type RunJob } from "./runner/index.js";
import { OfferEncoder } from "./wire.js";

/** Options of the I/O side of the broker. */
export interface EffectsOptions {
  readonly instanceId: string;
  readonly offerTimeoutMs: number;
  readonly logger: Logger;
  /** Runs command services; default: the process runner in ./runner. */
  readonly runJob: RunJob | undefined;
  /** Monotonic ms clock. */
  readonly now: () => number;
  /** Called after each finished job (drain waits on it). */
  readonly jobFinished: () => void;
}

/**
 * The Broker's hands: sends OFFER/DONE frames, keeps the one timer that drives offer
 * expiry, starts jobs (runner or built-in) and turns their receipts into finish() + DONE.
 * The OFFER is written before any bookkeeping, so metrics never sit on the grant path.
 */
export class BrokerIo implements BrokerEffects {
  private broker: Broker | undefined;
  private metrics: ExecserverMetrics | undefined;
  private readonly offers: OfferEncoder;
  private expiryTimer: NodeJS.Timeout | undefined;
  private expiryAt = Infinity;
  private readonly failureLog = new LogBudget(50, 10_000);
  private readonly expiryLog = new LogBudget(10, 10_000);

  constructor(private readonly options: EffectsOptions) {
    this.offers = new OfferEncoder(options.offerTimeoutMs);
  }

  /** Connects the broker these effects serve and its metrics (both are made after this). */
  attach(broker: Broker, metrics: ExecserverMetrics): void {
    this.broker = broker;
    this.metrics = metrics;
  }

  /** @inheritdoc */
  offered(record: JobRecord): void {
    record.connection.sink.send(this.offers.encode(record.jobId, record.offerToken, record.group.name));
    this.metrics!.granted(record.group.name, (this.options.now() - record.wantedAt) / 1000);
    if (record.expiresAt < this.expiryAt) this.armExpiry(record.expiresAt);
  }

  /** @inheritdoc */
  offerEnded(record: JobRecord, outcome: OfferOutcome): void {
    this.metrics!.offerEnded(outcome);
    if (outcome !== "expired") return;
    const left = this.expiryLog.take();
    if (left !== undefined) {
      this.options.logger.info(
        { jobId: record.jobId, conn: record.connection.id, waitgroup: record.group.name, notLogged: left || undefined },
        "offer expired unanswered; the slot goes to the next want",
      );
    }
  }

  /** Stops the expiry timer (server shutdown). */
  stop(): void {
    clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    this.expiryAt = Infinity;
  }

  // One timer for all offers, armed for the oldest; when it fires, everything due expires
  // and it is re-armed for the next. An offer accepted meanwhile costs nothing here.
  private armExpiry(at: number): void {
    clearTimeout(this.expiryTimer);
    this.expiryAt = at;
    this.expiryTimer = setTimeout(() => {
      this.expiryTimer = undefined;
      this.expiryAt = Infinity;
      this.guard("offer expiry", () => this.broker!.expireDue());
      // The head of the expiry list is the earliest; offers made during expireDue() may
      // have armed a later one.
      const next = this.broker!.nextExpiry();
      if (next !== undefined && next < this.expiryAt) this.armExpiry(next);
    }, Math.max(0, at - this.options.now()) + 1);
  }

  /** @inheritdoc */
  start(record: JobRecord, job: CheckedJob): void {
    const service = record.service;
    if (service.kind === "builtin") {
      // Built-ins finish at once and cannot be cancelled: no controller, no promise chain.
      queueMicrotask(() => this.guard("job finish", () => this.finished(record, builtins[service.builtin]())));
      return;
    }
    const controller = new AbortController();
    record.handle = controller;
    const run = this.options.runJob ?? defaultRunJob;
    run({
      command: service.command,
      args: job.args,
      env: job.env,
      timeoutMs: job.timeoutMs,
      stdinUrl: job.stdinUrl,
      stdoutUrl: job.stdoutUrl,
      signal: controller.signal,
    })
      .catch((err: unknown) => failedReceipt(ErrorKind.SPAWN_FAILED, `runner failed: ${(err as Error)?.message ?? String(err)}`))
      .then((receipt) => this.guard("job finish", () => this.finished(record, receipt)))
      .catch(() => undefined);
  }

  /** @inheritdoc */
  cancel(record: JobRecord): void {
    (record.handle as AbortController | undefined)?.abort(new AbortReason("disconnected", "the connection that started the job is gone"));
  }

  /** Aborts a running job because the server gives up on it (drain timeout). */
  abortForShutdown(record: JobRecord): void {
    (record.handle as AbortController | undefined)?.abort(new AbortReason("shutdown", "execserver shut down before the job finished"));
  }

  private finished(record: JobRecord, receipt: Receipt): void {
    this.logOutcome(record, receipt);
    this.broker!.finish(record);
    this.metrics!.jobDone(record.group.name);
    receipt.instanceId = this.options.instanceId;
    if (record.connection.state === "open") {
      const value = create(DoneSchema, { jobId: record.jobId, receipt });
      record.connection.sink.send(create(ConnectResponseSchema, { frame: { case: "done", value } }));
    }
    this.options.jobFinished();
  }

  // Failures at warn (timeouts, kills, spawn and pipe errors) or info (a non-zero exit, a
  // job cancelled because its connection went); successes at debug.
  private logOutcome(record: JobRecord, receipt: Receipt): void {
    const failed = receipt.error !== ErrorKind.UNSPECIFIED || (receipt.exitCode ?? 0) !== 0 || receipt.signal !== "";
    const level = !failed ? "debug" : receipt.error === ErrorKind.UNSPECIFIED || receipt.error === ErrorKind.CANCELLED ? "info" : "warn";
    if (!this.options.logger.isLevelEnabled(level)) return;
    const left = failed ? this.failureLog.take() : 0;
    if (left === undefined) return;
    this.options.logger[level](
      {
        jobId: record.jobId,
        service: record.service.name,
        conn: record.connection.id,
        exitCode: receipt.exitCode,
        signal: receipt.signal || undefined,
        error: receipt.error === ErrorKind.UNSPECIFIED ? undefined : ErrorKind[receipt.error],
        message: receipt.errorMessage || undefined,
        stderr: receipt.stderrLine || undefined,
        ms: receipt.duration ? Number(receipt.duration.seconds) * 1000 + Math.round(receipt.duration.nanos / 1e6) : undefined,
        notLogged: left || undefined,
      },
      failed ? "job failed" : "job done",
    );
  }

  private guard(what: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.options.logger.error({ err }, `${what} failed`);
    }
  }
}

/** In-process services: complete at once with a receipt, spawn nothing. */
const builtins: Record<BuiltinService, () => Receipt> = {
  noop: () => create(ReceiptSchema, { exitCode: 0, duration: durationFromMs(0) }),
};

function failedReceipt(error: ErrorKind, message: string): Receipt {
  return create(ReceiptSchema, { error, errorMessage: message, duration: durationFromMs(0) });
}
