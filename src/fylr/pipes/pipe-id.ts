import { randomBytes } from "node:crypto";

/** Random bytes per pipe id: 144 bits, so the base64url text has no padding bits. */
export const PIPE_ID_BYTES = 18;

/** A fresh pipe id: base64url of PIPE_ID_BYTES random bytes; the id is the credential. */
export function newPipeId(): string {
  return randomBytes(PIPE_ID_BYTES).toString("base64url");
}
