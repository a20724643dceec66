// The fylr's broker client: connections, pools per address, slot acquisition.
export { BrokerClient, type AcquireOptions, type AcquiredSlot } from "./broker-client.js";
export type { BrokerClientEvents, BrokerClientStats } from "./events.js";
export { brokerConfigSchema, compileBrokerConfig, type BrokerConfig, type BrokerConfigInput, type PollingPolicy } from "./config.js";
export {
  BrokerConnection,
  defaultConnectionTimings,
  type BrokerConnectionOptions,
  type BrokerConnectionEvents,
  type BrokerTlsOptions,
  type ConnectionTimings,
} from "./connection.js";
export { callMetadata, channelCredentials, channelOptions, currentTlsMaterial, readTlsMaterial, type TlsMaterial } from "./channel-setup.js";
export { canTransition, checkTransition, type ConnectionState } from "./connection-state.js";
export { ConnectionLostError, JobRejectedError, NoSlotError, UnknownServiceError } from "./errors.js";
export {
  channelzLocalAddress,
  ipFromBytes,
  resolveLocalAddress,
  udpLocalAddress,
  type LocalAddress,
} from "./local-address.js";
export {
  AddressPool,
  describeInstance,
  type AddressPoolOptions,
  type BrokerInstance,
  type PoolPolling,
  type PoolStats,
  type PoolTransport,
} from "./pool.js";
export { decideGrowth, isCovered, type GrowthDecision, type GrowthInput, type GrowthPolicy } from "./pool-policy.js";
export { Slot, brokerSlot, type SlotState } from "./slot.js";
export { PolledSlot, type PolledSlotState } from "./polled-slot.js";
export { answersHttp1 } from "./http-probe.js";
export { RaceBook, WantRace, type OfferVerdict, type RaceState } from "./want-race.js";
export { describeTlsProblem, tlsHandshakeProblem } from "./tls-probe.js";
