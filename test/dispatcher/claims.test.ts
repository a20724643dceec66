import { expect } from "chai";
import type pg from "pg";
import { createDefaultActions, migrate, normalizeSubmit, QueueStore, inlineOutput } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../../harness/resources.js";
import { closeAll, openPool, startClaimer } from "./support.js";

describe("concurrent claims", () => {
  let url: string;
  let pool: pg.Pool;
  before(async () => {
    url = await createTestDatabase("claims");
    await migrate(url);
  });
  beforeEach(() => {
    pool = openPool(url);
  });
  afterEach(async () => {
    await closeAll(pool);
  });

  async function fill(n: number): Promise<void> {
    const payload = normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });
    await pool.query(
      `INSERT INTO queue_items (kind, priority, payload) SELECT 'exec', g % 4, $1 FROM generate_series(1, $2) g`,
      [JSON.stringify(payload.payload), n],
    );
  }

  /** An in-process claimer on its own pool, with the same loop as the child's drain mode. */
  async function drainInProcess(id: string): Promise<{ claimed: string; lease: number; completed: boolean }[]> {
    const own = openPool(url, 2);
    const queue = new QueueStore(own);
    const seen: { claimed: string; lease: number; completed: boolean }[] = [];
    try {
      await queue.registerFylr({ id, hostname: "test", pid: process.pid });
      let empty = 0;
      while (empty < 5) {
        const items = await queue.claim(id, "exec", -2_147_483_648, 1 + Math.floor(Math.random() * 8));
        if (items.length === 0) {
          empty += 1;
          // A claimer's pause between empty claims (as in fixtures/claimer.ts), not a wait for a state.
          await new Promise((r) => setTimeout(r, 20));
          continue;
        }
        empty = 0;
        for (const item of items) seen.push({ claimed: item.id, lease: item.lease, completed: await queue.complete(item, [], inlineOutput(Buffer.from(id))) });
      }
    } finally {
      await release(own);
    }
    return seen;
  }

  it("never hands an item to two claimers: 4 processes and 4 in-process pools on one queue", async () => {
    const total = 3000;
    const children = [0, 1, 2, 3].map((i) => startClaimer(["drain", url, `proc-${i}`]));
    await Promise.all(children.map((c) => c.awaitLine((l) => "ready" in l)));
    await fill(total);
    const inProcess = await Promise.all([0, 1, 2, 3].map((i) => drainInProcess(`pool-${i}`)));
    const codes = await Promise.all(children.map((c) => c.exited));
    expect(codes).to.deep.equal([0, 0, 0, 0]);
    type Claim = { claimed: string; lease: number; completed: boolean };
    const fromChildren = children.map((c) => c.lines.filter((l) => "claimed" in l) as unknown as Claim[]);
    const claims = [...inProcess.flat(), ...fromChildren.flat()];
    const ids = claims.map((c) => c.claimed);
    expect(ids).to.have.length(total);
    expect(new Set(ids).size).to.equal(total);
    expect(claims.every((c) => c.lease === 1 && c.completed)).to.equal(true);
    // Every claimer got work, i.e. they really overlapped.
    const byChild = fromChildren.map((c) => c.length);
    expect(byChild.every((n) => n > 0), `claims per process: ${byChild.join(", ")}`).to.equal(true);
    const states = await pool.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM queue_items GROUP BY state");
    expect(states.rows).to.deep.equal([{ state: "succeeded", n: total }]);
    for (const c of children) await release(c.child);
  });
});
