// The fylr's HTTP port: HTTP/1.1 + h2c, Connect services, raw pipe routes, /healthz.
export type { AccessControl, AccessRefusal, HttpRequest, HttpResponse, RawCall, RawRoute } from "./http-types.js";
export { nodeRequestKey } from "./node-request.js";
export { pipeRawRoutes } from "./pipe-routes.js";
export { pipeServiceImpl, registerPipeService } from "./pipe-service.js";
export { PIPE_IN_PREFIX, PIPE_OUT_PREFIX, pipeUrls, urlHost, type PipeIds, type PipeUrls } from "./pipe-urls.js";
export { classifyPreface, HTTP2_PREFACE, type WireProtocol } from "./protocol-sniff.js";
export { answerRefusal, challengeFor } from "./refusal.js";
export { matchPath } from "./route-match.js";
export { abortResponse, endResponse, httpStatusFor, isGone, requestBodyIntact, sendText, writeChunk, writeHead } from "./responses.js";
export { uploadComplete } from "./upload-complete.js";
export {
  startFylrHttpServer,
  type FylrHttpServer,
  type FylrHttpServerOptions,
  type HealthReport,
  type ServerTls,
} from "./server.js";
