// store.maxTotalBytes across fylrs, with real processes: two `slotbroker fylr` children on
// one Postgres, raw HTTP clients, curl killed mid-upload, an execserver whose job prints
// past the quota. Every write reserves its bytes before it stores them, so what one fylr
// is writing counts on the other; the reservation ends with the write, or with its fylr;
// rolled-back bytes go back to the filesystem through the fylr's own VACUUM.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import * as http from "node:http";
import * as net from "node:net";
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { requireTool } from "../../harness/system-tools.js";
import { closeAll, fastFylrConfig, openPool, spawnFylr, type FylrProcess } from "./support.js";

const MiB = 1 << 20;

/** A raw HTTP/1.1 upload: the head, then body bytes as the test sends them; `answer` is the response text. */
async function rawUpload(url: string, announced: number | undefined): Promise<{ send(bytes: number): Promise<void>; answer: Promise<string>; socket: net.Socket }> {
  const { hostname, port } = new URL(url);
  const socket = net.connect(Number(port), hostname);
  await new Promise((r) => socket.once("connect", r));
  let text = "";
  const answer = new Promise<string>((resolve) => {
    socket.on("data", (b: Buffer) => (text += b.toString("latin1")));
    socket.once("close", () => resolve(text));
  });
  socket.on("error", () => undefined);
  const head = announced === undefined ? "transfer-encoding: chunked" : `content-length: ${announced}`;
  socket.write(`PUT /queue/inputs HTTP/1.1\r\nhost: ${hostname}\r\n${head}\r\nconnection: close\r\n\r\n`);
  const block = randomBytes(MiB);
  const send = async (bytes: number): Promise<void> => {
    for (let left = bytes; left > 0; left -= MiB) {
      const piece = block.subarray(0, Math.min(MiB, left));
      const framed = announced === undefined ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from("\r\n")]) : piece;
      if (!socket.write(framed)) await new Promise((r) => socket.once("drain", r));
    }
  };
  return { send, answer, socket };
}

/**
 * PUT /queue/inputs with Content-Length and Expect: 100-continue, as curl sends a large
 * body: a refusal arrives before the body is sent. Status and text.
 */
function put(url: string, bytes: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}/queue/inputs`, { method: "PUT", headers: { "content-length": bytes, expect: "100-continue" } });
    req.once("continue", () => req.end(randomBytes(bytes)));
    req.once("response", (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (s: string) => (text += s));
      res.once("end", () => resolve({ status: res.statusCode ?? 0, text: text.trim() }));
    });
    req.once("error", reject);
    req.flushHeaders();
  });
}

describe("store quota across fylrs, with real processes", function () {
  this.timeout(120_000);
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess | undefined;
  let fylrs: FylrProcess[] = [];

  before(async () => {
    databaseUrl = await createTestDatabase("store_quota");
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    await pool.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
    exec = await spawnExecserver({
      instanceId: "exec-quota",
      waitgroups: { w: { processes: 2 } },
      services: { "print-100mb": { waitgroup: "w", command: ["head", "-c", "100000000", "/dev/urandom"] } },
    });
  });
  afterEach(async () => {
    await closeAll(...fylrs, exec, pool);
    fylrs = [];
    exec = undefined;
  });

  const startFylr = async (name: string): Promise<FylrProcess> => {
    const store = { maxTotalBytes: "64MiB", stallTimeout: "10s", vacuumAfterBytes: "8MiB", vacuumInterval: "1s" };
    const fylr = await spawnFylr(fastFylrConfig(databaseUrl, [exec!.grpcAddress], { store }), name);
    fylrs.push(fylr);
    return fylr;
  };
  const reservations = async (): Promise<{ n: number; bytes: number }> => {
    const row = (await pool.query<{ n: number; bytes: string }>("SELECT count(*)::int AS n, coalesce(sum(bytes), 0) AS bytes FROM blob_reservations")).rows[0]!;
    return { n: row.n, bytes: Number(row.bytes) };
  };
  const chunkTableSize = async (): Promise<number> => Number((await pool.query<{ n: string }>("SELECT pg_table_size('blob_chunks') AS n")).rows[0]!.n);

  it("an upload in progress on one fylr counts on another: what does not fit beside it gets 507 naming the limit and the numbers", async () => {
    const a = await startFylr("fa");
    const b = await startFylr("fb");
    const held = await rawUpload(a.url, 40 * MiB);
    await held.send(8 * MiB);
    const writing = "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE 'slotbroker-store%' AND xact_start IS NOT NULL";
    await waitFor("A's upload being written", async () => (await pool.query<{ n: number }>(writing)).rows[0]!.n === 1, 10_000);
    const refused = await put(b.url, 30 * MiB);
    expect(refused.status, refused.text).to.equal(507);
    expect(refused.text).to.equal(
      "31457280 bytes (30.0 MiB) more do not fit under store.maxTotalBytes (67108864 bytes (64.0 MiB)): the store holds 0 bytes and writes in progress reserve 41943040 bytes (40.0 MiB)",
    );
    await held.send(32 * MiB);
    expect(await held.answer).to.match(/^HTTP\/1\.1 201 /);
    expect(await reservations()).to.deep.equal({ n: 0, bytes: 0 });
    expect((await put(b.url, 20 * MiB)).status).to.equal(201);
    const full = await put(b.url, 5 * MiB);
    expect(full.status).to.equal(507);
    expect(full.text).to.match(/the store holds 62914560 bytes \(60\.0 MiB\) and writes in progress reserve 0 bytes$/);
  });

  it("a client killed mid-upload leaves no blob and no reservation, and the fylr gives its space back by itself", async () => {
    const curl = requireTool("curl");
    const a = await startFylr("fa");
    await waitFor("the schema", async () => (await pool.query<{ t: string | null }>("SELECT to_regclass('blob_chunks') AS t")).rows[0]!.t !== null);
    const before = await chunkTableSize();
    const client = spawn(curl, ["-sS", "-T", "-", `${a.url}/queue/inputs`], { stdio: ["pipe", "ignore", "ignore"] });
    client.stdin.on("error", () => undefined);
    const block = randomBytes(MiB);
    let sent = 0;
    const exited = new Promise((r) => client.once("exit", r));
    const pump = (): void => {
      while (sent < 200 * MiB && client.stdin.writable) {
        sent += MiB;
        if (!client.stdin.write(block)) return void client.stdin.once("drain", pump);
      }
    };
    pump();
    await waitFor("24 MiB of the upload stored", async () => (await chunkTableSize()) > before + 24 * MiB, 30_000);
    expect((await reservations()).n).to.equal(1);
    client.kill("SIGKILL");
    await exited;
    await waitFor("the fylr's VACUUM to give the space back", async () => (await chunkTableSize()) <= before + 2 * MiB, 60_000);
    expect(await reservations()).to.deep.equal({ n: 0, bytes: 0 });
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blobs")).rows[0]!.n).to.equal(0);
  });

  it("a fylr killed mid-upload: a survivor ends its reservation once its heartbeat is stale, and gives the space back", async () => {
    const a = await startFylr("fa");
    const b = await startFylr("fb");
    const before = await chunkTableSize();
    const cut = await rawUpload(a.url, undefined);
    await cut.send(24 * MiB);
    await waitFor("16 MiB of the upload stored", async () => (await chunkTableSize()) > before + 16 * MiB, 30_000);
    expect((await pool.query<{ fylr_id: string }>("SELECT fylr_id FROM blob_reservations")).rows).to.deep.equal([{ fylr_id: a.id }]);
    await a.stop("SIGKILL");
    cut.socket.destroy();
    // Its reservation outlives it until the stale-heartbeat sweep (staleAfter 2 s) removed its row.
    // The space may come back first (autovacuum can beat the survivor's VACUUM), so wait for both.
    await waitFor("the survivor to end the reservation", async () => (await reservations()).n === 0, 60_000);
    await waitFor("the space to be given back", async () => (await chunkTableSize()) <= before + 2 * MiB, 60_000);
    expect(await reservations()).to.deep.equal({ n: 0, bytes: 0 });
    expect(b.stderr()).to.match(/ended the store reservations of fylrs that are gone/);
    expect((await put(b.url, 60 * MiB)).status).to.equal(201);
  });

  it("a job whose stdout passes the quota fails for good, naming store.maxTotalBytes; nothing of its output stays", async () => {
    const a = await startFylr("fa");
    const { item } = await a.client.submit({ calls: [{ service: "print-100mb" }], maxAttempts: 3 });
    const done = await waitFor(
      "the item to fail",
      async () => {
        const { item: now } = await a.client.get({ id: item!.id });
        return now?.state === ItemState.FAILED || now?.state === ItemState.SUCCEEDED ? now : undefined;
      },
      60_000,
    );
    expect(done.state).to.equal(ItemState.FAILED);
    expect(done.attempts).to.equal(1);
    expect(done.error).to.match(/^calls\[0\] \(print-100mb\): stdout: \d+ bytes (\([\d.]+ MiB\) )?more do not fit under store\.maxTotalBytes \(67108864 bytes \(64\.0 MiB\)\)/);
    await waitFor("the output's reservation to end", async () => (await reservations()).n === 0, 15_000);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blobs")).rows[0]!.n).to.equal(0);
  });
});
