// wantbook-scale: the cost of a grant (pop the next want by the grant rule) and of an
// UNWANT (remove an arbitrary parked want) with 10², 10⁴ and 10⁶ wants parked, against the
// 10² case measured in the same run. Goal: 10⁶ ≤ 2× 10² (bench/README.md). Measured twice:
// with the default fairness key only (as a client that sends none), and "keyed", each
// connection spreading its wants over 20 fairness keys of weights 1 to 3.
//   npm run bench -- wantbook-scale
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { WantBook, type ParkedWant } from "../src/execserver/want-book.js";
import { emit } from "./lib/figure.js";

const sizes = [100, 10_000, 1_000_000];
const owners = Array.from({ length: 200 }, (_, i) => ({ id: i }));
const priorities = 4;
const ops = 300_000;
const rounds = 5;

interface Payload {
  jobId: string;
  key: string;
  weight: number;
}

const keysPerConnection = 20;

/** Deterministic PRNG, so every size sees the same operation mix. */
function random(seed: number): () => number {
  return () => {
    seed = (seed * 1664525 + 1013904223) >>> 0;
    return seed / 4294967296;
  };
}

function park(book: WantBook<Payload>, owner: object, priority: number, value: Payload): ParkedWant<Payload> {
  return book.park(owner, priority, value, value.key, value.weight);
}

function fill(n: number, keyed: boolean): { book: WantBook<Payload>; handles: ParkedWant<Payload>[] } {
  const book = new WantBook<Payload>();
  const handles: ParkedWant<Payload>[] = [];
  const rnd = random(n);
  for (let i = 0; i < n; i++) {
    const k = Math.floor(rnd() * keysPerConnection);
    const value = keyed ? { jobId: `job-${i}`, key: `tenant-${k}`, weight: 1 + (k % 3) } : { jobId: `job-${i}`, key: "", weight: 1 };
    handles.push(park(book, owners[i % owners.length]!, Math.floor(rnd() * priorities), value));
  }
  return { book, handles };
}

const maxBatch = 1000;

// Grants: pop the next want by the rule, timed in batches; between batches (untimed) the
// same connections park the popped wants again, so the book size stays at n.
function grantNs(book: WantBook<Payload>): number {
  const batch = Math.min(maxBatch, book.size / 2);
  const popped: ParkedWant<Payload>[] = new Array<ParkedWant<Payload>>(batch);
  let total = 0n;
  for (let done = 0; done < ops; done += batch) {
    const start = process.hrtime.bigint();
    for (let i = 0; i < batch; i++) popped[i] = book.pop()!;
    total += process.hrtime.bigint() - start;
    for (const want of popped) park(book, want.owner, want.priority, want.value);
  }
  return Number(total) / ops;
}

// UNWANTs of arbitrary parked wants, timed in batches; refilled untimed in between.
function unwantNs(book: WantBook<Payload>, handles: ParkedWant<Payload>[]): number {
  const rnd = random(7);
  const batch = Math.min(maxBatch, book.size / 2);
  const picks = new Uint32Array(batch);
  let total = 0n;
  for (let done = 0; done < ops; done += batch) {
    for (let i = 0; i < batch; i++) picks[i] = Math.floor(rnd() * handles.length);
    const start = process.hrtime.bigint();
    for (let i = 0; i < batch; i++) book.remove(handles[picks[i]!]!);
    total += process.hrtime.bigint() - start;
    for (let i = 0; i < batch; i++) {
      const want = handles[picks[i]!]!;
      if (!want.parked) handles[picks[i]!] = park(book, want.owner, want.priority, want.value);
    }
  }
  return Number(total) / ops;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

function measure(keyed: boolean): Map<number, { grant: number; unwant: number; bytesPerWant: number }> {
  const results = new Map<number, { grant: number; unwant: number; bytesPerWant: number }>();
  for (const n of sizes) {
    gc();
    const before = process.memoryUsage().heapUsed;
    const { book } = fill(n, keyed);
    gc();
    const bytesPerWant = (process.memoryUsage().heapUsed - before) / n;
    grantNs(book); // warm-up
    const grant = median(Array.from({ length: rounds }, () => grantNs(book)));
    // Re-collect live handles: grants re-parked wants under new handles.
    const live: ParkedWant<Payload>[] = [];
    for (let w = book.pop(); w; w = book.pop()) live.push(w);
    for (let i = 0; i < live.length; i++) live[i] = park(book, live[i]!.owner, live[i]!.priority, live[i]!.value);
    unwantNs(book, live);
    const unwant = median(Array.from({ length: rounds }, () => unwantNs(book, live)));
    results.set(n, { grant, unwant, bytesPerWant });
    process.stderr.write(`${keyed ? "keyed " : ""}parked=${n} grant=${grant.toFixed(1)}ns unwant=${unwant.toFixed(1)}ns book bytes/want=${bytesPerWant.toFixed(0)}\n`);
  }
  return results;
}

for (const keyed of [false, true]) {
  const results = measure(keyed);
  const prefix = keyed ? "keyed_" : "";
  const base = results.get(sizes[0]!)!;
  for (const n of sizes.slice(1)) {
    const r = results.get(n)!;
    const params = {
      parked: n,
      connections: owners.length,
      priorities,
      keys_per_connection: keyed ? keysPerConnection : 1,
      ops,
      rounds,
      timed: "pop/remove only, refilled untimed every min(1000, n/2)",
      better: "lower",
    };
    emit({ bench: "wantbook-scale", metric: `${prefix}grant_ns_at_${n}`, value: r.grant, baseline: `grant at ${sizes[0]} parked`, baseline_value: base.grant, params });
    emit({ bench: "wantbook-scale", metric: `${prefix}unwant_ns_at_${n}`, value: r.unwant, baseline: `unwant at ${sizes[0]} parked`, baseline_value: base.unwant, params });
  }
  if (keyed) continue;
  const big = results.get(sizes.at(-1)!)!;
  emit({
    bench: "wantbook-scale",
    metric: "book_bytes_per_want",
    value: big.bytesPerWant,
    baseline: "1 KiB budget per parked want",
    baseline_value: 1024,
    params: { parked: sizes.at(-1), note: "want-book entries incl. a small payload; heap delta after gc", better: "lower" },
  });
}
