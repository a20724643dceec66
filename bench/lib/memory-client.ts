// Child process of bench/memory: opens CONNECTIONS broker streams to ADDRESS (each its own
// TCP connection), prints "connected" once every HELLO arrived, then parks WANTS wants
// spread over them. Exits when its stdin closes.
import * as grpc from "@grpc/grpc-js";
import type { ConnectResponse } from "../../gen/slotbroker/v1/broker_pb.js";
import { brokerClientConstructor, encodeWant, type OutgoingFrame } from "../../src/fylr/broker/frames.js";

type Stream = grpc.ClientDuplexStream<OutgoingFrame, ConnectResponse>;

const [address, connectionsArg, wantsArg] = process.argv.slice(2);
const connections = Number(connectionsArg);
const wants = Number(wantsArg);
const Client = brokerClientConstructor();

const streams = await Promise.all(
  Array.from({ length: connections }, () => {
    const client = new Client(address!, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
    const call = (client as unknown as { connect(): Stream }).connect();
    call.on("error", () => undefined);
    call.on("data", () => undefined);
    return new Promise<Stream>((resolve) => call.once("data", () => resolve(call)));
  }),
);
process.stdout.write("connected\n");
for (let i = 0; i < wants; i++) streams[i % connections]!.write(encodeWant(`want-${i}`, "noop", i % 4));
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
