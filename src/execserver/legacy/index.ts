// The pre-broker token protocol (GET /token/{service}, PUT /job) on the execserver, for
// fylrs that only know it: a token is a slot of the same ledger broker offers use, and
// it is never issued while a want of its waitgroup is parked.
export { LegacyTokens, LegacyToken, type LegacyCounts, type LegacyTotals, type TokenRefusal, type TokenRefusalCode } from "./tokens.js";
export { LegacyTransport, type LegacyTransportOptions } from "./transport.js";
export { parseLegacyJob, runLegacyJob } from "./job.js";
