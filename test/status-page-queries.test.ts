import { expect } from "chai";
import type pg from "pg";
import { migrate } from "../src/dispatcher/index.js";
import { itemSummariesById as itemsById, keyCounts, openItemsByPriority } from "../src/dispatcher/queue/sql.js";
import { createTestDatabase } from "./support/postgres.js";
import { release, track } from "../harness/resources.js";
import { createPgPool } from "../src/shared/postgres.js";

type Plan = { "Node Type": string; "Relation Name"?: string; "Index Name"?: string; Plans?: Plan[] };

function nodes(plan: Plan): Plan[] {
  return [plan, ...(plan.Plans ?? []).flatMap(nodes)];
}

describe("fylr status page queries", function () {
  this.timeout(60_000);
  let pool: pg.Pool;

  before(async () => {
    pool = track(createPgPool({ connectionString: await createTestDatabase("status_queries"), max: 2 }), "status queries db", (p) => p.end());
    await migrate(pool, {});
    await pool.query("INSERT INTO fylrs (id, hostname, pid) VALUES ('f1', 'h', 1)");
    // A table of mostly finished rows, as a long-running queue has.
    await pool.query(
      "INSERT INTO queue_items (kind, priority, payload, state, finished_at) SELECT 'exec', i % 5, '{}', 'succeeded', now() FROM generate_series(1, 100000) i",
    );
    await pool.query("INSERT INTO queue_items (kind, priority, payload, state) SELECT 'exec', i % 3, '{}', 'queued' FROM generate_series(1, 300) i");
    await pool.query(
      "INSERT INTO queue_items (kind, priority, payload, state, claimed_by) SELECT CASE WHEN i % 2 = 0 THEN 'local' ELSE 'exec' END, 7, '{}', CASE WHEN i % 4 < 2 THEN 'claimed' ELSE 'running' END, 'f1' FROM generate_series(1, 40) i",
    );
    await pool.query("VACUUM ANALYZE queue_items");
  });
  after(() => release(pool));

  it("counts open items by kind, state and priority like a plain filter does", async () => {
    const plain = await pool.query<{ kind: string; state: string; priority: number; n: number }>(
      "SELECT kind, state, priority, count(*)::int AS n FROM queue_items WHERE state IN ('queued', 'claimed', 'running') GROUP BY 1, 2, 3",
    );
    const ours = await pool.query<{ kind: string; state: string; priority: number; n: number }>(openItemsByPriority);
    const key = (r: { kind: string; state: string; priority: number; n: number }): string => `${r.kind}/${r.state}/${r.priority}=${r.n}`;
    expect(ours.rows.map(key).sort()).to.deep.equal(plain.rows.map(key).sort());
    expect(ours.rows.reduce((n, r) => n + r.n, 0)).to.equal(340);
  });

  it("never scans the whole table: the open-item count reads the partial indexes, recent items the primary key", async () => {
    const explain = async (text: string, values: unknown[] = []): Promise<Plan[]> => {
      const { rows } = await pool.query<{ "QUERY PLAN": [{ Plan: Plan }] }>({ text: `EXPLAIN (FORMAT JSON) ${text}`, values });
      return nodes(rows[0]!["QUERY PLAN"][0].Plan);
    };
    const open = await explain(openItemsByPriority);
    expect(open.filter((n) => n["Node Type"] === "Seq Scan")).to.deep.equal([]);
    // The queued rows from a claim index (oldest-first's or the per-key one), held rows from a held index.
    const indexes = open.map((n) => n["Index Name"] ?? "").filter(Boolean);
    expect(indexes.some((i) => /^queue_items_(key_)?claim_idx$/.test(i)), indexes.join(", ")).to.equal(true);
    expect(indexes.some((i) => /^queue_items_(key_)?held_idx$/.test(i)), indexes.join(", ")).to.equal(true);
    const keys = await explain(keyCounts, [12]);
    expect(keys.filter((n) => n["Node Type"] === "Seq Scan")).to.deep.equal([]);
    const ids = (await pool.query<{ id: string }>("SELECT id FROM queue_items WHERE state = 'running' LIMIT 12")).rows.map((r) => r.id);
    const byId = await explain(itemsById, [ids]);
    expect(byId.filter((n) => n["Node Type"] === "Seq Scan")).to.deep.equal([]);
    expect(byId.map((n) => n["Index Name"])).to.include("queue_items_pkey");
  });
});
