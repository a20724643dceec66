// broker-fairness: many simulated fylrs, each with its own broker stream to one execserver,
// with skewed demand, sharing one waitgroup of the builtin noop service.
//
// Scenarios (all start at 0 s, so their startTime is the same clock origin):
//   fylrs     VUS VUs, one iteration each: one stream, keeps `target` wants outstanding
//             (parked + offered + running), answers OFFER with JOB, re-parks on DONE.
//             Demand by index: "one" wants 1 at a time, "two" wants 2, "share" wants its
//             whole claim share ceil(capacity / clients) + HEADROOM (recomputed on HELLO).
//   probes    PROBES VUs on a waitgroup with one slot per probe, each with at most one
//             want outstanding: every WANT finds an idle slot, so WANT → OFFER is the
//             broker's own grant latency while the fylrs load the server (what
//             bench/grant-latency measures unloaded).
//   observer  1 VU: GetStatus at the start and end of the steady window [WARMUP, END −
//             COOLDOWN] and every SAMPLE_MS in between; computes Jain's index over the
//             per-connection grants in the window.
//
// "Always had a want parked" is defined as: demand "two" or "share" (so at least one want
// stays parked between an OFFER and its DONE), AND the VU never saw its parked count hit
// 0 at an OFFER inside the window (counter always_parked_gaps, threshold 0), AND the
// observer never sampled wants_parked = 0 for the connection. "one" VUs are excluded by
// construction: between OFFER and the next WANT they have nothing parked.
import { sleep } from 'k6';
import exec from 'k6/execution';
import { Counter, Gauge, Trend } from 'k6/metrics';
import grpc from 'k6/net/grpc';
import { CONNECT, brokerClient, envInt, envString, getStatus, jain, sinceStart, sleepUntil, waitgroupOf } from './lib/broker.js';

const ADDR = envString('EXEC_ADDR');
const VUS = envInt('VUS', 200);
const PROBES = envInt('PROBES', 4);
const DURATION_MS = envInt('DURATION_S', 40) * 1000;
const WARMUP_MS = envInt('WARMUP_S', 10) * 1000;
const WINDOW_END_MS = DURATION_MS - envInt('COOLDOWN_S', 3) * 1000;
const HEADROOM = envInt('HEADROOM', 4);
const SAMPLE_MS = envInt('SAMPLE_MS', 250);
const PROBE_INTERVAL_MS = envInt('PROBE_INTERVAL_MS', 20);
const HOLD_MS = envInt('HOLD_MS', 40);
const LATENCY_P95_MS = envInt('LATENCY_P95_MS', 25);
const MIN_JAIN = Number(__ENV.MIN_JAIN || '0.95');
const SERVICE = 'noop';
const PROBE_SERVICE = 'probe';
const KINDS = ['one', 'two', 'share'];

const protocolErrors = new Counter('protocol_errors');
const jobFailures = new Counter('job_failures');
const alwaysParkedGaps = new Counter('always_parked_gaps');
const windowGrants = new Counter('window_offers');
const wantWait = new Trend('fylr_want_wait_ms', true);
const grantLatency = new Trend('grant_latency_idle_ms', true);
const fairnessJain = new Gauge('fairness_jain');
const fairnessJainAll = new Gauge('fairness_jain_all_fylrs');
const fairnessConnections = new Gauge('fairness_connections');
const fairnessMinGrants = new Gauge('fairness_min_grants');
const fairnessMaxGrants = new Gauge('fairness_max_grants');
const fairnessExcluded = new Gauge('fairness_excluded_connections');
const grantsPerSecond = new Gauge('window_grants_per_s');
const idleWithBacklog = new Counter('idle_slot_with_backlog');
const observed = new Counter('observer_done');

const maxDuration = `${Math.ceil(DURATION_MS / 1000) + 30}s`;
const expectedAlwaysParked = VUS - Math.ceil(VUS / 3);

export const options = {
  scenarios: {
    fylrs: { executor: 'per-vu-iterations', vus: VUS, iterations: 1, maxDuration, exec: 'fylr' },
    probes: { executor: 'per-vu-iterations', vus: PROBES, iterations: 1, maxDuration, exec: 'probe' },
    observer: { executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration, exec: 'observe' },
  },
  thresholds: {
    fairness_jain: [`value>=${MIN_JAIN}`],
    // The fairness set must be (nearly) all "two" and "share" VUs, not a lucky few.
    fairness_connections: [`value>=${Math.floor(expectedAlwaysParked * 0.9)}`],
    observer_done: ['count==1'],
    grant_latency_idle_ms: [`p(95)<${LATENCY_P95_MS}`],
    protocol_errors: ['count==0'],
    job_failures: ['count==0'],
    always_parked_gaps: ['count==0'],
    idle_slot_with_backlog: ['count==0'],
    window_offers: ['count>0'],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

const client = brokerClient();

function inWindow(start) {
  const t = sinceStart(start);
  return t >= WARMUP_MS && t < WINDOW_END_MS;
}

/** Ends the stream (a goodbye: half-close) at DURATION_MS after the scenario start. */
function endAtDuration(stream, start, onEnd) {
  setTimeout(() => {
    onEnd();
    stream.end();
  }, Math.max(0, DURATION_MS - sinceStart(start)));
}

export function fylr() {
  const start = exec.scenario.startTime;
  const index = exec.scenario.iterationInTest;
  const kind = KINDS[index % KINDS.length];
  client.connect(ADDR, { plaintext: true, timeout: '20s' });
  const stream = new grpc.Stream(client, CONNECT, { metadata: { 'slotbroker-client': `fylr-${kind}-${index}` } });
  const jobs = new Map(); // job_id → { state, at }
  let share = 0;
  let parked = 0;
  let seq = 0;
  let ending = false;
  const target = () => (kind === 'one' ? 1 : kind === 'two' ? Math.min(2, share) : share);
  const topUp = () => {
    while (!ending && jobs.size < target()) {
      const jobId = `${index}-${seq++}`;
      jobs.set(jobId, { state: 'parked', at: Date.now() });
      parked++;
      stream.write({ want: { jobId, service: SERVICE } });
    }
  };
  stream.on('data', (frame) => {
    if (frame.hello) {
      const wg = waitgroupOf(frame.hello, SERVICE);
      share = Math.ceil(wg.processes / Math.max(1, frame.hello.clients)) + HEADROOM;
      topUp();
    } else if (frame.offer) {
      const job = jobs.get(frame.offer.jobId);
      if (!job || job.state !== 'parked') {
        protocolErrors.add(1, { what: 'unexpected_offer' });
        return;
      }
      job.state = 'offered';
      parked--;
      if (inWindow(start)) {
        windowGrants.add(1);
        wantWait.add(Date.now() - job.at, { demand: kind });
        if (parked === 0 && kind !== 'one') alwaysParkedGaps.add(1, { demand: kind });
      }
      const answer = { job: { jobId: frame.offer.jobId, offerToken: frame.offer.offerToken, spec: {} } };
      if (HOLD_MS > 0) setTimeout(() => stream.write(answer), HOLD_MS);
      else stream.write(answer);
    } else if (frame.done) {
      if (!jobs.delete(frame.done.jobId)) protocolErrors.add(1, { what: 'unexpected_done' });
      if (frame.done.receipt.exitCode !== 0) jobFailures.add(1);
      topUp();
    } else if (frame.reject) {
      protocolErrors.add(1, { what: 'reject' });
      console.error(`fylr ${index}: reject ${JSON.stringify(frame.reject)}`);
    }
  });
  stream.on('error', (err) => {
    protocolErrors.add(1, { what: 'stream_error' });
    console.error(`fylr ${index}: stream error ${JSON.stringify(err)}`);
  });
  stream.on('end', () => client.close());
  endAtDuration(stream, start, () => (ending = true));
}

export function probe() {
  const start = exec.scenario.startTime;
  const index = exec.scenario.iterationInTest;
  client.connect(ADDR, { plaintext: true, timeout: '20s' });
  const stream = new grpc.Stream(client, CONNECT, { metadata: { 'slotbroker-client': `probe-${index}` } });
  let seq = 0;
  let sentAt = 0;
  let ending = false;
  let hello = false;
  const want = () => {
    if (ending) return;
    sentAt = Date.now();
    stream.write({ want: { jobId: `p${index}-${seq++}`, service: PROBE_SERVICE } });
  };
  stream.on('data', (frame) => {
    if (frame.hello) {
      if (!hello) want();
      hello = true;
    } else if (frame.offer) {
      if (inWindow(start)) grantLatency.add(Date.now() - sentAt);
      stream.write({ job: { jobId: frame.offer.jobId, offerToken: frame.offer.offerToken, spec: {} } });
    } else if (frame.done) {
      setTimeout(want, PROBE_INTERVAL_MS);
    } else if (frame.reject) {
      protocolErrors.add(1, { what: 'reject' });
      console.error(`probe ${index}: reject ${JSON.stringify(frame.reject)}`);
    }
  });
  stream.on('error', (err) => {
    protocolErrors.add(1, { what: 'stream_error' });
    console.error(`probe ${index}: stream error ${JSON.stringify(err)}`);
  });
  stream.on('end', () => client.close());
  endAtDuration(stream, start, () => (ending = true));
}

export function observe() {
  const start = exec.scenario.startTime;
  client.connect(ADDR, { plaintext: true, timeout: '20s' });
  sleepUntil(sleep, start, WARMUP_MS);
  const first = getStatus(client);
  const zeroSeen = new Set();
  let samples = 0;
  while (sinceStart(start) < WINDOW_END_MS - SAMPLE_MS) {
    sleep(SAMPLE_MS / 1000);
    const s = getStatus(client);
    samples++;
    for (const c of s.connections) if (Number(c.wantsParked) === 0) zeroSeen.add(c.connectionId);
    const wg = waitgroupOf(s, SERVICE);
    // Work conservation: a free slot while wants are parked must never be observable.
    if (wg.free > 0 && Number(wg.waiting) > 0) idleWithBacklog.add(1);
  }
  sleepUntil(sleep, start, WINDOW_END_MS);
  const last = getStatus(client);
  client.close();

  const before = new Map(first.connections.map((c) => [c.connectionId, Number(c.grants)]));
  const fair = [];
  const all = [];
  let excluded = 0;
  let rejects = 0;
  for (const c of last.connections) {
    rejects += Number(c.rejects);
    const m = /^fylr-(one|two|share)-\d+$/.exec(c.clientName);
    if (!m || !before.has(c.connectionId)) continue;
    const grants = Number(c.grants) - before.get(c.connectionId);
    all.push(grants);
    if (m[1] === 'one') continue;
    if (zeroSeen.has(c.connectionId)) excluded++;
    else fair.push(grants);
  }
  if (rejects > 0) protocolErrors.add(rejects, { what: 'server_counted_rejects' });
  const index = jain(fair);
  fairnessJain.add(index);
  fairnessJainAll.add(jain(all));
  fairnessConnections.add(fair.length);
  fairnessExcluded.add(excluded);
  grantsPerSecond.add(all.reduce((a, b) => a + b, 0) / ((WINDOW_END_MS - WARMUP_MS) / 1000));
  fairnessMinGrants.add(fair.length ? Math.min(...fair) : 0);
  fairnessMaxGrants.add(fair.length ? Math.max(...fair) : 0);
  observed.add(1);
  console.log(
    `fairness window ${(WINDOW_END_MS - WARMUP_MS) / 1000}s: jain=${index.toFixed(4)} over ${fair.length} always-parked connections ` +
      `(excluded ${excluded}; grants min ${Math.min(...fair)} max ${Math.max(...fair)}); all fylrs jain=${jain(all).toFixed(4)}; ${samples} samples`,
  );
}
