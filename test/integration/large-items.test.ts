// Inputs and outputs of any size through the whole queue, with real processes: a
// `slotbroker execserver` child, `slotbroker fylr` children, the `slotbroker` CLI, raw
// HTTP clients, one Postgres. The size is LARGE_ITEM_SIZE: every test moves that much when
// it is set (1GiB on a workstation takes several minutes on 2 cores); unset, `npm test`
// moves 48 MiB through the memory test and 16 MiB through the others, where the size adds
// chunks, not cases.
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, createReadStream, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import * as net from "node:net";
import { Readable } from "node:stream";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type pg from "pg";
import { ItemState } from "../../gen/slotbroker/v1/queue_pb.js";
import { parseByteSize } from "../../src/shared/config-parsing.js";
import { freePort } from "../../src/shared/free-port.js";
import { slotbrokerArgs } from "../../harness/node-children.js";
import { spawnExecserver, waitFor, type ExecserverProcess } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, fastFylrConfig, openPool, root, spawnFylr, type FylrProcess } from "./support.js";

const MiB = 1 << 20;
const bigSize = parseByteSize(process.env.LARGE_ITEM_SIZE ?? "48MiB") ?? 48 * MiB;
const size = process.env.LARGE_ITEM_SIZE ? bigSize : 16 * MiB;
// Scales with the size: 1 GiB on a busy 2-core machine takes minutes per pass.
const slow = 60_000 + Math.ceil(bigSize / MiB) * 1500;

/** A file of `bytes` random bytes (1 MiB blocks, each different) and its SHA-256. */
function makeFile(dir: string, name: string, bytes: number): { path: string; sha256: string } {
  const path = join(dir, name);
  const fd = openSync(path, "w");
  const hash = createHash("sha256");
  try {
    for (let left = bytes; left > 0; left -= MiB) {
      const block = randomBytes(Math.min(MiB, left));
      hash.update(block);
      writeSync(fd, block);
    }
  } finally {
    closeSync(fd);
  }
  return { path, sha256: hash.digest("hex") };
}

async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path, { highWaterMark: MiB }) as AsyncIterable<Buffer>) hash.update(chunk);
  return hash.digest("hex");
}

/** `slotbroker ARGS…` with its stdout going straight to a file (never into this process's memory). */
function cliToFile(args: readonly string[], stdoutPath: string, timeoutMs: number): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const out = openSync(stdoutPath, "w");
    const child = spawn(process.execPath, slotbrokerArgs(args), { cwd: root, stdio: ["ignore", out, "pipe"] });
    closeSync(out);
    let stderr = "";
    child.stderr!.setEncoding("utf8").on("data", (s: string) => (stderr = (stderr + s).slice(-20_000)));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stderr });
    });
  });
}

/** Peak resident memory of a process so far, from the kernel (VmHWM), in bytes. */
function peakRss(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? 0) * 1024;
}

/**
 * Stored rows, the store's transactions still open on the server, and those of them
 * writing chunks (their last statement an INSERT INTO blob_chunks).
 */
async function storeState(pool: pg.Pool): Promise<{ blobs: number; chunks: number; openWrites: number; writingChunks: number }> {
  const r = await pool.query<{ blobs: number; chunks: number; open: number; writing: number }>(`
    SELECT (SELECT count(*)::int FROM blobs) AS blobs, (SELECT count(*)::int FROM blob_chunks) AS chunks, open.n AS open, open.writing
    FROM (SELECT count(*)::int AS n, count(*) FILTER (WHERE query LIKE 'INSERT INTO blob_chunks%')::int AS writing
          FROM pg_stat_activity WHERE application_name LIKE 'slotbroker-store%' AND xact_start IS NOT NULL) open`);
  const row = r.rows[0]!;
  return { blobs: row.blobs, chunks: row.chunks, openWrites: row.open, writingChunks: row.writing };
}

/**
 * Bytes in the data files of blob_chunks and its TOAST table after a VACUUM, which drops
 * the dead rows of a rolled-back write and truncates the emptied pages at the end.
 * (Index pages are freed for reuse but not returned, so indexes are left out.) With the
 * VACUUM's own report, for a failure to explain itself.
 *
 * INDEX_CLEANUP ON: when an autovacuum got there first and cleared most pages, the few
 * pages it left with dead line pointers are under Postgres's 2 % threshold, a plain VACUUM
 * skips the index pass and keeps them, and those pages near the end block the truncation
 * for good (seen in CI: 16 such pages kept ~1 GB on disk).
 */
async function chunkBytesOnDisk(pool: pg.Pool): Promise<{ bytes: number; report: string }> {
  const client = await pool.connect();
  const notices: string[] = [];
  const onNotice = (n: { message?: string }): void => void notices.push(n.message ?? "");
  client.on("notice", onNotice);
  try {
    await client.query("VACUUM (VERBOSE, INDEX_CLEANUP ON, TRUNCATE ON) blob_chunks");
    const sql = "SELECT pg_relation_size(c.oid) + pg_relation_size(c.reltoastrelid) AS n FROM pg_class c WHERE c.relname = 'blob_chunks'";
    return { bytes: Number((await client.query<{ n: string }>(sql)).rows[0]!.n), report: notices.join("\n") };
  } finally {
    client.off("notice", onNotice);
    client.release();
  }
}

/**
 * Waits until VACUUM brings the chunk files back to `limit` bytes. The truncation at the
 * end of a VACUUM is skipped whenever it cannot take its lock at once, and one VACUUM of a
 * gigabyte of dead rows takes seconds on a busy host, so this tries for up to two minutes;
 * what it last saw (the VACUUM's report, the sessions and their locks) goes into the
 * assertion's message.
 */
async function expectChunkFilesBackTo(pool: pg.Pool, limit: number): Promise<void> {
  let last = { bytes: 0, report: "" };
  const done = await waitFor(`blob_chunks back to ${limit} bytes`, async () => (last = await chunkBytesOnDisk(pool)).bytes <= limit, 120_000, 500).catch(() => false);
  if (done) return;
  const sessions = await pool.query("SELECT pid, application_name, state, xact_start, backend_xmin, left(query, 80) AS query FROM pg_stat_activity WHERE datname = current_database()");
  const locks = await pool.query("SELECT l.pid, l.mode, l.granted, c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname LIKE 'blob%' OR c.relname LIKE 'pg_toast%'");
  expect(last.bytes, `blob_chunks still has ${last.bytes} bytes on disk.\nLast VACUUM:\n${last.report}\nSessions: ${JSON.stringify(sessions.rows)}\nLocks: ${JSON.stringify(locks.rows)}`).to.be.at.most(limit);
}

/** A raw HTTP/1.1 upload of `announced` bytes that sends `sent` of them and then drops the connection. */
async function cutUpload(url: string, announced: number | undefined, sent: number): Promise<void> {
  const { hostname, port } = new URL(url);
  const socket = net.connect(Number(port), hostname);
  await new Promise((r) => socket.once("connect", r));
  const head = announced === undefined ? "transfer-encoding: chunked" : `content-length: ${announced}`;
  socket.write(`POST /queue/inputs HTTP/1.1\r\nhost: ${hostname}\r\n${head}\r\n\r\n`);
  const block = randomBytes(MiB);
  for (let left = sent; left > 0; left -= MiB) {
    const piece = block.subarray(0, Math.min(MiB, left));
    const framed = announced === undefined ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from("\r\n")]) : piece;
    if (!socket.write(framed)) await new Promise((r) => socket.once("drain", r));
  }
  socket.destroy();
}

describe(`large items through the queue (${Math.round(bigSize / MiB)} MiB, ${Math.round(size / MiB)} MiB)`, function () {
  this.timeout(slow * 3);
  let dir: string;
  let databaseUrl: string;
  let pool: pg.Pool;
  let exec: ExecserverProcess | undefined;
  let fylrs: FylrProcess[] = [];
  let input: { path: string; sha256: string };
  let bigInput: { path: string; sha256: string };

  before(async function () {
    this.timeout(slow);
    dir = mkdtempSync(join(tmpdir(), "slotbroker-large-"));
    input = makeFile(dir, "input.bin", size);
    bigInput = bigSize === size ? input : makeFile(dir, "big-input.bin", bigSize);
    databaseUrl = await createTestDatabase("large");
    // One execserver for the file; each test starts its own fylrs on empty tables.
    exec = await spawnExecserver({
      instanceId: "exec-large",
      waitgroups: { files: { processes: 4 } },
      services: {
        cat: { waitgroup: "files", command: ["cat"], timeout: "30m" },
        // cat with a 2 s pause halfway: a window in which the output is being written.
        pausecat: { waitgroup: "files", command: ["sh", "-c", `dd bs=1048576 count=${Math.floor(size / 2 / MiB)} iflag=fullblock status=none && sleep 2 && exec cat`], timeout: "30m" },
        sha256sum: { waitgroup: "files", command: ["sha256sum"], timeout: "30m" },
        gzip: { waitgroup: "files", command: ["gzip", "-1"], timeout: "30m" },
        gunzip: { waitgroup: "files", command: ["gunzip"], timeout: "30m" },
      },
    });
  });
  after(async () => {
    await closeAll(exec);
    rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(async () => {
    pool = openPool(databaseUrl);
    // The first fylr migrates; later tests start from empty tables.
    await pool.query("DO $$ BEGIN IF to_regclass('blob_reservations') IS NOT NULL THEN TRUNCATE queue_items, fylrs, blobs, blob_reservations CASCADE; END IF; END $$");
  });
  afterEach(async () => {
    await closeAll(...fylrs, pool);
    fylrs = [];
  });

  const startFylr = async (name: string, addresses = [exec!.grpcAddress], store: Record<string, unknown> = {}): Promise<FylrProcess> => {
    const fylr = await spawnFylr(fastFylrConfig(databaseUrl, addresses, { store: { stallTimeout: "10s", ...store } }), name);
    fylrs.push(fylr);
    return fylr;
  };

  it("an input through sha256sum gives its digest, with the fylr's memory flat", async () => {
    const fylr = await startFylr("fa");
    const out = join(dir, "digest.txt");
    const r = await cliToFile(["submit", "--api", fylr.url, "--service", "sha256sum", "--stdin", bigInput.path, "--wait"], out, slow);
    expect(r.code, r.stderr).to.equal(0);
    expect(readFileSync(out, "utf8")).to.equal(`${bigInput.sha256}  -\n`);
    const rss = peakRss(fylr.child.pid!);
    process.stderr.write(`      fylr peak RSS ${Math.round(rss / MiB)} MiB for ${Math.round(bigSize / MiB)} MiB in\n`);
    expect(rss).to.be.below(300 * MiB);
  });

  it("an output through cat comes back byte-identical via submit --wait, slotbroker output and a Range GET", async () => {
    const fylr = await startFylr("fa");
    const viaWait = join(dir, "via-wait.bin");
    const r = await cliToFile(["submit", "--api", fylr.url, "--service", "cat", "--stdin", input.path, "--wait"], viaWait, slow);
    expect(r.code, r.stderr).to.equal(0);
    expect(await sha256File(viaWait)).to.equal(input.sha256);
    const id = /item (\S+)/.exec(r.stderr)![1]!;
    const { item } = await fylr.client.get({ id });
    expect(item).to.deep.include({ state: ItemState.SUCCEEDED, outputStored: true, outputSize: BigInt(size), outputSha256: input.sha256 });
    const viaOutput = join(dir, "via-output.bin");
    const o = await cliToFile(["output", "--api", fylr.url, id, "-o", viaOutput], join(dir, "output.stdout"), slow);
    expect(o.code, o.stderr).to.equal(0);
    expect(await sha256File(viaOutput)).to.equal(input.sha256);
    const ranged = await fetch(`${fylr.url}/queue/items/${id}/output`, { headers: { range: `bytes=${size - 3 * MiB - 7}-${size - MiB}` } });
    expect(ranged.status).to.equal(206);
    const want = Buffer.alloc(2 * MiB + 8);
    const fd = openSync(input.path, "r");
    const { readSync } = await import("node:fs");
    readSync(fd, want, 0, want.length, size - 3 * MiB - 7);
    closeSync(fd);
    expect(Buffer.from(await ranged.arrayBuffer()).equals(want)).to.equal(true);
    const rss = peakRss(fylr.child.pid!);
    process.stderr.write(`      fylr peak RSS ${Math.round(rss / MiB)} MiB for ${Math.round(size / MiB)} MiB in and out\n`);
    expect(rss).to.be.below(300 * MiB);
  });

  it("a chain cat → gzip → gunzip → sha256sum passes each stdout on through the store and keeps no intermediate", async () => {
    const fylr = await startFylr("fa");
    const out = join(dir, "chain.txt");
    const r = await cliToFile(["submit", "--api", fylr.url, "--service", "cat", "--stdin", input.path, "--then", "gzip", "--then", "gunzip", "--then", "sha256sum", "--wait"], out, slow * 2);
    expect(r.code, r.stderr).to.equal(0);
    expect(readFileSync(out, "utf8")).to.equal(`${input.sha256}  -\n`);
    // The input upload stays with the item; the three large stdouts between calls are gone, the last output is inline.
    await waitFor("intermediates deleted", async () => (await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blobs WHERE role = 'intermediate'")).rows[0]!.n === 0, 10_000);
    const roles = (await pool.query<{ role: string }>("SELECT role FROM blobs")).rows.map((row) => row.role);
    expect(roles).to.deep.equal(["input"]);
    expect(peakRss(fylr.child.pid!)).to.be.below(300 * MiB);
  });

  it("an item submitted to fylr A and claimed by fylr B reads its input", async () => {
    // A reaches no execserver, so it can never claim the item; B can. (A port outside the
    // kernel's ephemeral range: no server of port 0 comes up there meanwhile.)
    const a = await startFylr("fa", [`127.0.0.1:${await freePort()}`]);
    const b = await startFylr("fb");
    const out = join(dir, "digest-ab.txt");
    const r = await cliToFile(["submit", "--api", a.url, "--service", "sha256sum", "--stdin", input.path, "--wait"], out, slow);
    expect(r.code, r.stderr).to.equal(0);
    expect(readFileSync(out, "utf8")).to.equal(`${input.sha256}  -\n`);
    const rows = (await pool.query<{ claimed_by: string }>("SELECT claimed_by FROM queue_items")).rows;
    expect(rows.map((row) => row.claimed_by)).to.deep.equal([b.id]);
  });

  it("an upload cut off halfway leaves no item and no stored bytes", async () => {
    const fylr = await startFylr("fa");
    await waitFor("the schema", async () => (await pool.query<{ t: string | null }>("SELECT to_regclass('blob_chunks') AS t")).rows[0]!.t !== null);
    const before = (await chunkBytesOnDisk(pool)).bytes;
    const half = Math.max(4 * MiB, Math.floor(size / 2 / MiB) * MiB);
    await cutUpload(fylr.url, 2 * half, half);
    await cutUpload(fylr.url, undefined, half);
    // The snapshot that saw both writes gone: a later look may catch another process's
    // short-lived write (a sweep, the next fylr), which is not what this test is about.
    const state = await waitFor("the cut-off uploads rolled back", async () => {
      const now = await storeState(pool);
      return now.openWrites === 0 ? now : undefined;
    }, 30_000);
    expect(state).to.deep.equal({ blobs: 0, chunks: 0, openWrites: 0, writingChunks: 0 });
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items")).rows[0]!.n).to.equal(0);
    await expectChunkFilesBackTo(pool, before + MiB);
  });

  it("refuses an upload over store.maxItemBytes at once, naming the limit", async () => {
    const fylr = await startFylr("fa", undefined, { maxItemBytes: "1MiB" });
    const res = await fetch(`${fylr.url}/queue/inputs`, { method: "POST", body: Buffer.alloc(MiB + 1), headers: { "content-type": "application/octet-stream" } });
    expect(res.status).to.equal(413);
    expect(await res.text()).to.match(/1048577 bytes, over the 1048576-byte limit per item \(store\.maxItemBytes\)/);
  });

  it("a fylr killed mid-upload leaves nothing behind", async () => {
    const fylr = await startFylr("fa");
    await waitFor("the schema", async () => (await pool.query<{ t: string | null }>("SELECT to_regclass('blob_chunks') AS t")).rows[0]!.t !== null);
    const before = (await chunkBytesOnDisk(pool)).bytes;
    // 4 MiB, then the sender holds the rest back: the kill lands mid-stream with chunks written.
    const block = randomBytes(MiB);
    const body = Readable.from((async function* () {
      for (let i = 0; i < 4; i++) yield block;
      await new Promise(() => undefined);
    })());
    const upload = fetch(`${fylr.url}/queue/inputs`, { method: "POST", body: body as never, duplex: "half" }).catch((e: unknown) => e);
    await waitFor("the upload writing chunks", async () => (await storeState(pool)).writingChunks > 0, 30_000);
    await fylr.stop("SIGKILL");
    expect(await upload).to.be.instanceOf(Error);
    await waitFor("the server rolled the write back", async () => (await storeState(pool)).openWrites === 0, 30_000);
    expect(await storeState(pool)).to.deep.equal({ blobs: 0, chunks: 0, openWrites: 0, writingChunks: 0 });
    await expectChunkFilesBackTo(pool, before + MiB);
  });

  it("a fylr killed mid-output leaves nothing stranded: a survivor reruns the item and only its input and output stay", async () => {
    const a = await startFylr("fa");
    const submitted = join(dir, "submit-kill.txt");
    const s = await cliToFile(["submit", "--api", a.url, "--service", "pausecat", "--stdin", input.path], submitted, slow);
    expect(s.code, s.stderr).to.equal(0);
    const id = readFileSync(submitted, "utf8").trim();
    // Its output is being written when the store has two transactions open (reading the
    // input, writing the output); pausecat holds them open for 2 s halfway through.
    await waitFor("the output being written", async () => (await storeState(pool)).writingChunks >= 1, slow);
    await a.stop("SIGKILL");
    await waitFor("the killed fylr's writes rolled back", async () => (await storeState(pool)).openWrites === 0, 30_000);
    const b = await startFylr("fb");
    const rerun = await waitFor("the item rerun by the survivor", async () => {
      const { item } = await b.client.get({ id });
      return item?.state === ItemState.SUCCEEDED ? item : undefined;
    }, slow);
    expect(rerun.attempts, "the killed attempt and the survivor's").to.equal(2);
    const rows = (await pool.query<{ role: string; size: string; owned: boolean; expires: boolean }>(
      "SELECT role, size, item_id IS NOT NULL AS owned, expires_at IS NOT NULL AS expires FROM blobs ORDER BY role",
    )).rows;
    expect(rows).to.deep.equal([
      { role: "input", size: String(size), owned: true, expires: false },
      { role: "output", size: String(size), owned: true, expires: false },
    ]);
    // Two blobs of the default 256 KiB chunks, and not one chunk more.
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks")).rows[0]!.n).to.equal(2 * Math.ceil(size / (256 * 1024)));
    const out = join(dir, "rerun.bin");
    const o = await cliToFile(["output", "--api", b.url, id, "-o", out], join(dir, "rerun.stdout"), slow);
    expect(o.code, o.stderr).to.equal(0);
    expect(await sha256File(out)).to.equal(input.sha256);
  });
});
