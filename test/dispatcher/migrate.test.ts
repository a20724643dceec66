import { once } from "node:events";
import { expect } from "chai";
import pg from "pg";
import { createDefaultActions, ItemControlStore, loadMigrations, migrate, normalizeSubmit, QueueStore } from "../../src/dispatcher/index.js";
import { claimLocalItems, explainClaimPath, itemPosition } from "../../src/dispatcher/queue/sql.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool } from "./support.js";

const lowest = -2_147_483_648;

describe("dispatcher migrations", () => {
  let url: string;
  before(async () => {
    url = await createTestDatabase("migrate");
  });

  it("applies every migration once, however many fylrs start at the same time", async () => {
    const versions = loadMigrations().map((m) => m.version);
    expect(versions.length).to.be.greaterThan(0);
    const known = Math.max(...versions);
    // Separate connections, started together: the advisory lock serialises them.
    const reports = await Promise.all(Array.from({ length: 8 }, () => migrate(url)));
    const applied = reports.flatMap((r) => r.applied);
    expect(applied).to.deep.equal(versions);
    expect(reports.every((r) => r.version === known)).to.equal(true);
    const pool = openPool(url, 2);
    try {
      const ledger = await pool.query<{ version: number }>("SELECT version FROM slotbroker_migrations ORDER BY version");
      expect(ledger.rows.map((r) => r.version)).to.deep.equal(applied);
      // …and once more later: nothing left to do.
      expect((await migrate(pool)).applied).to.deep.equal([]);
    } finally {
      await closeAll(pool);
    }
  });

  it("claims and counts positions through the partial claim index", async () => {
    await migrate(url);
    const pool = openPool(url, 2);
    try {
      // Enough rows, most of them finished, that a sequential scan would be the worse plan.
      await pool.query(`
        INSERT INTO queue_items (kind, priority, payload, state, claimed_by)
        SELECT CASE WHEN g % 3 = 0 THEN 'local' ELSE 'exec' END, g % 7, '{"calls":[]}',
               CASE WHEN g % 10 = 0 THEN 'queued' ELSE 'succeeded' END,
               CASE WHEN g % 10 = 0 THEN NULL ELSE 'old-fylr' END
        FROM generate_series(1, 20000) g`);
      await pool.query("ANALYZE queue_items");
      const plan = (await pool.query<{ "QUERY PLAN": string }>(explainClaimPath, ["exec", -2147483648, 10])).rows.map((r) => r["QUERY PLAN"]).join("\n");
      expect(plan).to.match(/Index Scan using queue_items_claim_idx/);
      expect(plan).to.match(/LockRows/);
      await pool.query("INSERT INTO fylrs (id, hostname, pid) VALUES ('me', 'h', 1)");
      const localPlan = (await pool.query<{ "QUERY PLAN": string }>(`EXPLAIN ${claimLocalItems(8)}`, ["me", 1, 8, 6])).rows.map((r) => r["QUERY PLAN"]).join("\n");
      expect(localPlan).to.match(/Index Scan using queue_items_claim_idx/);
      const id = (await pool.query<{ id: string }>("SELECT id FROM queue_items WHERE state = 'queued' LIMIT 1")).rows[0]!.id;
      const positionPlan = (await pool.query<{ "QUERY PLAN": string }>(`EXPLAIN ${itemPosition}`, [id])).rows.map((r) => r["QUERY PLAN"]).join("\n");
      expect((positionPlan.match(/queue_items_(key_)?claim_idx/g) ?? []).length, positionPlan).to.be.at.least(2);
      expect(positionPlan).to.not.match(/Seq Scan/);
    } finally {
      await closeAll(pool);
    }
  });

  it("migrates again after its tables and ledger were dropped, functions left behind", async () => {
    const fresh = await createTestDatabase("migrate_again");
    await migrate(fresh);
    const pool = openPool(fresh, 2);
    const listener = new pg.Client(fresh);
    try {
      // What a test resetting its tables does: the trigger functions outlive them.
      await pool.query("DROP TABLE item_events, blob_reservations, blob_usage, blob_chunks, blobs, queue_keys, queue_items, fylrs, slotbroker_migrations CASCADE");
      // slotbroker_claim_exec returns queue_items rows: it went with the table.
      expect((await pool.query("SELECT count(*)::int AS n FROM pg_proc WHERE proname LIKE 'slotbroker_%'")).rows[0]).to.deep.equal({ n: 8 });
      expect((await migrate(pool)).applied).to.deep.equal(loadMigrations().map((m) => m.version));
      // …and the notify trigger is back in place.
      await listener.connect();
      await listener.query("LISTEN slotbroker_queue");
      const heard = once(listener, "notification");
      await pool.query(`INSERT INTO queue_items (kind, priority, payload) VALUES ('exec', 0, '{"calls":[]}')`);
      const [message] = (await heard) as [pg.Notification];
      expect(message.payload).to.equal("queued");
    } finally {
      await listener.end();
      await closeAll(pool);
    }
  });

  it("moves a database at 0012 with items in flight to 0013: claims in key turn, fences and completions keep working", async () => {
    const at12 = await createTestDatabase("migrate_0012");
    await migrate(at12, { migrations: loadMigrations().filter((m) => m.version <= 12) });
    const pool = openPool(at12, 2);
    const queue = new QueueStore(pool);
    try {
      await queue.registerFylr({ id: "f", hostname: "h", pid: 1 });
      const submit = (key: string) =>
        queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }], fairnessKey: key }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
      for (let i = 0; i < 3; i++) await submit("a");
      for (let i = 0; i < 3; i++) await submit("b");
      const held = await queue.claim("f", "exec", lowest, 2);
      expect(held.map((i) => i.fairnessKey)).to.deep.equal(["a", "b"]);
      expect((await migrate(pool, { migrations: loadMigrations().filter((m) => m.version <= 13) })).applied).to.deep.equal([13]);
      // Keys still take turns, the turn kept across the migration; a stale fence still refuses.
      const next = await queue.claim("f", "exec", lowest, 3);
      expect(next.map((i) => i.fairnessKey)).to.deep.equal(["a", "b", "a"]);
      expect(await queue.complete({ ...held[0]!, lease: held[0]!.lease - 1 }, [], undefined)).to.equal(false);
      expect(await queue.complete(held[0]!, [], undefined)).to.equal(true);
      // The only key left is served oldest first; the timeline holds every claim.
      const last = await queue.claim("f", "exec", lowest, 5);
      expect(last.map((i) => i.fairnessKey)).to.deep.equal(["b"]);
      const kinds = await pool.query<{ kind: string }>("SELECT kind FROM item_events WHERE item_id = $1 ORDER BY n", [held[0]!.id]);
      expect(kinds.rows.map((r) => r.kind)).to.deep.equal(["submitted", "claimed", "succeeded"]);
      expect((await pool.query("SELECT count(*)::int AS n FROM queue_items WHERE state = 'queued'")).rows[0]).to.deep.equal({ n: 0 });
    } finally {
      await closeAll(pool);
    }
  });

  it("moves a database at 0013 with items in flight to 0014: settles, lists, deletes and sweeps with their events", async () => {
    const at13 = await createTestDatabase("migrate_0013");
    await migrate(at13, { migrations: loadMigrations().filter((m) => m.version <= 13) });
    const pool = openPool(at13, 2);
    const queue = new QueueStore(pool);
    const control = new ItemControlStore(pool);
    const eventsOf = async (id: string): Promise<string[]> =>
      (await pool.query<{ kind: string }>("SELECT kind FROM item_events WHERE item_id = $1 ORDER BY n", [id])).rows.map((r) => r.kind);
    try {
      await queue.registerFylr({ id: "f", hostname: "h", pid: 1 });
      const submit = async (): Promise<string> =>
        (await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }))).item.id;
      const ids = [await submit(), await submit(), await submit(), await submit()];
      const held = await queue.claim("f", "exec", lowest, 2);
      expect(await queue.complete(held[0]!, [], undefined)).to.equal(true);
      expect((await migrate(pool, { migrations: loadMigrations().filter((m) => m.version <= 14) })).applied).to.deep.equal([14]);
      // The claim held across the migration settles under its fence; the rest are claimed and settle too.
      expect(await queue.complete({ ...held[1]!, lease: held[1]!.lease - 1 }, [], undefined)).to.equal(false);
      expect(await queue.complete(held[1]!, [], undefined)).to.equal(true);
      for (const item of await queue.claim("f", "exec", lowest, 5)) expect(await queue.complete(item, [], undefined)).to.equal(true);
      for (const id of ids) expect(await eventsOf(id)).to.deep.equal(["submitted", "claimed", "succeeded"]);
      // Every page, newest first, across the merged state ranges.
      const page = await control.list({ pageSize: 3 });
      const rest = await control.list({ pageSize: 3, pageToken: page.nextPageToken });
      expect([...page.items, ...rest.items].map((i) => i.id)).to.deep.equal([...ids].reverse());
      // Deleting an item, by request or by the retention sweep, deletes its events.
      await control.delete(ids[0]!);
      expect(await eventsOf(ids[0]!)).to.deep.equal([]);
      expect((await queue.sweepFinished(0, 2)).items).to.equal(2);
      expect((await pool.query("SELECT count(DISTINCT item_id)::int AS n FROM item_events")).rows[0]).to.deep.equal({ n: 1 });
      await pool.query("TRUNCATE queue_items CASCADE");
      expect((await pool.query("SELECT count(*)::int AS n FROM item_events")).rows[0]).to.deep.equal({ n: 0 });
    } finally {
      await closeAll(pool);
    }
  });

  it("refuses two migration files with the same number", () => {
    expect(() => loadMigrations(new URL("./fixtures/bad-migrations/", import.meta.url).pathname)).to.throw(/version 3 is used twice/);
  });

  it("rolls a failing migration back and names it", async () => {
    const bad = [...loadMigrations(), { version: 99, name: "broken", sql: "CREATE TABLE x (a int); SELECT no_such_function();", checksum: "x" }];
    const err = await migrate(url, { migrations: bad }).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).to.match(/migration 0099_broken: .*no_such_function/);
    const client = new pg.Client(url);
    await client.connect();
    try {
      expect((await client.query("SELECT to_regclass('x') AS t")).rows[0]).to.deep.equal({ t: null });
    } finally {
      await client.end();
    }
  });
});
