/**
 * What the execserver reports about itself, built from the broker core: the GetStatus
 * answer (the status pages and `slotbroker status` read it) and the waitgroups part of
 * every HELLO. O(connections + classes), never the whole book.
 */
import { create } from "@bufbuild/protobuf";
import {
  ConnectionStatusSchema,
  GetStatusResponseSchema,
  LegacyStatusSchema,
  type LegacyStatus,
  PriorityDepthSchema,
  WaitgroupStateSchema,
  WaitgroupStatusSchema,
  type GetStatusResponse,
  type WaitgroupState,
} from "../../gen/slotbroker/v1/broker_pb.js";
import type { BrokerCore } from "./broker-core.js";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { LegacyTokens } from "./legacy/index.js";

/** The GetStatus snapshot of a broker. O(connections + classes), never the whole book. */
export function buildStatus(
  broker: BrokerCore,
  instanceId: string,
  services: Record<string, string>,
  startedAt: Date,
  legacy?: LegacyTokens,
): GetStatusResponse {
  return create(GetStatusResponseSchema, {
    instanceId,
    services,
    draining: broker.draining,
    startedAt: timestampFromDate(startedAt),
    legacy: legacy && legacyStatus(broker, legacy),
    waitgroups: [...broker.waitgroups.values()].map((wg) => {
      const mean = wg.ledger.meanRuntimeMs;
      const counts = legacy?.countsOf(wg);
      return create(WaitgroupStatusSchema, {
        name: wg.name,
        processes: wg.ledger.processes,
        running: wg.ledger.running,
        offered: wg.ledger.offered,
        free: wg.ledger.free,
        waiting: BigInt(wg.book.size),
        book: wg.book.depth().map((d) => create(PriorityDepthSchema, { priority: d.priority, wants: BigInt(d.wants), keys: d.keys })),
        completed: BigInt(wg.ledger.completed),
        meanRuntime: mean === undefined ? undefined : durationFromMs(Math.round(mean)),
        legacyTokens: counts?.tokens ?? 0,
        legacyRunning: counts?.running ?? 0,
      });
    }),
    connections: [...broker.connections.values()].map((c) =>
      create(ConnectionStatusSchema, {
        connectionId: c.id,
        peerAddress: c.peerAddress,
        clientName: c.clientName,
        connectedAt: timestampFromDate(c.connectedAt),
        wantsParked: BigInt(c.wantsParked),
        offers: BigInt(c.offers),
        grants: BigInt(c.grants),
        declines: BigInt(c.declines),
        expired: BigInt(c.expired),
        rejects: BigInt(c.rejects),
        running: c.running,
        done: BigInt(c.done),
      }),
    ),
  });
}

/** The waitgroups part of a Hello. */
export function helloWaitgroups(broker: BrokerCore): WaitgroupState[] {
  return [...broker.waitgroups.values()].map((wg) =>
    create(WaitgroupStateSchema, { name: wg.name, processes: wg.ledger.processes, running: wg.ledger.running, waiting: wg.book.size }),
  );
}

function legacyStatus(broker: BrokerCore, legacy: LegacyTokens): LegacyStatus {
  const t = legacy.totals;
  let jobsDone = 0;
  for (const wg of broker.waitgroups.values()) jobsDone += legacy.countsOf(wg).done;
  return create(LegacyStatusSchema, {
    tokensOutstanding: legacy.outstanding,
    tokensIssued: BigInt(t.issued),
    tokensRedeemed: BigInt(t.redeemed),
    tokensExpired: BigInt(t.expired),
    tokensReleased: BigInt(t.released),
    refusedWantsParked: BigInt(t.refused["wants-parked"]),
    refusedNoSlot: BigInt(t.refused["no-slot"]),
    refusedUnknownService: BigInt(t.refused["unknown-service"]),
    refusedDraining: BigInt(t.refused.draining),
    tokensNotFound: BigInt(t.notFound),
    jobsRunning: broker.legacyRunning,
    jobsDone: BigInt(jobsDone),
  });
}
