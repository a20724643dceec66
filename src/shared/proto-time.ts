import { create } from "@bufbuild/protobuf";
import { DurationSchema, TimestampSchema, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";

/** A google.protobuf.Duration from milliseconds. */
export function durationFromMs(ms: number): Duration {
  const seconds = Math.floor(ms / 1000);
  return create(DurationSchema, { seconds: BigInt(seconds), nanos: Math.round((ms - seconds * 1000) * 1e6) });
}

/** Milliseconds from a google.protobuf.Duration (undefined stays undefined). */
export function msFromDuration(d: Duration | undefined): number | undefined {
  if (!d) return undefined;
  return Number(d.seconds) * 1000 + d.nanos / 1e6;
}

/** A google.protobuf.Timestamp from a Date. */
export function timestampFromDate(date: Date): Timestamp {
  const ms = date.getTime();
  const seconds = Math.floor(ms / 1000);
  return create(TimestampSchema, { seconds: BigInt(seconds), nanos: (ms - seconds * 1000) * 1e6 });
}

/** A Date from a google.protobuf.Timestamp (undefined stays undefined). */
export function dateFromTimestamp(ts: Timestamp | undefined): Date | undefined {
  if (!ts) return undefined;
  return new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6));
}
