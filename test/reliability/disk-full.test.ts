// One oversize upload must not fill the database's disk. `slotbroker up` — a default
// install, nothing configured — with its embedded Postgres's data directory on a 300 MiB
// filesystem: a 500 MB upload, announced or chunked, is refused with 507 naming the limit
// before the disk fills; Postgres stays healthy; the fylr gives the rolled-back space back
// by itself; later uploads succeed; a restart comes up. (Before reservations, the upload
// got 500 "No space left on device", Postgres PANICked, every later upload failed and the
// restarted server refused to start.)
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import * as http from "node:http";
import { dirname, join } from "node:path";
import { expect } from "chai";
import type pg from "pg";
import { waitFor } from "../../harness/execserver-process.js";
import { release } from "../../harness/resources.js";
import { mountSmallFilesystem, type SmallFilesystem } from "../support/small-filesystem.js";
import { startUp, type Up } from "../support/up-process.js";
import { closeAll, openPool, slotbroker } from "../integration/support.js";

const MiB = 1 << 20;
const oversize = 500_000_000;

interface Answer {
  readonly status: number;
  readonly body: string;
  /** Body bytes the client handed to its socket before the answer came. */
  readonly sent: number;
}

/**
 * PUT /queue/inputs of `bytes` random bytes (incompressible, like the data that filled the
 * disk): announced with Content-Length and Expect: 100-continue, or chunked. Stops sending
 * once the answer arrives.
 */
function upload(api: string, bytes: number, announce: boolean): Promise<Answer> {
  const block = randomBytes(MiB);
  return new Promise((resolve, reject) => {
    let sent = 0;
    let answered = false;
    const headers = announce ? { "content-length": bytes, expect: "100-continue" } : { "transfer-encoding": "chunked" };
    const req = http.request(new URL("/queue/inputs", api), { method: "PUT", headers });
    const pump = (): void => {
      while (!answered && sent < bytes) {
        const piece = block.subarray(0, Math.min(block.length, bytes - sent));
        sent += piece.length;
        if (!req.write(piece)) return void req.once("drain", pump);
      }
      if (!answered) req.end();
    };
    req.on("response", (res) => {
      answered = true;
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (s: string) => (body += s));
      res.on("end", () => {
        resolve({ status: res.statusCode ?? 0, body: body.trim(), sent });
        req.destroy();
      });
    });
    // After a refusal the server closes the connection while the rest of the body is on its way.
    req.on("error", (err) => {
      if (!answered) reject(err);
    });
    if (announce) req.on("continue", pump);
    else pump();
  });
}

describe("reliability: slotbroker up with its database on a 300 MiB filesystem", function () {
  this.timeout(180_000);
  let small: SmallFilesystem;
  let env: NodeJS.ProcessEnv;
  let dataDir: string;
  let up: Up | undefined;
  let pool: pg.Pool | undefined;
  let chunkTableBefore: number;

  const chunkTableSize = async (): Promise<number> => Number((await pool!.query<{ n: string }>("SELECT pg_table_size('blob_chunks') AS n")).rows[0]!.n);
  const count = async (table: "blobs" | "blob_reservations"): Promise<number> => (await pool!.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`)).rows[0]!.n;

  const start = async (): Promise<void> => {
    up = await startUp(env, false, ["--data-dir", dataDir]);
    pool = openPool(up.postgres, 2);
  };
  const stop = async (): Promise<number | null> => {
    await closeAll(pool);
    pool = undefined;
    const code = await up?.stop();
    await release(up);
    up = undefined;
    return code ?? null;
  };

  before(async () => {
    small = await mountSmallFilesystem(300);
    dataDir = join(small.path, "pg");
    env = { ...process.env, SLOTBROKER_STATE_FILE: join(dirname(small.path), "up.json") };
    delete env.DATABASE_URL;
    delete env.SLOTBROKER_DATA_DIR;
    await start();
    chunkTableBefore = await chunkTableSize();
  });
  after(async () => {
    await stop();
    await release(small);
  });

  it("refuses a 500 MB upload announced with Content-Length with 507 naming store.minFreeSpace, before taking its body", async () => {
    const free = small.freeBytes();
    const answer = await upload(up!.api, oversize, true);
    expect(answer.status, answer.body).to.equal(507);
    expect(answer.body).to.match(
      new RegExp(`^500000000 bytes \\(476\\.8 MiB\\) more would leave less than store\\.minFreeSpace \\(10% of 314572800 bytes \\(300\\.0 MiB\\), 31457280 bytes \\(30\\.0 MiB\\)\\) free on the database's filesystem at ${dataDir}: \\d+ bytes`),
    );
    expect(answer.sent, "body bytes sent before the answer").to.equal(0);
    expect(small.freeBytes()).to.be.at.least(free - 16 * MiB);
    expect(await count("blob_reservations")).to.equal(0);
  });

  it("refuses a chunked 500 MB upload with 507 before the disk fills; Postgres stays healthy and the fylr gives the space back by itself", async () => {
    const answer = await upload(up!.api, oversize, false);
    expect(answer.status, answer.body).to.equal(507);
    expect(answer.body).to.match(/^\d+ bytes more would leave less than store\.minFreeSpace \(10% of 314572800 bytes/);
    expect(answer.sent).to.be.below(oversize);
    // The floor held (the last check leaves a WAL segment aside; what was in flight then may still land).
    expect(small.freeBytes(), "free bytes on the database's filesystem").to.be.at.least(16 * MiB);
    // Nothing of it stays: no blob, no reservation; the server answers.
    await waitFor("the upload's reservation to end", async () => (await count("blob_reservations")) === 0, 10_000);
    expect(await count("blobs")).to.equal(0);
    const health = await fetch(`${up!.api}/healthz`);
    expect(health.status, await health.text()).to.equal(200);
    // The rolled-back rows go back to the filesystem through the fylr's own VACUUM.
    await waitFor("the fylr's VACUUM to give the chunk table's space back", async () => (await chunkTableSize()) <= chunkTableBefore + 2 * MiB, 60_000);
  });

  it("takes and runs later uploads", async () => {
    const input = join(dirname(small.path), "input.bin");
    const bytes = randomBytes(4 * MiB);
    writeFileSync(input, bytes);
    // Over 1 MiB, so submit streams it to POST /queue/inputs first.
    const submitted = await slotbroker(["submit", "--api", up!.api, "--service", "wc", "--arg=-c", "--stdin", input, "--wait"]);
    expect(submitted.code, submitted.stderr).to.equal(0);
    expect(submitted.stdout.toString().trim()).to.equal(String(bytes.length));
  });

  it("comes up again after a restart, and takes uploads", async () => {
    expect(await stop()).to.equal(0);
    await start();
    try {
      const answer = await upload(up!.api, 2 * MiB, true);
      expect(answer.status, answer.body).to.equal(201);
      const usage = (await pool!.query<{ stored: string; sum: string }>("SELECT (SELECT stored FROM blob_usage) AS stored, (SELECT sum(size) FROM blobs) AS sum")).rows[0]!;
      expect(usage.stored).to.equal(usage.sum);
    } finally {
      // Started in this test, so stopped in it.
      expect(await stop()).to.equal(0);
    }
  });
});
