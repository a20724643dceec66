import { expect } from "chai";
import type pg from "pg";
import { createDefaultActions, migrate, normalizeSubmit, QueueStore, type SubmitInput } from "../../src/dispatcher/index.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool } from "./support.js";

const actions = createDefaultActions();
const limits = { maxInputBytes: 1 << 20, defaultMaxAttempts: 3 };
const lowest = -2_147_483_648;

function exec(extra: Partial<SubmitInput> = {}): SubmitInput {
  return { calls: [{ service: "cat", args: [], env: {} }], ...extra };
}

describe("fairness keys at claim", () => {
  let url: string;
  let pool: pg.Pool;
  let queue: QueueStore;

  before(async () => {
    url = await createTestDatabase("fairness_keys");
    await migrate(url);
  });

  beforeEach(async () => {
    pool = openPool(url);
    queue = new QueueStore(pool);
    await pool.query("TRUNCATE queue_keys, queue_items, fylrs CASCADE");
    await queue.registerFylr({ id: "fylr-a", hostname: "h", pid: 1 });
    await queue.registerFylr({ id: "fylr-b", hostname: "h", pid: 2 });
  });

  afterEach(async () => {
    await closeAll(pool);
  });

  const submit = (input: SubmitInput) => queue.submit(normalizeSubmit(input, actions, limits));

  /** Submits `n` items of `key` and returns their ids in order. */
  async function backlog(key: string, n: number, extra: Partial<SubmitInput> = {}): Promise<string[]> {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) ids.push((await submit(exec({ fairnessKey: key, ...extra }))).item.id);
    return ids;
  }

  /** Claims one at a time and returns the keys in claim order. */
  async function claimKeys(n: number, fylr = "fylr-a"): Promise<string[]> {
    const keys: string[] = [];
    for (let i = 0; i < n; i++) {
      const [item] = await queue.claim(fylr, "exec", lowest, 1);
      if (!item) break;
      keys.push(item.fairnessKey);
    }
    return keys;
  }

  it("validates the key, its weight and its limit, naming the field", () => {
    const norm = (extra: Partial<SubmitInput>) => () => normalizeSubmit(exec(extra), actions, limits);
    expect(norm({ fairnessKey: "é".repeat(65) })).to.throw(/fairness_key: longer than 128 bytes/);
    expect(norm({ fairnessKey: "a\0b" })).to.throw(/fairness_key: must not contain a NUL/);
    expect(norm({ fairnessKey: "\ud800" })).to.throw(/fairness_key: not valid UTF-16/);
    expect(norm({ fairnessWeight: 1001 })).to.throw(/fairness_weight: must be 1…1000/);
    expect(norm({ fairnessWeight: 1.5 })).to.throw(/fairness_weight/);
    expect(norm({ fairnessLimit: -1 })).to.throw(/fairness_limit/);
    const n = normalizeSubmit(exec({ fairnessKey: "t".repeat(128) }), actions, limits);
    expect([n.fairnessKey?.length, n.fairnessWeight, n.fairnessLimit]).to.deep.equal([128, 1, undefined]);
  });

  it("stores and returns the key, weight and limit; no key is the default key", async () => {
    const { item } = await submit(exec({ fairnessKey: "tenant-7", fairnessWeight: 3, fairnessLimit: 2 }));
    expect([item.fairnessKey, item.fairnessWeight, item.fairnessLimit]).to.deep.equal(["tenant-7", 3, 2]);
    const plain = (await submit(exec())).item;
    expect([plain.fairnessKey, plain.fairnessWeight, plain.fairnessLimit]).to.deep.equal(["", 1, undefined]);
  });

  it("takes keys in turn within a priority, oldest first within a key", async () => {
    const a = await backlog("A", 6);
    const b = await backlog("B", 2);
    const c = await backlog("C", 1);
    const claimed: string[] = [];
    for (let i = 0; i < 9; i++) claimed.push((await queue.claim("fylr-a", "exec", lowest, 1))[0]!.id);
    // A's turn first (its row is oldest at pass 0; B and C joined at pass 0 too and follow in key order).
    expect(claimed).to.deep.equal([a[0], b[0], c[0], a[1], b[1], a[2], a[3], a[4], a[5]]);
  });

  it("claims a batch in the same order as one at a time", async () => {
    const a = await backlog("A", 4);
    const b = await backlog("B", 2);
    const items = await queue.claim("fylr-a", "exec", lowest, 5);
    expect(items.map((i) => i.id)).to.deep.equal([a[0], b[0], a[1], b[1], a[2]]);
  });

  it("puts priority before keys", async () => {
    await backlog("A", 3);
    const [urgent] = await backlog("B", 1, { priority: 5 });
    expect((await queue.claim("fylr-a", "exec", lowest, 1))[0]!.id).to.equal(urgent);
  });

  it("keeps today's FIFO for items without a key, start_after first", async () => {
    const first = (await submit(exec())).item.id;
    const later = (await submit(exec({ startAfter: new Date(Date.now() + 60_000) }))).item.id;
    const second = (await submit(exec())).item.id;
    expect((await queue.claim("fylr-a", "exec", lowest, 10)).map((i) => i.id)).to.deep.equal([first, second]);
    await pool.query("UPDATE queue_items SET start_after = now() WHERE id = $1", [later]);
    expect((await queue.claim("fylr-a", "exec", lowest, 10)).map((i) => i.id)).to.deep.equal([later]);
  });

  it("gives a key of weight 3 three turns to each turn of a weight-1 key", async () => {
    await backlog("heavy", 30, { fairnessWeight: 3 });
    await backlog("light", 30);
    const keys = await claimKeys(40);
    const heavy = keys.filter((k) => k === "heavy").length;
    expect(heavy).to.equal(30);
    // Every window of 4 claims while both have items: 3 heavy, 1 light.
    for (let i = 0; i + 4 <= 36; i += 4) expect(keys.slice(i, i + 4).filter((k) => k === "heavy").length, `window ${i}`).to.equal(3);
  });

  it("starts a key that comes back after idling at the current turn, not with banked credit", async () => {
    await backlog("A", 40);
    await backlog("B", 2);
    expect(await claimKeys(4)).to.deep.equal(["A", "B", "A", "B"]);
    // B is idle while A is served alone…
    expect(await claimKeys(20)).to.deep.equal(Array<string>(20).fill("A"));
    // …and comes back with a backlog: it alternates with A, it does not run 20 in a row.
    await backlog("B", 10);
    expect(await claimKeys(6)).to.deep.equal(["A", "B", "A", "B", "A", "B"]);
  });

  it("holds at most a key's limit across fylrs; other keys go on; a finish frees a place", async () => {
    await backlog("limited", 6, { fairnessLimit: 2 });
    await backlog("free", 6);
    const a = await queue.claim("fylr-a", "exec", lowest, 3);
    const b = await queue.claim("fylr-b", "exec", lowest, 6);
    const held = [...a, ...b].filter((i) => i.fairnessKey === "limited");
    expect(held).to.have.length(2);
    expect([...a, ...b].filter((i) => i.fairnessKey === "free")).to.have.length(6);
    expect(await queue.claim("fylr-b", "exec", lowest, 6)).to.deep.equal([]);
    await queue.complete(held[0]!, [], undefined);
    const next = await queue.claim("fylr-b", "exec", lowest, 6);
    expect(next.map((i) => i.fairnessKey)).to.deep.equal(["limited"]);
  });

  it("never claims an item twice with several claimers on several keys at once", async () => {
    for (const key of ["", "A", "B", "C"]) await backlog(key, 50, { fairnessLimit: key === "C" ? 3 : undefined });
    const pools = [openPool(url, 2), openPool(url, 2), openPool(url, 2), openPool(url, 2)];
    const seen: string[] = [];
    try {
      await Promise.all(
        pools.map(async (p, i) => {
          const q = new QueueStore(p);
          await q.registerFylr({ id: `c${i}`, hostname: "h", pid: i });
          for (let empty = 0; empty < 5; ) {
            const items = await q.claim(`c${i}`, "exec", lowest, 1 + (i % 4));
            if (items.length === 0) {
              empty += 1;
              await new Promise((r) => setTimeout(r, 10));
              continue;
            }
            empty = 0;
            for (const item of items) {
              seen.push(item.id);
              expect(await q.complete(item, [], undefined)).to.equal(true);
            }
          }
        }),
      );
    } finally {
      await closeAll(...pools);
    }
    expect(seen).to.have.length(200);
    expect(new Set(seen).size).to.equal(200);
  });

  it("counts the items ahead by turns: a lone key's item is near the front of a backlog", async () => {
    await backlog("A", 30);
    const [b0, b1] = await backlog("B", 2);
    const [heavy] = await backlog("H", 1, { fairnessWeight: 3 });
    // Before B's first: one of A's (the turn A takes first) and H's one item.
    expect((await queue.position(b0!))?.aheadInQueue).to.equal(2);
    // Before B's second: B's first, two of A's and H's one.
    expect((await queue.position(b1!))?.aheadInQueue).to.equal(4);
    // H (weight 3): before it, one of A's and one of B's.
    expect((await queue.position(heavy!))?.aheadInQueue).to.equal(2);
    // Without other keys, the count is the plain place in line, as before keys.
    await pool.query("DELETE FROM queue_items WHERE fairness_key <> 'A'");
    const a = (await pool.query<{ id: string }>("SELECT id FROM queue_items ORDER BY seq")).rows.map((r) => r.id);
    expect((await queue.position(a[10]!))?.aheadInQueue).to.equal(10);
  });

  it("claims through indexes: no scan of the queue per claim", async () => {
    await pool.query(`
      INSERT INTO queue_items (kind, priority, payload, state, claimed_by, fairness_key)
      SELECT 'exec', g % 3, '{"calls":[]}', CASE WHEN g % 4 = 0 THEN 'queued' ELSE 'succeeded' END,
             CASE WHEN g % 4 = 0 THEN NULL ELSE 'old' END, 'k' || (g % 50)
      FROM generate_series(1, 40000) g`);
    await pool.query("ANALYZE queue_items; ANALYZE queue_keys");
    const client = await pool.connect();
    const plans: string[] = [];
    const onNotice = (m: { message?: string }): void => void plans.push(m.message ?? "");
    client.on("notice", onNotice);
    try {
      await client.query("LOAD 'auto_explain'");
      await client.query("SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = 'notice'");
      const claimed = await client.query("SELECT * FROM slotbroker_claim_exec('fylr-a', -2147483648, 4)");
      expect(claimed.rowCount).to.equal(4);
    } finally {
      client.off("notice", onNotice);
      client.release(true);
    }
    const inner = plans.filter((p) => !/Function Scan on slotbroker_claim_exec/.test(p));
    expect(inner.length).to.be.greaterThan(3);
    // queue_keys holds one row per key with queued items: small, whatever plan reads it.
    for (const plan of inner) expect(plan, plan).to.not.match(/Seq Scan on queue_items/);
    expect(inner.join("\n")).to.match(/queue_items_key_claim_idx/);
  });
});
