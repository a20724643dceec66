export * from "./abort.js";
export * from "./config.js";
export * from "./duration.js";
export * from "./errors.js";
export * from "./log.js";
export * from "./proto-time.js";
