// Claiming: what this fylr may claim now (admission over the exec capacity it sees, local
// permits), the claim pass, what wakes it (LISTEN/NOTIFY, the poll), and keeping claims
// honest: the heartbeat, the sweep of dead siblings' claims, the audit of lost claims and
// whether the database takes this fylr's writes (housekeeping.ts, write-health.ts).
export { execAdmission, instanceShare, reservedForHigh, type ExecAdmission, type InstanceShare } from "./admission.js";
export { ManualCapacitySource, type CapacitySource, type ExecInstance } from "./capacity.js";
export { LocalPermits, type Permit, type PermitCounts, type PermitState } from "./local-permits.js";
export { Wakeup } from "./wakeup.js";
export { refusesWrites, WriteHealth, writeHealthMaxAgeMs } from "./write-health.js";
