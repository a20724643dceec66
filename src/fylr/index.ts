// The fylr side of slotbroker. Other parts (broker connection, pool, exec client) join here.
export * from "./pipes/index.js";
export * from "./http/index.js";
export * from "./broker/index.js";
export { ExecClient, type ExecClientOptions, type RunOptions, type RunResult, type StartedJob } from "./exec-client.js";
export { execBackend } from "./exec-client-backend.js";
export { BufferCollector, ForwardingSink } from "./exec-client-sinks.js";
