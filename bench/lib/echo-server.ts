// Child process of the benchmarks: the raw grpc-js echo baseline (see raw-grpc.ts).
import { serveEcho } from "./raw-grpc.js";

await serveEcho();
