import type { Writable } from "node:stream";
import type { Logger } from "../../shared/log.js";
import { describeNetError, isSuccess, pipeRequest } from "./http-client.js";

/** A running stdin download; `stop` ends it early without it counting as a failure. */
export interface StdinPipe {
  stop(): void;
}

type StdinState = "connecting" | "streaming" | "done" | "failed" | "stopped";

/**
 * GETs `url` and streams the body into the child's `stdin` with backpressure (`pipe`
 * pauses the response while the child's pipe is full), ending stdin only after a complete
 * body. A non-2xx answer, a connection error or a body that breaks off calls `onFail`.
 * A child that stops reading (EPIPE) just ends the download: that is its business.
 */
export function pipeStdin(url: URL, stdin: Writable, onFail: (message: string) => void, log: Logger, ca?: Buffer): StdinPipe {
  let state: StdinState = "connecting";
  let received = 0;
  const fail = (message: string): void => {
    if (state !== "connecting" && state !== "streaming") return;
    state = "failed";
    onFail(message);
  };

  const req = pipeRequest(url, { method: "GET" }, (res) => {
    if (state !== "connecting") {
      res.destroy();
      return;
    }
    if (!isSuccess(res.statusCode)) {
      res.resume();
      fail(`stdin URL answered HTTP ${res.statusCode}`);
      return;
    }
    state = "streaming";
    res.on("data", (chunk: Buffer) => (received += chunk.length));
    res.on("end", () => {
      if (state === "streaming") state = "done";
    });
    // A broken-off body shows up as close without `complete`; the error itself adds nothing.
    res.on("error", () => {});
    res.on("close", () => {
      if (!res.complete) fail(`stdin download broke off after ${received} bytes`);
    });
    res.pipe(stdin);
  }, ca);
  req.on("error", (err) => fail(`stdin URL failed: ${describeNetError(err)}`));
  req.end();

  stdin.on("error", (err) => {
    // EPIPE et al.: the child closed its stdin before reading everything.
    log.debug({ err, received }, "child stopped reading stdin");
    stop();
  });

  function stop(): void {
    if (state === "connecting" || state === "streaming") state = "stopped";
    req.destroy();
  }
  return { stop };
}
