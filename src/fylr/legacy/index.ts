// The fylr side of the pre-broker token protocol: its HTTP client (GET /token, PUT /job,
// DELETE /job) and the old polling client built on it. The broker client falls back to
// these primitives for an address that does not serve BrokerService.
export {
  jobJson,
  releaseToken,
  requestToken,
  runWithToken,
  TokenNotFoundError,
  type LegacyJob,
  type TokenAnswer,
  type TokenEndpoint,
} from "./token-http.js";
export { LegacyClient, type LegacyClientOptions, type LegacyClientStats, type LegacyRunOptions, type LegacyRunResult } from "./legacy-client.js";
