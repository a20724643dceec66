// The store for inputs and outputs of any size, against a real Postgres: chunked writes in
// one transaction, binary COPY reads of any byte range, limits (reserved before a byte is
// written, across stores of several fylrs), the disk floor, the VACUUM of rolled-back
// writes, adoption, expiry, retention.
import { createHash, randomBytes } from "node:crypto";
import { statfsSync } from "node:fs";
import { tmpdir } from "node:os";
import { Readable } from "node:stream";
import { finished, pipeline } from "node:stream/promises";
import { expect } from "chai";
import type pg from "pg";
import { BlobStore, CopyBinaryDecoder, ItemControlStore, migrate, OutputSink, QueueStore, StoreLimitError, normalizeSubmit, createDefaultActions, storeConfig, inlineOutput, type StoreConfig } from "../../src/dispatcher/index.js";
import { ifRangeHolds, parseRange } from "../../src/app/index.js";
import { waitFor } from "../../harness/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { closeAll, openPool } from "./support.js";

const KiB = 1024;

async function readAll(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of stream as AsyncIterable<Buffer>) parts.push(chunk);
  return Buffer.concat(parts);
}

async function write(store: BlobStore, bytes: Buffer, options: Parameters<BlobStore["createWriter"]>[0] = { role: "input" }): Promise<string> {
  const writer = store.createWriter(options);
  // Odd piece sizes, so chunk boundaries never line up with writes.
  await pipeline(Readable.from(pieces(bytes, 7777)), writer);
  return writer.result!.id;
}

function* pieces(bytes: Buffer, size: number): Generator<Buffer> {
  for (let i = 0; i < bytes.length; i += size) yield bytes.subarray(i, i + size);
}

describe("blob store", () => {
  let pool: pg.Pool;
  let databaseUrl: string;
  const make = (overrides: Partial<StoreConfig> = {}): BlobStore => new BlobStore(pool, storeConfig({ chunkBytes: 64 * KiB, ...overrides }), "test-fylr");

  before(async () => {
    databaseUrl = await createTestDatabase("blobs");
    await migrate(databaseUrl);
    pool = openPool(databaseUrl, 6);
  });
  beforeEach(async () => {
    await pool.query("TRUNCATE queue_items, fylrs, blobs, blob_reservations CASCADE");
  });
  after(async () => {
    await closeAll(pool);
  });

  it("stores bytes in chunk rows and reads back any range byte for byte", async () => {
    const store = make();
    const bytes = randomBytes(5 * 64 * KiB + 12345);
    const id = await write(store, bytes);
    const info = (await store.info(id))!;
    expect(info).to.include({ size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex"), role: "input", chunkBytes: 64 * KiB });
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks WHERE blob_id = $1", [id])).rows[0]!.n).to.equal(6);
    expect((await readAll(store.read(info))).equals(bytes)).to.equal(true);
    for (const [start, end] of [[0, 1], [1, 64 * KiB], [64 * KiB - 1, 64 * KiB + 1], [100_000, 300_001], [bytes.length - 5, bytes.length], [3, 3]] as const) {
      expect((await readAll(store.read(info, { start, end }))).equals(bytes.subarray(start, end)), `${start}-${end}`).to.equal(true);
    }
    expect(() => store.read(info, { start: 0, end: bytes.length + 1 })).to.throw(/outside blob/);
  });

  it("stores an empty blob", async () => {
    const store = make();
    const id = await write(store, Buffer.alloc(0));
    const info = (await store.info(id))!;
    expect(info.size).to.equal(0);
    expect((await readAll(store.read(info))).length).to.equal(0);
  });

  it("leaves nothing when a write is destroyed halfway", async () => {
    const store = make();
    const writer = store.createWriter({ role: "input" });
    writer.on("error", () => undefined);
    writer.write(randomBytes(200 * KiB));
    // Let the write get under way (chunks on their way to the database) before it is cut.
    await new Promise((r) => setTimeout(r, 200));
    writer.destroy(new Error("cut off"));
    await finished(writer).catch(() => undefined);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blobs")).rows[0]!.n).to.equal(0);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks")).rows[0]!.n).to.equal(0);
  });

  it("refuses an announced size over maxItemBytes before taking a byte, and a longer body when it passes the limit", async () => {
    const store = make({ maxItemBytes: 100 * KiB });
    const early = store.createWriter({ role: "input", expectedBytes: 100 * KiB + 1 });
    const err = await finished(early).then(() => undefined, (e: unknown) => e);
    expect(err).to.be.instanceOf(StoreLimitError);
    expect((err as Error).message).to.match(/over the 102400-byte limit per item \(store\.maxItemBytes\)/);
    const late = await write(store, randomBytes(150 * KiB)).then(() => undefined, (e: unknown) => e);
    expect(late).to.be.instanceOf(StoreLimitError);
    expect((await store.usage()).blobs).to.equal(0);
  });

  it("refuses a write that would pass maxTotalBytes, naming the limit and the numbers", async () => {
    const store = make({ maxTotalBytes: 300 * KiB });
    await write(store, randomBytes(200 * KiB));
    const early = store.createWriter({ role: "input", expectedBytes: 200 * KiB });
    const err = (await finished(early).then(() => undefined, (e: unknown) => e)) as StoreLimitError;
    expect(err.limit).to.equal("store.maxTotalBytes");
    expect(err.message).to.equal("204800 bytes more do not fit under store.maxTotalBytes (307200 bytes): the store holds 204800 bytes and writes in progress reserve 0 bytes");
    const unannounced = (await write(store, randomBytes(200 * KiB)).then(() => undefined, (e: unknown) => e)) as StoreLimitError;
    expect(unannounced.limit).to.equal("store.maxTotalBytes");
    expect((await store.usage()).blobs).to.equal(1);
  });

  it("a full store refuses a body of unknown size before its first byte", async () => {
    const store = make({ maxTotalBytes: 200 * KiB });
    await write(store, randomBytes(200 * KiB));
    const writer = store.createWriter({ role: "input" });
    writer.on("error", () => undefined);
    const refused = await writer.opened;
    expect(refused?.message).to.equal("1 byte more does not fit under store.maxTotalBytes (204800 bytes): the store holds 204800 bytes and writes in progress reserve 0 bytes");
    expect(writer.size).to.equal(0);
  });

  it("a write in progress holds its announced size: another fylr's write is refused for it until the first commits", async () => {
    const other = openPool(databaseUrl, 4);
    try {
      const a = make({ maxTotalBytes: 300 * KiB });
      const b = new BlobStore(other, storeConfig({ chunkBytes: 64 * KiB, maxTotalBytes: 300 * KiB }), "other-fylr");
      const first = a.createWriter({ role: "input", expectedBytes: 200 * KiB });
      const bytes = randomBytes(200 * KiB);
      first.write(bytes.subarray(0, 100 * KiB));
      await first.opened;
      expect(await b.room.quota()).to.deep.equal({ stored: 0, reserved: 200 * KiB, writes: 1 });
      const refused = b.createWriter({ role: "input", expectedBytes: 150 * KiB });
      const err = (await finished(refused).then(() => undefined, (e: unknown) => e)) as StoreLimitError;
      expect(err.message).to.equal("153600 bytes more do not fit under store.maxTotalBytes (307200 bytes): the store holds 0 bytes and writes in progress reserve 204800 bytes");
      first.end(bytes.subarray(100 * KiB));
      await finished(first);
      // The commit moved the bytes from reserved to stored in one step.
      expect(await b.room.quota()).to.deep.equal({ stored: 200 * KiB, reserved: 0, writes: 0 });
      await write(b, randomBytes(100 * KiB));
      expect(await b.room.quota()).to.deep.equal({ stored: 300 * KiB, reserved: 0, writes: 0 });
    } finally {
      await closeAll(other);
    }
  });

  it("a body of unknown size is refused the moment it would pass maxTotalBytes; nothing of it stays, nor its reservation", async () => {
    const store = make({ maxTotalBytes: 300 * KiB });
    await write(store, randomBytes(100 * KiB));
    const writer = store.createWriter({ role: "input" });
    const err = (await pipeline(Readable.from(pieces(randomBytes(2048 * KiB), 7777)), writer).then(() => undefined, (e: unknown) => e)) as StoreLimitError;
    expect(err.limit).to.equal("store.maxTotalBytes");
    expect(err.message).to.match(/^\d+ bytes more do not fit under store\.maxTotalBytes \(307200 bytes\): the store holds 102400 bytes/);
    // Refused when it crossed the limit, not at its end.
    expect(writer.size).to.be.at.most(200 * KiB + 7777);
    await waitFor("the reservation ended", async () => (await store.room.quota()).writes === 0, 10_000);
    expect(await store.room.quota()).to.deep.equal({ stored: 100 * KiB, reserved: 0, writes: 0 });
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blobs")).rows[0]!.n).to.equal(1);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM blob_chunks")).rows[0]!.n).to.equal(2);
  });

  it("ends the reservations of a fylr that is gone, and no others", async () => {
    await pool.query("INSERT INTO fylrs (id, hostname, pid) VALUES ('live-fylr', 'h', 1)");
    const gone = new BlobStore(pool, storeConfig({ chunkBytes: 64 * KiB }), "gone-fylr");
    const live = new BlobStore(pool, storeConfig({ chunkBytes: 64 * KiB }), "live-fylr");
    const dead = gone.createWriter({ role: "input", expectedBytes: 200 * KiB });
    const running = live.createWriter({ role: "input", expectedBytes: 100 * KiB });
    await Promise.all([dead.opened, running.opened]);
    expect(await live.room.reclaim()).to.deep.equal({ fylrs: ["gone-fylr"], reservations: 1, bytes: 200 * KiB });
    expect(await live.room.quota()).to.deep.equal({ stored: 0, reserved: 100 * KiB, writes: 1 });
    dead.destroy();
    running.end(randomBytes(100 * KiB));
    await finished(running);
    await finished(dead).catch(() => undefined);
    await waitFor("every reservation ended", async () => (await live.room.quota()).writes === 0, 10_000);
  });

  it("counts committed bytes through commits, deletes, the sweep, an item's cascade and a TRUNCATE", async () => {
    const store = make({ orphanTtlMs: 100 });
    const stored = async (): Promise<number> => (await store.room.quota()).stored;
    const one = await write(store, randomBytes(70 * KiB));
    const two = await write(store, randomBytes(30 * KiB));
    expect(await stored()).to.equal(100 * KiB);
    await store.delete(two);
    expect(await stored()).to.equal(70 * KiB);
    const queue = new QueueStore(pool);
    const { item } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    await write(store, randomBytes(10 * KiB), { role: "output", itemId: item.id });
    expect(await stored()).to.equal(80 * KiB);
    await pool.query("DELETE FROM queue_items WHERE id = $1", [item.id]);
    expect(await stored()).to.equal(70 * KiB);
    // Time passing is the thing under test: past the orphan TTL.
    await new Promise((r) => setTimeout(r, 200));
    expect((await store.sweep()).blobs).to.equal(1);
    expect(await store.info(one)).to.equal(undefined);
    expect(await stored()).to.equal(0);
    await write(store, randomBytes(5 * KiB));
    await pool.query("TRUNCATE queue_items, blobs CASCADE");
    expect(await stored()).to.equal(0);
  });

  it("refuses a write that would leave less than store.minFreeSpace free on the database's filesystem", async () => {
    const dir = tmpdir();
    const fs = statfsSync(dir);
    const free = fs.bavail * fs.bsize;
    const tight = make({ diskPath: dir, minFreeSpace: { bytes: free + 1024 * 1024 * KiB } });
    const err = (await finished(tight.createWriter({ role: "input", expectedBytes: 10 * KiB })).then(() => undefined, (e: unknown) => e)) as StoreLimitError;
    expect(err.limit).to.equal("store.minFreeSpace");
    expect(err.message).to.match(new RegExp(`^10240 bytes more would leave less than store\\.minFreeSpace \\(\\d+ bytes \\(\\d+\\.\\d MiB\\)\\) free on the database's filesystem at ${dir}: \\d+ bytes .* are free`));
    // A body of unknown size is refused before its first byte too.
    const chunked = (await write(tight, randomBytes(10 * KiB)).then(() => undefined, (e: unknown) => e)) as StoreLimitError;
    expect(chunked.limit).to.equal("store.minFreeSpace");
    const share = make({ diskPath: dir, minFreeSpace: { percent: 99.999 } });
    expect(((await write(share, randomBytes(10 * KiB)).then(() => undefined, (e: unknown) => e)) as Error).message).to.match(/store\.minFreeSpace \(99\.999% of \d+ bytes/);
    const roomy = make({ diskPath: dir, minFreeSpace: { bytes: 0 } });
    expect((await roomy.info(await write(roomy, randomBytes(10 * KiB))))?.size).to.equal(10 * KiB);
    await waitFor("every reservation ended", async () => (await roomy.room.quota()).writes === 0, 10_000);
    const missing = make({ diskPath: "/nonexistent/slotbroker" });
    expect(((await missing.room.checkDiskPath().then(() => undefined, (e: unknown) => e)) as Error).message).to.match(/^store\.diskPath: cannot read the free space at \/nonexistent\/slotbroker/);
  });

  it("a VACUUM after a rolled-back write gives its space back to the filesystem", async () => {
    const store = make({ vacuumAfterBytes: 1024 * KiB, vacuumIntervalMs: 60_000 });
    const size = async (): Promise<number> => Number((await pool.query<{ n: string }>("SELECT pg_table_size('blob_chunks') AS n")).rows[0]!.n);
    await pool.query("VACUUM blob_chunks");
    const before = await size();
    const writer = store.createWriter({ role: "input" });
    writer.on("error", () => undefined);
    for (let i = 0; i < 64; i++) writer.write(randomBytes(64 * KiB));
    await waitFor("2 MiB of chunks written", async () => (await size()) > before + 2048 * KiB, 20_000);
    expect(store.room.vacuumDue()).to.equal(false);
    writer.destroy(new Error("cut off"));
    await finished(writer).catch(() => undefined);
    expect(store.room.vacuumDue()).to.equal(true);
    // The server ends the write once it sees the connection gone; a VACUUM cannot truncate the table while that transaction holds it.
    const open = "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL";
    await waitFor("the write rolled back", async () => (await pool.query<{ n: number }>(open)).rows[0]!.n === 0, 10_000);
    const report = await store.room.vacuum();
    // Noted counts chunk payload, the table size also counts page overhead: past vacuumAfterBytes is what matters.
    expect(report.noted).to.be.at.least(1024 * KiB);
    // Its free-space and visibility maps stay (a few pages).
    expect(report.afterBytes).to.be.at.most(before + 256 * KiB);
    expect(await size()).to.be.at.most(before + 256 * KiB);
    // At most one per vacuumInterval.
    store.room.noteDead(2048 * KiB);
    expect(store.room.vacuumDue()).to.equal(false);
  });

  it("a submit adopts an upload once; an unadopted upload expires; an adopted one outlives its expiry", async () => {
    const store = make({ orphanTtlMs: 300 });
    const queue = new QueueStore(pool);
    const adopted = await write(store, randomBytes(10 * KiB));
    const orphan = await write(store, randomBytes(10 * KiB));
    const submit = (id: string) =>
      queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "upload", id } }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    const { item } = await submit(adopted);
    const again = await submit(adopted).then(() => undefined, (e: unknown) => e as Error);
    expect(again?.message).to.match(/no upload .* to take: it never completed, expired unused \(store\.orphanTtl\), or another item took it/);
    expect((await pool.query<{ n: number }>("SELECT count(*)::int AS n FROM queue_items")).rows[0]!.n).to.equal(1);
    // Time passing is the thing under test: past the orphan TTL.
    await new Promise((r) => setTimeout(r, 400));
    expect(await store.sweep()).to.deep.equal({ blobs: 1, bytes: 10 * KiB });
    expect(await store.info(orphan)).to.equal(undefined);
    expect((await store.info(adopted))?.itemId).to.equal(item.id);
    // Deleting the item deletes its stored data.
    await pool.query("DELETE FROM queue_items WHERE id = $1", [item.id]);
    expect(await store.info(adopted)).to.equal(undefined);
  });

  it("an adopted upload learns when its item finished and that a retry runs it again; an unadopted blob of the item never does", async () => {
    const store = make();
    const queue = new QueueStore(pool);
    const control = new ItemControlStore(pool);
    await pool.query("INSERT INTO fylrs (id, hostname, pid) VALUES ('f', 'h', 1)");
    const input = await write(store, randomBytes(10 * KiB));
    const opts = { maxInputBytes: 1024, defaultMaxAttempts: 1 };
    const { item } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {}, stdin: { kind: "upload", id: input } }] }, createDefaultActions(), opts));
    const { item: plain } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), opts));
    const loose = await write(store, randomBytes(1 * KiB), { role: "intermediate", itemId: item.id });
    const finishedAt = async (id: string): Promise<Date | null> =>
      (await pool.query<{ at: Date | null }>("SELECT item_finished_at AS at FROM blobs WHERE id = $1", [id])).rows[0]!.at;
    for (const claimed of await queue.claim("f", "exec", -1000, 2)) expect(await queue.failAttempt(claimed, [], "no", 0, true)).to.equal("failed");
    const row = (await queue.get(item.id))!;
    expect(row.state).to.equal("failed");
    expect((await finishedAt(input))?.getTime()).to.equal(row.finishedAt!.getTime());
    expect((await queue.get(plain.id))!.state).to.equal("failed");
    expect(await finishedAt(loose)).to.equal(null);
    await control.retry(item.id);
    expect(await finishedAt(input)).to.equal(null);
  });

  it("keeps a recorded output until the retention after its item finished, then deletes it", async () => {
    const store = make({ retentionMs: 300, inlineBytes: 1 * KiB });
    const queue = new QueueStore(pool);
    const n = normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 });
    const { item } = await queue.submit(n);
    await pool.query("INSERT INTO fylrs (id, hostname, pid) VALUES ('f', 'h', 1)");
    const [claimed] = await queue.claim("f", "exec", -1000, 1);
    const sink = new OutputSink(store, { role: "output", itemId: item.id, inlineBytes: 1 * KiB });
    const bytes = randomBytes(100 * KiB);
    await pipeline(Readable.from(pieces(bytes, 5000)), sink);
    const output = sink.output!;
    expect(output.blobId).to.be.a("string");
    expect(output.bytes.equals(bytes.subarray(0, KiB))).to.equal(true);
    expect(await queue.complete(claimed!, [], output)).to.equal(true);
    const stored = (await queue.get(item.id))!;
    expect(stored).to.include({ outputBlob: output.blobId, outputSize: bytes.length, outputSha256: createHash("sha256").update(bytes).digest("hex") });
    expect((await store.info(output.blobId!))?.expiresAt).to.equal(undefined);
    expect((await store.sweep()).blobs).to.equal(0);
    // Time passing is the thing under test: past the retention.
    await new Promise((r) => setTimeout(r, 400));
    expect((await store.sweep()).blobs).to.equal(1);
    expect(await store.info(output.blobId!)).to.equal(undefined);
  });

  it("an output no completion recorded expires as an orphan", async () => {
    const store = make({ orphanTtlMs: 200 });
    const queue = new QueueStore(pool);
    const { item } = await queue.submit(normalizeSubmit({ calls: [{ service: "cat", args: [], env: {} }] }, createDefaultActions(), { maxInputBytes: 1024, defaultMaxAttempts: 3 }));
    const id = await write(store, randomBytes(70 * KiB), { role: "output", itemId: item.id });
    // Time passing is the thing under test: past the orphan TTL.
    await new Promise((r) => setTimeout(r, 300));
    expect((await store.sweep()).blobs).to.equal(1);
    expect(await store.info(id)).to.equal(undefined);
    expect(await store.deleteForItem(item.id)).to.equal(0);
  });

  it("keeps small outputs in memory with their size and digest", async () => {
    const sink = new OutputSink(make(), { role: "output", itemId: "00000000-0000-4000-8000-000000000000", inlineBytes: 1 * KiB });
    await pipeline(Readable.from([Buffer.from("hello ")], { objectMode: false }), sink);
    expect(sink.output).to.deep.equal(inlineOutput(Buffer.from("hello ")));
  });
});

describe("binary COPY decoding", () => {
  it("passes the data through however the input is split", async () => {
    const header = Buffer.concat([Buffer.from("PGCOPY\n\xff\r\n\0", "latin1"), Buffer.from([0, 0, 0, 0, 0, 0, 0, 4, 9, 9, 9, 9])]);
    const rows = [randomBytes(1000), Buffer.alloc(0), randomBytes(3)];
    const framed = Buffer.concat([
      header,
      ...rows.flatMap((r) => {
        const h = Buffer.alloc(6);
        h.writeInt16BE(1, 0);
        h.writeInt32BE(r.length, 2);
        return [h, r];
      }),
      Buffer.from([0xff, 0xff]),
    ]);
    for (const size of [1, 2, 5, 19, 1000, framed.length]) {
      const out = await readAll(Readable.from(pieces(framed, size)).pipe(new CopyBinaryDecoder()));
      expect(out.equals(Buffer.concat(rows)), `pieces of ${size}`).to.equal(true);
    }
    const cut = await readAll(Readable.from([framed.subarray(0, framed.length - 4)]).pipe(new CopyBinaryDecoder())).then(() => undefined, (e: unknown) => e as Error);
    expect(cut?.message).to.match(/ended early/);
  });
});

describe("Range headers", () => {
  it("reads one byte range and refuses ranges outside the body", () => {
    expect(parseRange(undefined, 10)).to.equal(undefined);
    expect(parseRange("bytes=2-4", 10)).to.deep.equal({ start: 2, end: 5 });
    expect(parseRange("bytes=7-", 10)).to.deep.equal({ start: 7, end: 10 });
    expect(parseRange("bytes=-3", 10)).to.deep.equal({ start: 7, end: 10 });
    expect(parseRange("bytes=5-100", 10)).to.deep.equal({ start: 5, end: 10 });
    expect(parseRange("bytes=10-", 10)).to.equal("invalid");
    expect(parseRange("bytes=0-1,4-5", 10)).to.equal(undefined);
  });

  it("lets a Range through an If-Range only for the same strong tag or the exact Last-Modified", () => {
    const tag = '"abc"';
    const date = "Tue, 03 Jun 2025 10:00:00 GMT";
    expect(ifRangeHolds(undefined, tag, date)).to.equal(true);
    expect(ifRangeHolds('"abc"', tag, date)).to.equal(true);
    expect(ifRangeHolds(' "abc" ', tag, date)).to.equal(true);
    expect(ifRangeHolds('W/"abc"', tag, date)).to.equal(false);
    expect(ifRangeHolds('"abd"', tag, date)).to.equal(false);
    expect(ifRangeHolds('"abc"', undefined, date)).to.equal(false);
    expect(ifRangeHolds(date, tag, date)).to.equal(true);
    expect(ifRangeHolds("Tue, 03 Jun 2025 10:00:01 GMT", tag, date)).to.equal(false);
    expect(ifRangeHolds(date, tag, undefined)).to.equal(false);
    expect(ifRangeHolds("soon", tag, date)).to.equal(false);
  });
});
