// One-time pipes of this fylr replica: bookkeeping only; src/fylr/http serves them.
export { PipeError, isPipeError, abortError, type PipeErrorKind } from "./errors.js";
export type { InPipeReader, InPipeSource } from "./in-pipe.js";
export type { OutPipeSink, OutPipeWriter } from "./out-pipe.js";
export { newPipeId, PIPE_ID_BYTES } from "./pipe-id.js";
export { isTerminal, shortId, type PipeEvents, type PipeHandle, type PipeState, type PipeDirection } from "./pipe-state.js";
export {
  PipeRegistry,
  DEFAULT_PIPE_TTL_MS,
  type PipeRegistryOptions,
  type CreatePipeOptions,
} from "./registry.js";
export { SpentIds, type SpentIdsOptions, type SpentReason } from "./spent-ids.js";
