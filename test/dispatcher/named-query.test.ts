// Rows of named statements (named-query.ts) read through a kept row shape must be exactly
// what node-postgres's own reading makes of them: every column type the queue uses, the
// time zones a server may be set to, and a column set that changed under the same
// statement. Real Postgres.
import { expect } from "chai";
import pg from "pg";
import { namedQuery, parseTimestamptz, statementName } from "../../src/dispatcher/queue/named-query.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool } from "./support.js";

const everyType = `
SELECT gen_random_uuid() AS id, 'exec'::text AS kind, 7::int AS priority, 9000000000::bigint AS lease,
  '{"calls":[{"service":"s","args":["a"],"env":{}}]}'::jsonb AS payload, '\\x00ff'::bytea AS output,
  NULL::text AS error, ARRAY['a','b']::text[] AS events, true AS flag, 1.5::float8 AS ratio,
  $1::timestamptz AS at, NULL::timestamptz AS never, now() AS now, $2::text AS echoed`;

describe("named statements' rows", () => {
  let url: string;
  let pool: pg.Pool;
  before(async () => {
    url = await createTestDatabase("named_query");
    pool = openPool(url, 2);
  });
  after(() => closeAll(pool));

  it("equal node-postgres's own rows for every column type and time zone", async () => {
    const stamps = ["2026-12-07 04:23:11.123456+00", "2026-01-01 00:00:00+00", "2000-02-29 23:59:59.9999+00", "1969-07-20 20:17:40.5+00", "infinity", "-infinity", "0044-03-15 12:00:00+00", "0001-01-01 00:00:00+00 BC"];
    for (const zone of ["UTC", "Asia/Kolkata", "America/St_Johns", "Europe/Amsterdam", "Pacific/Chatham"]) {
      const zoned = new pg.Pool({ connectionString: url, max: 1, options: `-c TimeZone=${zone}` });
      try {
        for (const stamp of [...stamps, "1850-06-01 12:00:00+00"]) {
          const plain = await zoned.query(everyType, [stamp, zone]);
          const named = await namedQuery(zoned, everyType, [stamp, zone]);
          const { id, now, ...rest } = named.rows[0] as Record<string, unknown>;
          const { id: plainId, now: plainNow, ...plainRest } = plain.rows[0] as Record<string, unknown>;
          expect(typeof id).to.equal(typeof plainId);
          expect(now).to.be.an.instanceOf(Date);
          expect(plainNow).to.be.an.instanceOf(Date);
          expect(rest, `${zone} ${stamp}`).to.deep.equal(plainRest);
          expect(Object.keys(named.rows[0] as object)).to.deep.equal(Object.keys(plain.rows[0] as object));
          expect(named.fields.map((f) => f.name)).to.deep.equal(plain.fields.map((f) => f.name));
        }
      } finally {
        await zoned.end();
      }
    }
  });

  it("prepares each text once per connection, under its statement name", async () => {
    const one = new pg.Pool({ connectionString: url, max: 1 });
    try {
      const text = "SELECT $1::int + 1 AS n";
      for (let i = 0; i < 3; i++) expect((await namedQuery<{ n: number }>(one, text, [i])).rows).to.deep.equal([{ n: i + 1 }]);
      const prepared = await one.query<{ name: string; statement: string }>("SELECT name, statement FROM pg_prepared_statements");
      expect(prepared.rows).to.deep.equal([{ name: statementName(text), statement: text }]);
    } finally {
      await one.end();
    }
  });

  it("reads a statement whose columns changed under the same text by its new columns", async () => {
    await pool.query("CREATE TABLE shapes (a int)");
    await pool.query("INSERT INTO shapes VALUES (1)");
    const text = "SELECT * FROM shapes";
    expect((await namedQuery(pool, text, [])).rows).to.deep.equal([{ a: 1 }]);
    await pool.query("ALTER TABLE shapes ADD COLUMN b timestamptz DEFAULT '2026-01-02 03:04:05+00'");
    // A fresh connection prepares the statement anew and describes the new columns.
    const fresh = new pg.Pool({ connectionString: url, max: 1 });
    try {
      expect((await namedQuery(fresh, text, [])).rows).to.deep.equal([{ a: 1, b: new Date("2026-01-02T03:04:05Z") }]);
    } finally {
      await fresh.end();
    }
  });

  it("rejects with the server's error, and the connection stays usable", async () => {
    const err = await namedQuery(pool, "SELECT 1 / $1::int AS x", [0]).then(
      () => undefined,
      (e: unknown) => e as Error & { code?: string },
    );
    expect(err?.code).to.equal("22012");
    expect((await namedQuery<{ x: number }>(pool, "SELECT 1 / $1::int AS x", [1])).rows).to.deep.equal([{ x: 1 }]);
  });

  it("parses timestamptz text as node-postgres does, and leaves other forms to it", () => {
    const parseDate = pg.types.getTypeParser(1184, "text") as (text: string) => Date;
    const same = [
      "2026-12-07 04:23:11.123456+00",
      "2026-12-07 04:23:11+00",
      "2026-12-07 04:23:11.1+05:30",
      "2026-12-07 04:23:11.9999-03:30",
      "1000-01-01 00:00:00-12",
      "9999-12-31 23:59:59.999999+14",
    ];
    for (const text of same) expect(parseTimestamptz(text)?.getTime(), text).to.equal(parseDate(text).getTime());
    const left = ["infinity", "-infinity", "0044-03-15 12:00:00+00", "2026-12-07 04:23:11+00 BC", "1850-06-01 12:19:32+00:19:32", "2026-12-07T04:23:11Z", "2026-12-07 04:23:11.", "2026-12-07 04:23:11+0", "2026-12-07 04:2x:11+00", "12026-12-07 04:23:11+00", ""];
    for (const text of left) expect(parseTimestamptz(text), text).to.equal(undefined);
  });
});
