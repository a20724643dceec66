import type { Readable, Writable } from "node:stream";
import type { Logger } from "../../shared/log.js";
import type { StdinPipe } from "./stdin-pipe.js";
import type { StdoutSink } from "./types.js";

type SinkState = "idle" | "open" | "done" | "failed" | "aborted";

/**
 * Stdout into a stream the caller owns (the legacy transport's HTTP response), with the
 * same rules as the pipe upload: written only once the output outgrew the receipt buffer,
 * destroyed on any failure so the receiver sees a broken body, never a short one. It is
 * never ended here: after a clean success the caller ends it (with the receipt).
 */
export class StreamSink implements StdoutSink {
  #state: SinkState = "idle";

  constructor(
    private readonly stream: Writable,
    private readonly onFail: (message: string) => void,
  ) {
    stream.on("error", () => {});
    stream.once("close", () => {
      if (this.#state === "idle" || this.#state === "open") this.#fail("stdout receiver went away");
    });
  }

  /** @inheritdoc */
  get started(): boolean {
    return this.#state !== "idle";
  }

  /** @inheritdoc */
  get aborted(): boolean {
    return this.#state === "aborted";
  }

  /** @inheritdoc */
  write(data: Buffer): Promise<void> {
    if (this.#state === "idle") this.#state = "open";
    const stream = this.stream;
    if (this.#state !== "open" || stream.write(data)) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        stream.off("drain", done);
        stream.off("close", done);
        resolve();
      };
      stream.on("drain", done);
      stream.on("close", done);
    });
  }

  /** @inheritdoc */
  finish(): Promise<void> {
    if (this.#state === "open") this.#state = "done";
    return Promise.resolve();
  }

  /** @inheritdoc */
  abort(reason: string): void {
    if (this.#state !== "open") return;
    this.#state = "aborted";
    this.stream.destroy(new Error(`stdout aborted: ${reason}`));
  }

  #fail(message: string): void {
    this.#state = "failed";
    this.onFail(message);
  }
}

/**
 * Streams `source` (the legacy transport's request body) into the child's stdin with
 * backpressure, ending stdin after a complete body. A body that breaks off calls `onFail`.
 * Stopping never destroys the source: its connection also carries the response, so the
 * rest of the body is read and dropped instead.
 */
export function pipeStdinStream(source: Readable, stdin: Writable, onFail: (message: string) => void, log: Logger): StdinPipe {
  let state: "streaming" | "done" | "failed" | "stopped" = "streaming";
  let received = 0;
  const fail = (message: string): void => {
    if (state !== "streaming") return;
    state = "failed";
    onFail(message);
  };
  source.on("data", (chunk: Buffer) => (received += chunk.length));
  source.once("end", () => {
    if (state === "streaming") state = "done";
  });
  source.on("error", () => {});
  source.once("close", () => {
    if (state === "streaming" && !source.readableEnded) fail(`stdin (the request body) broke off after ${received} bytes`);
  });
  stdin.on("error", (err) => {
    // EPIPE et al.: the child closed its stdin before reading everything.
    log.debug({ err, received }, "child stopped reading stdin");
    stop();
  });
  source.pipe(stdin);

  function stop(): void {
    if (state === "streaming") state = "stopped";
    source.unpipe(stdin);
    source.resume();
  }
  return { stop };
}
