import { create } from "@bufbuild/protobuf";
import {
  ConnectionStatusSchema,
  GetStatusResponseSchema,
  PriorityDepthSchema,
  WaitgroupStateSchema,
  WaitgroupStatusSchema,
  type GetStatusResponse,
  type WaitgroupState,
} from "../../gen/slotbroker/v1/broker_pb.js";
import type { BrokerCore } from "./broker-core.js";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";

/** The GetStatus snapshot of a broker. O(connections + classes), never the whole book. */
export function buildStatus(broker: BrokerCore, instanceId: string, services: Record<string, string>, startedAt: Date): GetStatusResponse {
  return create(GetStatusResponseSchema, {
    instanceId,
    services,
    draining: broker.draining,
    startedAt: timestampFromDate(startedAt),
    waitgroups: [...broker.waitgroups.values()].map((wg) => {
      const mean = wg.ledger.meanRuntimeMs;
      return create(WaitgroupStatusSchema, {
        name: wg.name,
        processes: wg.ledger.processes,
        running: wg.ledger.running,
        offered: wg.ledger.offered,
        free: wg.ledger.free,
        waiting: BigInt(wg.book.size),
        book: wg.book.depth().map((d) => create(PriorityDepthSchema, { priority: d.priority, wants: BigInt(d.wants) })),
        completed: BigInt(wg.ledger.completed),
        meanRuntime: mean === undefined ? undefined : durationFromMs(Math.round(mean)),
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
