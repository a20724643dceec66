// churn: fylrs connect, park wants and drop without goodbye, in waves, while steady fylrs
// keep working; afterwards every slot, offer and book entry must be back.
//
// Waitgroups (see load/scenarios.ts): fast (noop, shared by everyone), hoard (noop: churners
// take its OFFERs and never answer them) and slow (the real `sleep` command: churners start
// a long job and drop while it runs). The execserver's offerTimeout is far longer than the
// test, so only the drop itself can give a hoarded slot back.
//
// Scenarios:
//   steady   STEADY VUs for the whole run: one stream each, OUTSTANDING wants on fast,
//            JOB after HOLD_MS, re-park on DONE. Every second each VU records whether it
//            was offered a slot in that second (rate steady_served_each_second).
//   churn    ramping-vus waves; every iteration opens a new connection, parks wants on all
//            three waitgroups and drops after a random 0.3–1.5 s, alternately by closing
//            the connection (TCP gone) or by cancelling the stream (RST_STREAM). Ramp-down
//            lets every iteration reach its own drop: a VU that k6 interrupts sees errors
//            k6 makes itself ("context canceled", "Deadline exceeded"), which would hide
//            the stream errors this scenario counts.
//   check    after everything else ended: polls GetStatus until the execserver is idle
//            (no connections, nothing running, offered or parked) or CHECK_TIMEOUT_S passes,
//            then counts what is left.
import { sleep } from 'k6';
import exec from 'k6/execution';
import { Counter, Rate, Trend } from 'k6/metrics';
import grpc from 'k6/net/grpc';
import { CONNECT, brokerClient, envInt, envString, getStatus, sinceStart } from './lib/broker.js';

const ADDR = envString('EXEC_ADDR');
const STEADY = envInt('STEADY', 20);
const OUTSTANDING = envInt('OUTSTANDING', 2);
const HOLD_MS = envInt('HOLD_MS', 10);
const WAVES = envInt('WAVES', 3);
const WAVE_VUS = envInt('WAVE_VUS', 40);
const WAVE_S = envInt('WAVE_S', 8);
const PARK_FAST = envInt('PARK_FAST', 5);
const DROP_MIN_MS = 300;
const DROP_MAX_S = 1.5;
const SLEEP_S = envInt('SLEEP_S', 120);
const CHECK_TIMEOUT_S = envInt('CHECK_TIMEOUT_S', 15);
const WAVES_S = WAVES * WAVE_S;
const STEADY_S = WAVES_S + 4;
const CHECK_AT_S = STEADY_S + 3;

const protocolErrors = new Counter('protocol_errors');
const servedEachSecond = new Rate('steady_served_each_second');
const steadyWait = new Trend('steady_want_wait_ms', true);
const steadyOffers = new Counter('steady_offers');
const churnConnections = new Counter('churn_connections');
const hoardedOffers = new Counter('churn_hoarded_offers');
const slowStarted = new Counter('churn_slow_jobs_started');
const leftConnections = new Counter('leftover_connections');
const leftRunning = new Counter('leftover_running');
const leftOffered = new Counter('leftover_offered');
const leftParked = new Counter('leftover_parked');
const checked = new Counter('final_check_done');

function waves() {
  const stages = [];
  for (let i = 0; i < WAVES; i++) {
    stages.push({ duration: `${Math.round(WAVE_S * 0.25)}s`, target: WAVE_VUS });
    stages.push({ duration: `${Math.round(WAVE_S * 0.5)}s`, target: WAVE_VUS });
    stages.push({ duration: `${Math.round(WAVE_S * 0.25)}s`, target: 0 });
  }
  return stages;
}

export const options = {
  scenarios: {
    steady: { executor: 'per-vu-iterations', vus: STEADY, iterations: 1, maxDuration: `${STEADY_S + 20}s`, exec: 'steady' },
    churn: { executor: 'ramping-vus', startVUs: 0, stages: waves(), gracefulRampDown: `${DROP_MAX_S + 1}s`, gracefulStop: `${DROP_MAX_S + 1}s`, startTime: '2s', exec: 'churn' },
    check: { executor: 'per-vu-iterations', vus: 1, iterations: 1, startTime: `${CHECK_AT_S}s`, maxDuration: `${CHECK_TIMEOUT_S + 10}s`, exec: 'check' },
  },
  thresholds: {
    steady_served_each_second: ['rate==1'],
    steady_offers: ['count>0'],
    churn_connections: [`count>=${WAVES * WAVE_VUS}`],
    churn_hoarded_offers: ['count>0'],
    churn_slow_jobs_started: ['count>0'],
    protocol_errors: ['count==0'],
    leftover_connections: ['count==0'],
    leftover_running: ['count==0'],
    leftover_offered: ['count==0'],
    leftover_parked: ['count==0'],
    final_check_done: ['count==1'],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

const client = brokerClient();

function openStream(name, params = {}) {
  client.connect(ADDR, { plaintext: true, timeout: '20s' });
  return new grpc.Stream(client, CONNECT, { ...params, metadata: { 'slotbroker-client': name } });
}

export function steady() {
  const start = exec.scenario.startTime;
  const index = exec.scenario.iterationInTest;
  const name = `steady-${index}`;
  const stream = openStream(name);
  const parkedAt = new Map();
  let next = 0;
  let ending = false;
  let offeredThisSecond = false;
  const park = () => {
    if (ending) return;
    const jobId = `s${index}-${next++}`;
    parkedAt.set(jobId, Date.now());
    stream.write({ want: { jobId, service: 'fast' } });
  };
  stream.on('data', (frame) => {
    if (frame.hello) {
      while (!ending && parkedAt.size < OUTSTANDING) park();
    } else if (frame.offer) {
      steadyOffers.add(1);
      offeredThisSecond = true;
      steadyWait.add(Date.now() - (parkedAt.get(frame.offer.jobId) || Date.now()));
      const job = { job: { jobId: frame.offer.jobId, offerToken: frame.offer.offerToken, spec: {} } };
      setTimeout(() => stream.write(job), HOLD_MS);
    } else if (frame.done) {
      parkedAt.delete(frame.done.jobId);
      park();
    } else if (frame.reject) {
      protocolErrors.add(1, { what: 'reject' });
      console.error(`${name}: reject ${JSON.stringify(frame.reject)}`);
    }
  });
  stream.on('error', (err) => {
    protocolErrors.add(1, { what: 'stream_error' });
    console.error(`${name}: stream error ${JSON.stringify(err)}`);
  });
  stream.on('end', () => client.close());
  // One sample per second, from the first full second after connecting.
  const tick = setInterval(() => {
    if (sinceStart(start) > 2000) servedEachSecond.add(offeredThisSecond);
    offeredThisSecond = false;
  }, 1000);
  setTimeout(() => {
    ending = true;
    clearInterval(tick);
    stream.end();
  }, STEADY_S * 1000 - sinceStart(start));
}

export function churn() {
  const iteration = exec.scenario.iterationInTest;
  const name = `churn-${iteration}`;
  const dropAfter = DROP_MIN_MS + Math.random() * (DROP_MAX_S * 1000 - DROP_MIN_MS);
  // Odd iterations cancel the stream (RST_STREAM, the TCP connection stays up); even ones
  // close the whole connection. Neither half-closes the stream, so neither says goodbye.
  const cancelStream = iteration % 2 === 1;
  const stream = openStream(name, cancelStream ? { timeout: `${Math.round(dropAfter)}ms` } : {});
  churnConnections.add(1);
  let dropped = false;
  let hello = false;
  stream.on('data', (frame) => {
    if (frame.hello && !hello) {
      hello = true;
      for (let k = 0; k < PARK_FAST; k++) stream.write({ want: { jobId: `f${k}`, service: 'fast' } });
      stream.write({ want: { jobId: 'h', service: 'hoard' } });
      stream.write({ want: { jobId: 'z', service: 'slow' } });
    } else if (frame.offer) {
      const id = frame.offer.jobId;
      if (id === 'h') {
        hoardedOffers.add(1); // never answered: only the drop can free this slot
      } else if (id === 'z') {
        slowStarted.add(1);
        stream.write({ job: { jobId: id, offerToken: frame.offer.offerToken, spec: { args: [String(SLEEP_S)] } } });
      } else {
        stream.write({ job: { jobId: id, offerToken: frame.offer.offerToken, spec: {} } });
      }
    } else if (frame.reject) {
      protocolErrors.add(1, { what: 'reject' });
      console.error(`${name}: reject ${JSON.stringify(frame.reject)}`);
    }
  });
  stream.on('error', (err) => {
    // The deadline this iteration set itself, or the connection it closed itself.
    if (!dropped && !cancelStream) {
      protocolErrors.add(1, { what: 'stream_error' });
      console.error(`${name}: stream error ${JSON.stringify(err)}`);
    }
  });
  stream.on('end', () => client.close());
  if (!cancelStream) {
    setTimeout(() => {
      dropped = true;
      client.close();
    }, dropAfter);
  }
}

export function check() {
  client.connect(ADDR, { plaintext: true, timeout: '20s' });
  const start = Date.now();
  let s;
  for (;;) {
    s = getStatus(client);
    const busy = s.waitgroups.some((w) => w.running > 0 || w.offered > 0 || Number(w.waiting) > 0 || w.book.length > 0);
    if ((!busy && s.connections.length === 0) || Date.now() - start > CHECK_TIMEOUT_S * 1000) break;
    sleep(0.2);
  }
  client.close();
  let running = 0;
  let offered = 0;
  let parked = 0;
  for (const w of s.waitgroups) {
    running += w.running;
    offered += w.offered;
    // waiting and the per-priority book should agree; count both so neither can hide a leak.
    parked += Math.max(Number(w.waiting), w.book.reduce((n, depth) => n + Number(depth.wants), 0));
    if (w.free !== w.processes) console.error(`waitgroup ${w.name}: ${w.free} of ${w.processes} slots free`);
  }
  leftConnections.add(s.connections.length);
  leftRunning.add(running);
  leftOffered.add(offered);
  leftParked.add(parked);
  checked.add(1);
  const summary = s.waitgroups.map((w) => `${w.name} ${w.free}/${w.processes} free, completed ${w.completed}`).join('; ');
  console.log(
    `churn final check after ${Date.now() - start} ms: ${s.connections.length} connections, running ${running}, offered ${offered}, parked ${parked}; ${summary}`,
  );
}
