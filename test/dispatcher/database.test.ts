// A fylr (or `slotbroker migrate`) pointed at a database that does not exist creates it when
// its role may, and otherwise says what to run.
import { expect } from "chai";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { ensureDatabase } from "../../src/dispatcher/index.js";
import { slotbroker } from "../integration/support.js";
import { createTestDatabase } from "../support/postgres.js";

function withDatabase(url: string, name: string, user?: { name: string; password: string }): string {
  const u = new URL(url);
  u.pathname = `/${name}`;
  if (user) {
    u.username = user.name;
    u.password = user.password;
  }
  return u.toString();
}

async function query(url: string, sql: string): Promise<pg.QueryResult<Record<string, unknown>>> {
  const client = new pg.Client(url);
  await client.connect();
  try {
    return await client.query<Record<string, unknown>>(sql);
  } finally {
    await client.end();
  }
}

describe("a missing database", function () {
  this.timeout(60_000);
  let server: string;
  before(async () => {
    server = await createTestDatabase("dbcreate");
  });

  it("is created when the role may create databases, once even when fylrs race", async () => {
    const name = `created_${randomBytes(4).toString("hex")}`;
    const url = withDatabase(server, name);
    const outcomes = await Promise.all([ensureDatabase(url), ensureDatabase(url), ensureDatabase(url)]);
    expect(outcomes.filter((o) => o === "created")).to.have.length(1);
    expect((await query(url, "select current_database() as db")).rows[0]!.db).to.equal(name);
    expect(await ensureDatabase(url)).to.equal("exists");
  });

  it("names the database, the role and the statement to run when the role may not create it", async () => {
    const role = { name: `nocreate_${randomBytes(4).toString("hex")}`, password: "pw" };
    await query(server, `CREATE ROLE ${role.name} LOGIN PASSWORD '${role.password}' NOCREATEDB`);
    const url = withDatabase(server, "missing_db", role);
    const err = await ensureDatabase(url).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).to.contain('database "missing_db" does not exist').and.to.contain(`role "${role.name}" may not create databases`);
    expect(err?.message).to.contain(`CREATE DATABASE "missing_db" OWNER "${role.name}"`);
  });

  it("`slotbroker migrate` creates it, then migrates", async () => {
    const name = `cli_${randomBytes(4).toString("hex")}`;
    const result = await slotbroker(["migrate", "--database-url", withDatabase(server, name)]);
    expect(result.code, result.stderr).to.equal(0);
    expect(result.stdout.toString()).to.match(new RegExp(`^created database ${name}\\nschema version \\d+`));
  });
});
