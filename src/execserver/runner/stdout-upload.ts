import type { ClientRequest } from "node:http";
import { describeNetError, isSuccess, pipeRequest } from "./http-client.js";

type UploadState = "idle" | "open" | "finishing" | "done" | "failed" | "aborted";

/**
 * The PUT of a job's stdout to its stdout URL (chunked, since the length is unknown).
 * Opened lazily by the first write, i.e. only once the output has outgrown the receipt
 * buffer. Ends cleanly only through `finish`, after the process succeeded; any other way
 * out destroys the request so the receiver sees an aborted body, never a short one.
 */
export class StdoutUpload {
  #state: UploadState = "idle";
  #req: ClientRequest | undefined;
  #accepted = false;
  #flushed = false;
  #settle: (() => void) | undefined;

  constructor(
    readonly url: URL,
    private readonly onFail: (message: string) => void,
    /** CA certificates for an https URL (default: the system's). */
    private readonly ca?: Buffer,
  ) {}

  /** True once the request was opened (stdout passed the buffer). */
  get started(): boolean {
    return this.#state !== "idle";
  }

  /** True when a started upload was aborted by `abort`. */
  get aborted(): boolean {
    return this.#state === "aborted";
  }

  /**
   * Sends `data`, opening the request on first use. Resolves when more may be written
   * (after 'drain' when the socket is full), so the caller stops reading the child's
   * stdout meanwhile. After a failure or abort, data is dropped.
   */
  write(data: Buffer): Promise<void> {
    if (this.#state === "idle") this.#open();
    const req = this.#req;
    if (this.#state !== "open" || !req || req.write(data)) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        req.off("drain", done);
        req.off("close", done);
        resolve();
      };
      req.on("drain", done);
      req.on("close", done);
    });
  }

  /** Ends the body and waits for a 2xx answer; a failure is reported through onFail. */
  finish(): Promise<void> {
    const req = this.#req;
    if (this.#state !== "open" || !req) return Promise.resolve();
    this.#state = "finishing";
    return new Promise((resolve) => {
      this.#settle = resolve;
      req.end(() => {
        this.#flushed = true;
        this.#maybeDone();
      });
    });
  }

  /** Destroys a started upload so the receiver sees an aborted body; idempotent. */
  abort(reason: string): void {
    if (this.#state !== "open" && this.#state !== "finishing") return;
    this.#state = "aborted";
    this.#req?.destroy(new Error(`stdout upload aborted: ${reason}`));
    this.#settleNow();
  }

  #open(): void {
    this.#state = "open";
    const req = pipeRequest(this.url, { method: "PUT", headers: { "content-type": "application/octet-stream" } }, (res) => {
      res.resume();
      if (!isSuccess(res.statusCode)) {
        this.#fail(`stdout URL answered HTTP ${res.statusCode}`);
        return;
      }
      this.#accepted = true;
      this.#maybeDone();
    }, this.ca);
    req.on("error", (err) => this.#fail(`stdout upload failed: ${describeNetError(err)}`));
    req.on("close", () => {
      if (!this.#accepted) this.#fail("stdout upload failed: connection closed without an answer");
    });
    this.#req = req;
  }

  #maybeDone(): void {
    if (this.#state === "finishing" && this.#accepted && this.#flushed) {
      this.#state = "done";
      this.#settleNow();
    }
  }

  #fail(message: string): void {
    if (this.#state !== "open" && this.#state !== "finishing") return;
    this.#state = "failed";
    // Stop sending at once: the receiver refused or the connection is gone.
    this.#req?.destroy();
    this.#settleNow();
    this.onFail(message);
  }

  #settleNow(): void {
    const settle = this.#settle;
    this.#settle = undefined;
    settle?.();
  }
}
