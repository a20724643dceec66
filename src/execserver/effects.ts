import { create } from "@bufbuild/protobuf";
import {
  ConnectResponseSchema,
  DoneSchema,
  ErrorKind,
  OfferSchema,
  ReceiptSchema,
  type Receipt,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason } from "../shared/abort.js";
import type { Logger } from "../shared/log.js";
import { durationFromMs } from "../shared/proto-time.js";
import type { Broker, BrokerEffects, JobRecord, OfferOutcome } from "./broker.js";
import type { BuiltinService, ServiceConfig } from "./config.js";
import type { CheckedJob } from "./limits.js";
import type { ExecserverMetrics } from "./metrics.js";
import { runJob as defaultRunJob, type RunJob } from "./runner/index.js";

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
 * The Broker's hands: sends OFFER/DONE frames, keeps one timer per outstanding offer,
 * starts jobs (runner or built-in) and turns their receipts into finish() + DONE.
 */
export class BrokerIo implements BrokerEffects {
  private broker: Broker | undefined;
  private metrics: ExecserverMetrics | undefined;
  private readonly offerExpiresIn;

  constructor(private readonly options: EffectsOptions) {
    this.offerExpiresIn = durationFromMs(options.offerTimeoutMs);
  }

  /** Connects the broker these effects serve and its metrics (both are made after this). */
  attach(broker: Broker, metrics: ExecserverMetrics): void {
    this.broker = broker;
    this.metrics = metrics;
  }

  /** @inheritdoc */
  offered(record: JobRecord): void {
    const { offerTimeoutMs, now } = this.options;
    this.metrics!.granted(record.group.name, (now() - record.wantedAt) / 1000);
    const token = record.offerToken;
    const value = create(OfferSchema, { jobId: record.jobId, offerToken: token, expiresIn: this.offerExpiresIn, waitgroup: record.group.name });
    record.connection.sink.send(create(ConnectResponseSchema, { frame: { case: "offer", value } }));
    record.handle = setTimeout(() => this.guard("offer expiry", () => this.broker!.expire(record, token)), offerTimeoutMs);
  }

  /** @inheritdoc */
  offerEnded(record: JobRecord, outcome: OfferOutcome): void {
    clearTimeout(record.handle as NodeJS.Timeout | undefined);
    record.handle = undefined;
    this.metrics!.offerEnded(outcome);
  }

  /** @inheritdoc */
  start(record: JobRecord, job: CheckedJob): void {
    const controller = new AbortController();
    record.handle = controller;
    const run = this.runner(record.service);
    run({
      command: record.service.kind === "command" ? record.service.command : [],
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
    const broker = this.broker!;
    const runtimeMs = this.options.now() - record.startedAt;
    broker.finish(record, runtimeMs);
    this.metrics!.jobDone(record.group.name);
    receipt.instanceId = this.options.instanceId;
    if (record.connection.state === "open") {
      const value = create(DoneSchema, { jobId: record.jobId, receipt });
      record.connection.sink.send(create(ConnectResponseSchema, { frame: { case: "done", value } }));
    }
    this.options.jobFinished();
  }

  private runner(service: ServiceConfig): RunJob {
    if (service.kind === "builtin") return builtins[service.builtin];
    return this.options.runJob ?? defaultRunJob;
  }

  private guard(what: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.options.logger.error({ err }, `${what} failed`);
    }
  }
}

/** In-process services: complete at once, spawn nothing. */
const builtins: Record<BuiltinService, RunJob> = {
  noop: (request) =>
    Promise.resolve(
      request.signal.aborted
        ? failedReceipt(ErrorKind.CANCELLED, "cancelled before it ran")
        : create(ReceiptSchema, { exitCode: 0, duration: durationFromMs(0) }),
    ),
};

function failedReceipt(error: ErrorKind, message: string): Receipt {
  return create(ReceiptSchema, { error, errorMessage: message, duration: durationFromMs(0) });
}
