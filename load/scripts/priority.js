// priority: a few high-priority fylrs park urgent wants into a backlog of low-priority ones;
// every urgent want must be offered before any less urgent want once it is parked.
//
// Each VU is one "world": its own one-slot waitgroup (service prio-<n>) with LOW_STREAMS
// backlog fylrs (priority 0, BACKLOG wants parked each, re-parked on DONE) and
// HIGH_STREAMS urgent fylrs (priorities 5 and 10, in bursts at random intervals). All of
// a world's streams are driven from one VU so that every frame lands in one event loop,
// which makes the order of events exact without comparing clocks:
//   - after parking urgent wants, the urgent stream sends a PING; its PONG proves the
//     server has parked them (frames on a stream are handled in order) — "confirmed";
//   - with one slot, OFFER n+1 can only be sent after the server received the JOB that
//     answered OFFER n, so OFFERs reach this event loop in the order they were made;
//   - an OFFER is an inversion when some more urgent want was confirmed before the JOB
//     that freed this slot was written, and has not been offered yet.
// Wants confirmed only after that JOB are undecidable (the server may legitimately have
// offered the slot before it saw them) and are not counted either way; the counter
// priority_decided says how many urgent wants had to beat the backlog and did.
import exec from 'k6/execution';
import { Counter, Trend } from 'k6/metrics';
import grpc from 'k6/net/grpc';
import { CONNECT, brokerClient, envInt, envString, sinceStart } from './lib/broker.js';

const ADDR = envString('EXEC_ADDR');
const WORLDS = envInt('WORLDS', 2);
const LOW_STREAMS = envInt('LOW_STREAMS', 16);
const HIGH_STREAMS = envInt('HIGH_STREAMS', 3);
const BACKLOG = envInt('BACKLOG', 10);
const DURATION_MS = envInt('DURATION_S', 20) * 1000;
const WARMUP_MS = envInt('WARMUP_S', 2) * 1000;
const BURST_EVERY_MS = envInt('BURST_EVERY_MS', 60);
const MIN_DECIDED = envInt('MIN_DECIDED', 100);
const URGENT = [5, 10];

const inversions = new Counter('priority_inversions');
const decided = new Counter('priority_decided');
const urgentOffers = new Counter('urgent_offers');
const backlogOffers = new Counter('backlog_offers');
const protocolErrors = new Counter('protocol_errors');
const urgentWait = new Trend('urgent_want_wait_ms', true);

export const options = {
  scenarios: {
    worlds: { executor: 'per-vu-iterations', vus: WORLDS, iterations: 1, maxDuration: `${DURATION_MS / 1000 + 30}s`, exec: 'world' },
  },
  thresholds: {
    priority_inversions: ['count==0'],
    priority_decided: [`count>=${MIN_DECIDED}`],
    backlog_offers: ['count>0'],
    protocol_errors: ['count==0'],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

// k6 loads protos only in the init context: one client (one TCP connection) per stream.
const clients = Array.from({ length: LOW_STREAMS + HIGH_STREAMS }, () => brokerClient());

export function world() {
  const start = exec.scenario.startTime;
  const w = exec.scenario.iterationInTest;
  const service = `prio-${w}`;
  let seq = 0; // event order within this world's event loop
  let lastJobSeq = 0; // when the JOB that freed the slot was written
  let ending = false;
  let logged = 0;
  const unoffered = new Map(); // urgent job_id → { priority, confirmSeq, at }
  const counting = () => sinceStart(start) >= WARMUP_MS && !ending;

  // An OFFER for a want of `priority` arrived: was a more urgent want overtaken?
  const checkOffer = (priority) => {
    if (!counting()) return;
    for (const want of unoffered.values()) {
      if (want.priority > priority && want.confirmSeq !== undefined && want.confirmSeq < lastJobSeq) {
        inversions.add(1);
        if (++logged <= 5) console.error(`${service}: priority ${priority} offered while a confirmed priority-${want.priority} want waited`);
        return;
      }
    }
  };

  const open = (client, name, onFrame) => {
    client.connect(ADDR, { plaintext: true, timeout: '20s' });
    const stream = new grpc.Stream(client, CONNECT, { metadata: { 'slotbroker-client': name } });
    stream.on('data', (frame) => {
      if (frame.reject) {
        protocolErrors.add(1, { what: 'reject' });
        console.error(`${name}: reject ${JSON.stringify(frame.reject)}`);
      } else onFrame(frame);
    });
    stream.on('error', (err) => {
      protocolErrors.add(1, { what: 'stream_error' });
      console.error(`${name}: stream error ${JSON.stringify(err)}`);
    });
    stream.on('end', () => client.close());
    return stream;
  };

  const answer = (stream, offer) => {
    stream.write({ job: { jobId: offer.jobId, offerToken: offer.offerToken, spec: {} } });
    lastJobSeq = ++seq;
  };

  const streams = [];
  for (let i = 0; i < LOW_STREAMS; i++) {
    let next = 0;
    let hello = false;
    const park = () => !ending && stream.write({ want: { jobId: `low${i}-${next++}`, service, priority: 0 } });
    const stream = open(clients[i], `${service}-backlog-${i}`, (frame) => {
      if (frame.hello && !hello) {
        hello = true;
        for (let k = 0; k < BACKLOG; k++) park();
      } else if (frame.offer) {
        checkOffer(0);
        if (counting()) backlogOffers.add(1);
        answer(stream, frame.offer);
      } else if (frame.done) park();
    });
    streams.push(stream);
  }

  for (let i = 0; i < HIGH_STREAMS; i++) {
    let next = 0;
    let nonce = 0;
    let started = false;
    const batches = new Map(); // ping nonce → job_ids parked just before it
    const stream = open(clients[LOW_STREAMS + i], `${service}-urgent-${i}`, (frame) => {
      if (frame.hello && !started) {
        started = true;
        burstLater();
      }
      else if (frame.pong) {
        const ids = batches.get(Number(frame.pong.nonce)) || [];
        batches.delete(Number(frame.pong.nonce));
        const at = ++seq;
        for (const id of ids) {
          const want = unoffered.get(id);
          if (want) want.confirmSeq = at;
        }
      } else if (frame.offer) {
        const want = unoffered.get(frame.offer.jobId);
        if (want) {
          checkOffer(want.priority);
          unoffered.delete(frame.offer.jobId);
          if (counting()) {
            urgentOffers.add(1);
            urgentWait.add(Date.now() - want.at);
            // It was parked before the slot was freed, so it had the whole backlog to beat.
            if (want.confirmSeq !== undefined && want.confirmSeq < lastJobSeq) decided.add(1);
          }
        }
        answer(stream, frame.offer);
      }
    });
    const burst = () => {
      if (ending) return;
      const ids = [];
      const size = 1 + Math.floor(Math.random() * 3);
      for (let k = 0; k < size; k++) {
        const jobId = `urgent${i}-${next++}`;
        const priority = URGENT[Math.floor(Math.random() * URGENT.length)];
        unoffered.set(jobId, { priority, confirmSeq: undefined, at: Date.now() });
        ids.push(jobId);
        stream.write({ want: { jobId, service, priority } });
      }
      batches.set(++nonce, ids);
      stream.write({ ping: { nonce: String(nonce) } });
      burstLater();
    };
    function burstLater() {
      setTimeout(burst, Math.random() * 2 * BURST_EVERY_MS);
    }
    streams.push(stream);
  }

  setTimeout(() => {
    ending = true;
    for (const s of streams) s.end();
  }, Math.max(0, DURATION_MS - sinceStart(start)));
}
