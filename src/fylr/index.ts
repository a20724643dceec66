// The fylr side of slotbroker: the broker client, one-time pipes and the HTTP port that
// serves them, and the exec client on top. Imports only src/shared and gen/.
export * from "./pipes/index.js";
export * from "./http/index.js";
export * from "./broker/index.js";
export * from "./legacy/index.js";
export * from "./auth/index.js";
export { ExecClient, type ExecClientOptions, type RunOptions, type RunResult, type StartedJob } from "./exec-client.js";
export { BufferCollector, ForwardingSink } from "./exec-client-sinks.js";
