import { createHash, timingSafeEqual } from "node:crypto";
import type { Metadata } from "@grpc/grpc-js";

/**
 * Checks `authorization: Bearer <token>` metadata. Both sides are hashed first so the
 * comparison is constant-time over equal-length digests whatever the presented length;
 * the token itself is never logged or echoed.
 */
export class BearerAuth {
  private readonly expected: Buffer | undefined;

  constructor(token: string | undefined) {
    this.expected = token === undefined ? undefined : digest(token);
  }

  /** True when auth is off, or the metadata carries exactly one matching bearer token. */
  check(metadata: Metadata): boolean {
    if (!this.expected) return true;
    const values = metadata.get("authorization");
    return values.length === 1 && this.matches(values[0]);
  }

  /** The same check for an HTTP `authorization` header (the legacy token protocol). */
  checkHeader(value: string | string[] | undefined): boolean {
    return !this.expected || (typeof value === "string" && this.matches(value));
  }

  private matches(value: unknown): boolean {
    if (typeof value !== "string" || !/^bearer /i.test(value)) return false;
    return timingSafeEqual(digest(value.slice(7)), this.expected!);
  }
}

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}
