/** Checking listen ports before starting, so a taken port gets an error that names it. */
import { createServer } from "node:net";
import { Code, SlotbrokerError } from "../shared/errors.js";

/** One port to check: what listens there, for the error message. */
export interface PortClaim {
  readonly what: string;
  readonly host: string;
  /** 0 picks a free port and is never taken. */
  readonly port: number;
}

/** Throws FAILED_PRECONDITION naming the first claim whose port is in use. */
export async function checkPortsFree(claims: readonly PortClaim[], hint: string): Promise<void> {
  for (const claim of claims) {
    if (claim.port === 0) continue;
    const err = await tryListen(claim.host, claim.port);
    if (!err) continue;
    const why = err.code === "EADDRINUSE" ? "is already in use" : `cannot be bound (${err.code ?? err.message})`;
    throw new SlotbrokerError(Code.FailedPrecondition, `port ${claim.port} on ${claim.host} (${claim.what}) ${why}; ${hint}`);
  }
}

function tryListen(host: string, port: number): Promise<NodeJS.ErrnoException | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", (err: NodeJS.ErrnoException) => resolve(err));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(undefined)));
  });
}
