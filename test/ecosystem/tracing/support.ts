// The trace tests' OTLP receiver, tracked: stopped with the test's resources.
import { startOtlpReceiver, type OtlpReceiver } from "../../../harness/otlp-receiver.js";
import { track } from "../../../harness/resources.js";

export type { OtlpReceiver, ReceivedSpan } from "../../../harness/otlp-receiver.js";

/** Builds (first time) and starts the receiver. */
export async function startTrackedReceiver(): Promise<OtlpReceiver> {
  return track(await startOtlpReceiver(), "otlp receiver", (r) => r.stop());
}
