import { randomBytes } from "node:crypto";

/**
 * The job ids of one broker client: a random per-client prefix plus a counter. Unique among
 * this client's jobs without a crypto call per acquire (randomFillSync showed up in the
 * cycle profile).
 */
export class JobIds {
  private readonly prefix = randomBytes(9).toString("base64url");
  private serial = 0;

  /** A job id not handed out before by this generator. */
  next(): string {
    return `${this.prefix}.${(++this.serial).toString(36)}`;
  }
}
