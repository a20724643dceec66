// Child process of bench/connections: holds many broker streams to one execserver and
// obeys one JSON command per stdin line, answering with one JSON line on stdout:
//   {"cmd":"open","count":N,"batch":B,"pauseMs":P}  opens N streams, B at a time with a
//        pause between batches; answers {"ev":"opened"} once each has its first HELLO
//   {"cmd":"park","perStream":K,"service":S}         parks K wants on every stream; answers
//        {"ev":"parked","wants":W} with W the wants written to streams still open
//   {"cmd":"expect","clients":X}                     answers {"ev":"seen","last":T} once
//        every stream's latest HELLO says X clients; T = when the last of them arrived
//   {"cmd":"hellos"}                                 answers {"ev":"hellos","count":C}
//   {"cmd":"status"}                                 answers {"ev":"status","open":O,"closed":X,
//        "rejects":{CODE:N},"closeReasons":{REASON:N}}: what went wrong so far, if anything
// Exits when stdin closes.
//   node --import tsx bench/lib/connections-client.ts ADDRESS TAG
import { createInterface } from "node:readline";
import { RejectCode } from "../../gen/slotbroker/v1/broker_pb.js";
import { encodeWant } from "../../src/fylr/broker/frames.js";
import { sleep } from "../../src/shared/abort.js";
import { epochMs, H2BrokerStream } from "./h2-broker-stream.js";

interface Tracked {
  readonly stream: H2BrokerStream;
  clients: number;
  helloAt: number;
}

const [address, tag] = process.argv.slice(2);
const streams: Tracked[] = [];
let hellos = 0;
// A Reject (e.g. BOOK_FULL) means a want will never park: counted so the bench can say so.
const rejects: Record<string, number> = {};

function reply(message: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

function openOne(): Tracked {
  const tracked: Tracked = { stream: undefined as unknown as H2BrokerStream, clients: -1, helloAt: 0 };
  (tracked as { stream: H2BrokerStream }).stream = H2BrokerStream.open(address!, (frame) => {
    if (frame.frame.case === "reject") {
      const code = RejectCode[frame.frame.value.code] ?? String(frame.frame.value.code);
      rejects[code] = (rejects[code] ?? 0) + 1;
      return;
    }
    if (frame.frame.case !== "hello") return;
    hellos++;
    tracked.clients = frame.frame.value.clients;
    tracked.helloAt = epochMs();
  });
  return tracked;
}

async function waitUntil(done: () => boolean): Promise<void> {
  while (!done()) await sleep(5);
}

async function run(command: { cmd: string; [key: string]: unknown }): Promise<void> {
  switch (command.cmd) {
    case "open": {
      const count = Number(command.count);
      const batch = Number(command.batch);
      const started = streams.length;
      for (let opened = 0; opened < count; opened += batch) {
        const fresh: Tracked[] = [];
        for (let i = 0; i < Math.min(batch, count - opened); i++) fresh.push(openOne());
        streams.push(...fresh);
        await waitUntil(() => fresh.every((t) => t.helloAt > 0 || t.stream.closed));
        await sleep(Number(command.pauseMs));
      }
      const closed = streams.slice(started).filter((t) => t.stream.closed).length;
      return reply({ ev: "opened", count: streams.length - started, closed });
    }
    case "park": {
      const perStream = Number(command.perStream);
      let n = 0;
      for (const [s, t] of streams.entries()) {
        for (let i = 0; i < perStream; i++) t.stream.write(encodeWant(`${tag}-${s}-${i}`, String(command.service), n++ % 4));
        // Let the socket drain now and then instead of queueing everything in memory.
        if (s % 100 === 99) await sleep(1);
      }
      const open = streams.filter((t) => !t.stream.closed).length;
      return reply({ ev: "parked", wants: open * perStream, written: n });
    }
    case "expect": {
      const clients = Number(command.clients);
      await waitUntil(() => streams.every((t) => t.clients === clients || t.stream.closed));
      return reply({ ev: "seen", last: Math.max(...streams.map((t) => t.helloAt)) });
    }
    case "hellos":
      return reply({ ev: "hellos", count: hellos });
    case "status": {
      const closeReasons: Record<string, number> = {};
      for (const t of streams) if (t.stream.closed) closeReasons[t.stream.closeReason] = (closeReasons[t.stream.closeReason] ?? 0) + 1;
      const closed = Object.values(closeReasons).reduce((a, b) => a + b, 0);
      return reply({ ev: "status", open: streams.length - closed, closed, rejects, closeReasons });
    }
    default:
      throw new Error(`unknown command ${command.cmd}`);
  }
}

const lines = createInterface({ input: process.stdin });
let queue = Promise.resolve();
lines.on("line", (line) => {
  queue = queue.then(() => run(JSON.parse(line) as { cmd: string })).catch((err: unknown) => {
    process.stderr.write(`connections-client ${tag}: ${(err as Error).stack}\n`);
    process.exit(1);
  });
});
lines.on("close", () => process.exit(0));
