import { QueueService } from "../../../gen/slotbroker/v1/queue_pb.js";

/**
 * What a credential may do on the fylr's HTTP port:
 * - `read`: Get, Watch, List, History, Position, Stats, output downloads, the status page and /status.json;
 * - `submit`: Submit and input uploads;
 * - `admin`: everything, Cancel, Retry and Delete included.
 */
export type Scope = "read" | "submit" | "admin";

/** Every scope, in the order the docs list them. */
export const scopes: readonly Scope[] = ["read", "submit", "admin"];

/** True when a credential holding `granted` may do what needs `needed` (admin may do anything). */
export function allows(granted: ReadonlySet<Scope>, needed: Scope): boolean {
  return granted.has(needed) || granted.has("admin");
}

// Exhaustive over the service's methods: a new method does not compile until it has a scope.
const queueMethodScopes: Record<keyof typeof QueueService.method, Scope> = {
  submit: "submit",
  get: "read",
  watch: "read",
  position: "read",
  stats: "read",
  list: "read",
  history: "read",
  listKeys: "read",
  cancel: "admin",
  retry: "admin",
  delete: "admin",
};

/** Request path ("/slotbroker.v1.QueueService/Submit") → the scope the call needs. */
export const queueProcedureScopes: ReadonlyMap<string, Scope> = new Map(
  Object.entries(queueMethodScopes).map(([local, scope]) => {
    const method = QueueService.method[local as keyof typeof QueueService.method];
    return [`/${QueueService.typeName}/${method.name}`, scope];
  }),
);
