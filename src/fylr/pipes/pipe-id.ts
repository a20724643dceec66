import { randomBytes } from "node:crypto";

/** Random bytes per pipe id: 144 bits, so the base64url text has no padding bits. */
export const PIPE_ID_BYTES = 18;

const pipeIdPattern = /^[A-Za-z0-9_-]{22,64}$/;

/** A fresh pipe id: base64url of PIPE_ID_BYTES random bytes; the id is the credential. */
export function newPipeId(): string {
  return randomBytes(PIPE_ID_BYTES).toString("base64url");
}

/** True when `text` has the shape of a pipe id (cheap check before a lookup). */
export function looksLikePipeId(text: string): boolean {
  return pipeIdPattern.test(text);
}
