import type { Readable, Writable } from "node:stream";
import { create, toBinary } from "@bufbuild/protobuf";
import { JobSpecSchema, type JobSpec, type Position, type Receipt } from "../../gen/slotbroker/v1/broker_pb.js";
import { linkedAbortController, workOver } from "../shared/abort.js";
import { Code, SlotbrokerError } from "../shared/errors.js";
import { checkArgs, checkEnvSize, jobSpecLimits } from "../shared/job-limits.js";
import { silentLogger, type Logger } from "../shared/log.js";
import { receiptSucceeded } from "../shared/receipt.js";
import type { BrokerClient, PolledSlot, Slot } from "./broker/index.js";
import { BufferCollector, ForwardingSink } from "./exec-client-sinks.js";
import { pipeUrls } from "./http/pipe-urls.js";
import type { PipeHandle, PipeRegistry } from "./pipes/index.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

/** What an exec client needs: the broker, this replica's pipes and the port serving them. */
export interface ExecClientOptions {
  readonly broker: BrokerClient;
  readonly pipes: PipeRegistry;
  /** Port of this fylr's HTTP server (the one serving `pipes`). */
  readonly pipePort: number;
  /** "https" when that port serves TLS (default "http"). */
  readonly pipeScheme?: "http" | "https";
  /**
   * Host for pipe URLs instead of this fylr's local address on the broker connection
   * (NAT). Default: the broker config's pipeHost, else the connection's local address.
   */
  readonly pipeHost?: string;
  /** How long the out-pipe may take to settle after DONE said stdout was streamed (default 30 s). */
  readonly settleTimeoutMs?: number;
  readonly logger?: Logger;
}

/** One exec call. */
export interface RunOptions {
  readonly service: string;
  /** Appended to the service's command; never run through a shell. */
  readonly args?: readonly string[];
  /** Environment; the execserver accepts only names the service allows. */
  readonly env?: Readonly<Record<string, string>>;
  /** Job timeout; unset uses the service's own. */
  readonly timeoutMs?: number;
  /** WANT priority; larger is more urgent (default 0). */
  readonly priority?: number;
  /** WANT fairness key, e.g. the tenant (default "": the default key). */
  readonly fairnessKey?: string;
  /** WANT fairness weight: grants per turn of the key, 1 to 1000 (default 1). */
  readonly fairnessWeight?: number;
  /**
   * The job's stdin; empty when unset. A stream is consumed by the job, or destroyed when
   * the job fails after a slot was taken; it stays untouched when no slot came. Bytes up to
   * 64 KiB ride in the JOB frame when the execserver supports it (no in-pipe).
   */
  readonly stdin?: Readable | Uint8Array;
  /**
   * Where stdout goes; it is ended after the last byte. Collected into a Buffer when unset.
   * A function makes the stream only when stdout streams through the out-pipe: output
   * that came whole in the receipt is returned in RunResult.stdout instead.
   */
  readonly stdout?: Writable | (() => Writable);
  /** Most stdout bytes collected when `stdout` is unset (default unlimited). */
  readonly maxStdoutBytes?: number;
  /** Aborting UNWANTs a parked want, or cancels the pipes of a running job. */
  readonly signal?: AbortSignal;
  /** Give up with NoSlotError after this long without an offer (default from config). */
  readonly connectTimeoutMs?: number;
  /** Called with each POSITION while the want is parked. */
  readonly onPosition?: (position: Position, instanceId: string) => void;
  /** Called once when JOB was sent. */
  readonly onStart?: (job: StartedJob) => void;
  /** Labels echoed in the execserver's logs. */
  readonly labels?: Readonly<Record<string, string>>;
  /** Sent in JOB (its traceparent): the job's span continues this trace. */
  readonly traceparent?: string;
}

/** A job that was handed to an execserver. */
export interface StartedJob {
  readonly jobId: string;
  readonly instanceId: string;
  /** The waitgroup whose slot runs it ("" by the token protocol). */
  readonly waitgroup: string;
  /**
   * The in-pipe's URL; undefined without stdin, when stdin travelled inline in the JOB
   * frame, or when the job went by the token protocol.
   */
  readonly stdinUrl: string | undefined;
  /** The out-pipe's URL; for the token protocol, the PUT /job URL's origin and path. */
  readonly stdoutUrl: string;
  /** How the slot was won: a broker OFFER, or polling the address's token protocol. */
  readonly transport: "broker" | "polling";
}

/** What a finished exec call produced. */
export interface RunResult extends StartedJob {
  /** The execserver's receipt; a failed command is data here, not an exception. */
  readonly receipt: Receipt;
  /** The collected stdout when no `stdout` stream was given, or the receipt's when the stream was never made. */
  readonly stdout: Buffer | undefined;
  /**
   * Set when the job failed and its stdout upload was aborted: the caller's stream was
   * destroyed with this error. (A receipt that claims success with an incomplete upload
   * makes `run` reject instead — never a short success.)
   */
  readonly stdoutError: Error | undefined;
}

/**
 * Runs commands on the execserver fleet: acquires a slot, serves stdin and stdout through
 * one-time pipes pinned to this replica, sends the job and settles it from the receipt.
 *
 * Outcome rules: `run` resolves with the receipt whenever the job ran, even when the
 * command failed. It rejects when no slot came (NoSlotError), the service is unknown
 * (UnknownServiceError), the connection dropped mid-job (ConnectionLostError), the signal
 * aborted, or a job that reported success did not deliver all of its stdout. Output up to
 * 4000 bytes arrives in the receipt and is written to the caller's stdout; the out-pipe is
 * then cancelled unused. Whenever an upload aborts, the caller's stream is destroyed with
 * the error.
 */
export class ExecClient {
  private readonly options: ExecClientOptions;
  private readonly logger: Logger;

  constructor(options: ExecClientOptions) {
    this.options = options;
    this.logger = (options.logger ?? silentLogger).child({ component: "exec-client" });
  }

  /** Runs one command to completion (see the class comment for the outcome rules). */
  async run(options: RunOptions): Promise<RunResult> {
    checkSpecLimits(options);
    // The broker takes its listeners off the caller's signal once a want or a job is over,
    // so the caller's signal is handed on as it is: no linked controller to build and abort
    // per job. The token protocol's requests are the exception; they get a linked one.
    const signal = options.signal;
    const acquired = await this.options.broker.acquire({
      service: options.service,
      priority: options.priority,
      fairnessKey: options.fairnessKey,
      fairnessWeight: options.fairnessWeight,
      signal,
      connectTimeoutMs: options.connectTimeoutMs,
      onPosition: options.onPosition,
    });
    if (acquired.transport === "polling") {
      const controller = linkedAbortController(signal);
      try {
        return await this.runPolled(acquired, options, controller.signal);
      } finally {
        controller.abort(workOver);
      }
    }
    const slot: Slot = acquired;
    const collector = options.stdout ? undefined : new BufferCollector(options.maxStdoutBytes);
    let inPipe: PipeHandle | undefined;
    let outPipe: PipeHandle | undefined;
    try {
      const host = await this.pipeHost(slot);
      // Made when the execserver opens the out-pipe; most output comes whole in the receipt.
      let sink: ForwardingSink | undefined;
      const inline = inlineStdin(options.stdin, slot);
      inPipe = options.stdin === undefined || inline ? undefined : this.options.pipes.createInPipe(options.stdin);
      outPipe = this.options.pipes.createOutPipe(() => (sink = new ForwardingSink(options.stdout ?? collector!)));
      const urls = pipeUrls(host, this.options.pipePort, { in: inPipe?.id, out: outPipe.id }, this.options.pipeScheme);
      // The message as create() would make it, written out: one per job.
      const spec: JobSpec = {
        $typeName: "slotbroker.v1.JobSpec",
        args: options.args ? [...options.args] : [],
        env: { ...options.env },
        timeout: options.timeoutMs === undefined ? undefined : durationFromMs(Math.round(options.timeoutMs)),
        stdinUrl: urls.in ?? "",
        stdoutUrl: urls.out!,
        labels: { ...options.labels },
        stdinInline: inline ?? noBytes,
      };
      const started: StartedJob = { jobId: slot.jobId, instanceId: slot.instanceId, waitgroup: slot.waitgroup, stdinUrl: urls.in, stdoutUrl: urls.out!, transport: "broker" };
      const receiptPromise = slot.start(spec, signal, options.traceparent);
      options.onStart?.(started);
      const receipt = await receiptPromise;
      if (inPipe?.state === "waiting") inPipe.cancel("the job ended without reading stdin");
      if (!receipt.stdoutStreamed) outPipe.retire(); // the output fit into the receipt
      // The caller's stream when it exists: made by the sink, or given as a stream.
      const existing = sink ? sink.existing : typeof options.stdout === "function" ? undefined : (options.stdout ?? collector);
      if (!receipt.stdoutStreamed && !existing) {
        const prefix = receipt.stdoutPrefix;
        return { ...started, receipt, stdout: Buffer.from(prefix.buffer, prefix.byteOffset, prefix.byteLength), stdoutError: undefined };
      }
      const stdoutError = await this.settleStdout(receipt, outPipe, sink?.forwarding ?? false, existing, slot.jobId);
      return { ...started, receipt, stdout: collector?.toBuffer(), stdoutError };
    } catch (err) {
      if (slot.state === "offered") slot.decline();
      inPipe?.cancel(err);
      outPipe?.cancel(err);
      throw err;
    }
  }

  // The token protocol: stdin is the PUT's body, stdout its response; the execserver holds
  // back output up to 4000 bytes and breaks a failed stream off, so there is nothing to
  // settle here. A broken-off response or "token not found" rejects (a failed attempt).
  private async runPolled(slot: PolledSlot, options: RunOptions, signal: AbortSignal): Promise<RunResult> {
    const collector = options.stdout ? undefined : new BufferCollector(options.maxStdoutBytes);
    const target = typeof options.stdout === "function" ? options.stdout() : (options.stdout ?? collector!);
    const started: StartedJob = {
      jobId: slot.jobId,
      instanceId: slot.instanceId,
      waitgroup: "",
      stdinUrl: undefined,
      stdoutUrl: new URL("job", slot.endpoint.url).href,
      transport: "polling",
    };
    try {
      const job = { args: options.args, env: options.env, timeoutMs: options.timeoutMs, labels: options.labels };
      const receiptPromise = slot.run(job, options.stdin, target, signal);
      options.onStart?.(started);
      const receipt = await receiptPromise;
      return { ...started, receipt, stdout: collector?.toBuffer(), stdoutError: undefined };
    } catch (err) {
      if (slot.state === "granted") slot.decline();
      this.logger.info({ jobId: slot.jobId, address: slot.address, err: (err as Error).message }, "job by the token protocol failed");
      throw err;
    }
  }

  // Delivers stdout to the caller: the receipt's prefix when nothing streamed, otherwise
  // the out-pipe's outcome. Returns the upload error of a failed job; throws when a job
  // that reports success did not deliver its stdout completely.
  private async settleStdout(
    receipt: Receipt,
    outPipe: PipeHandle,
    forwarding: boolean,
    existing: Writable | undefined,
    jobId: string,
  ): Promise<Error | undefined> {
    if (!receipt.stdoutStreamed && !forwarding) {
      await writeAndEnd(existing!, receipt.stdoutPrefix);
      return undefined;
    }
    // Streamed (or begun): the target was made by the first byte forwarded, unless none came.
    const target = existing;
    let error: Error | undefined;
    try {
      const bytes = await settleWithin(outPipe, this.options.settleTimeoutMs ?? 30_000);
      if (receipt.stdoutStreamed && BigInt(bytes) !== receipt.stdoutBytes) {
        error = new SlotbrokerError(
          Code.DataLoss,
          `job ${jobId}: the stdout upload delivered ${bytes} bytes, the receipt says ${receipt.stdoutBytes}`,
        );
        target?.destroy(error);
      }
    } catch (err) {
      error = SlotbrokerError.from(err, Code.Aborted);
      if (target && !target.destroyed) target.destroy(error);
    }
    if (!error) return undefined;
    this.logger.info({ jobId, err: error.message }, "stdout upload did not complete");
    if (receiptSucceeded(receipt)) {
      throw new SlotbrokerError(Code.DataLoss, `job ${jobId} reported success but its stdout upload failed: ${error.message}`, {
        cause: error,
      });
    }
    return error;
  }

  private async pipeHost(slot: Slot): Promise<string> {
    const fixed = this.options.pipeHost ?? this.options.broker.config.pipeHost;
    if (fixed) return fixed;
    const local = await slot.localAddress();
    if (!local) {
      throw new SlotbrokerError(Code.Internal, `cannot tell this fylr's address on the connection to ${slot.address}; set pipeHost`);
    }
    return local.host;
  }
}

// The out-pipe's `done`, bounded: DONE follows the finished upload, so a pipe still open
// long after it is stuck (e.g. the uploader vanished without closing the connection).
async function settleWithin(pipe: PipeHandle, timeoutMs: number): Promise<number> {
  if (pipe.state === "waiting") pipe.cancel("the receipt says stdout was streamed, but the out-pipe was never opened");
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      pipe.cancel("the out-pipe did not settle after the job was done");
      reject(new SlotbrokerError(Code.DeadlineExceeded, `out-pipe did not settle within ${timeoutMs} ms`));
    }, timeoutMs);
  });
  try {
    return await Promise.race([pipe.done, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// Small stdin already in memory rides in the JOB frame instead of an in-pipe (one HTTP
// request less per job), but only to a server that says it reads it: an older one would
// skip the field and run the job with empty stdin.
function inlineStdin(stdin: RunOptions["stdin"], slot: Slot): Uint8Array | undefined {
  if (!(stdin instanceof Uint8Array) || stdin.byteLength > jobSpecLimits.stdinInlineBytes) return undefined;
  return slot.inlinesStdin ? stdin : undefined;
}

const noBytes = new Uint8Array(0);

// Room in the JOB frame for the pipe URLs and the frame's own fields.
const FRAME_MARGIN_BYTES = 32 * 1024;

// The most args, env and inline stdin can add to an encoded JobSpec once checkArgs and
// checkEnvSize passed, field and length prefixes included: far below the frame limit, so
// only labels can pass it, and the spec is encoded to be measured only when they might.
const CHECKED_FIELDS_MAX_BYTES =
  jobSpecLimits.argsBytes + 6 * jobSpecLimits.args + jobSpecLimits.envBytes + 18 * jobSpecLimits.env + jobSpecLimits.stdinInlineBytes + 4;

// What an execserver would refuse is refused here, before a slot is taken: a JOB frame
// over its size limit would end the whole broker stream, and every sibling job with it.
function checkSpecLimits(options: RunOptions): void {
  const bad = checkArgs(options.args ?? [], "args") ?? checkEnvSize(options.env ?? {}, "env");
  if (bad) throw new SlotbrokerError(Code.InvalidArgument, `${bad} (the execserver's limit)`);
  const room = jobSpecLimits.maxFrameBytes - FRAME_MARGIN_BYTES;
  if (CHECKED_FIELDS_MAX_BYTES + labelsMaxBytes(options.labels) <= room) return;
  const spec = create(JobSpecSchema, { args: [...(options.args ?? [])], env: { ...options.env }, labels: { ...options.labels } });
  const bytes = toBinary(JobSpecSchema, spec).byteLength;
  if (bytes > room) {
    throw new SlotbrokerError(Code.InvalidArgument, `the job spec is ${bytes} bytes; a JOB frame must stay under ${jobSpecLimits.maxFrameBytes} bytes`);
  }
}

// An upper bound of the labels' encoded size: a UTF-16 unit is at most 3 UTF-8 bytes, and
// a map entry's tags and lengths take at most 18 more.
function labelsMaxBytes(labels: Readonly<Record<string, string>> | undefined): number {
  let bytes = 0;
  for (const [name, value] of Object.entries(labels ?? {})) bytes += 18 + 3 * (name.length + value.length);
  return bytes;
}

function writeAndEnd(target: Writable, bytes: Uint8Array): Promise<void> {
  return new Promise((resolve, reject) => {
    if (bytes.byteLength > 0) target.write(bytes);
    target.end((err?: Error | null) => (err ? reject(err) : resolve()));
  });
}
