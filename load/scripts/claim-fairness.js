// claim-fairness: several real fylr processes share one Postgres and two execservers; k6
// submits items over the QueueService JSON API at a steady rate. Submissions are skewed
// on purpose: SUBMIT_SKEW of them (default 70 %) go to the first fylr, the rest round-robin
// to the others — a fylr that is woken by its own submissions must still not take more
// than its claim share. Each item runs `sleep JOB_S` on an execserver, so slots, not the
// claim loop, are the bottleneck and a backlog builds up: how much each fylr gets is then
// decided by the claim share and the broker's round-robin, not by who saw the item first.
//
// Scenarios:
//   submit  constant-arrival-rate, RATE items/s for SUBMIT_S; every Submit must create an
//           item (an idempotency key per iteration makes HTTP retries harmless).
//   settle  afterwards, polls Stats on every fylr until at least RATE × SUBMIT_S items have
//           finished, none is held and the count stayed put for a few polls (or
//           DRAIN_TIMEOUT_S), then compares each fylr's claimedTotal with the mean: the
//           largest relative deviation must stay within MAX_DEVIATION.
// The runner then checks that finished == submitted (k6 may start one iteration more
// than RATE × SUBMIT_S) and the database: every item succeeded with exactly one attempt
// and one claim (lease 1), by one of the fylrs.
import { sleep } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';
import { Counter, Gauge, Rate } from 'k6/metrics';
import { envInt, envString } from './lib/broker.js';

const FYLRS = envString('FYLR_ADDRS').split(',');
const RATE = envInt('RATE', 40);
const SUBMIT_S = envInt('SUBMIT_S', 30);
const JOB_S = __ENV.JOB_S || '0.5';
const DRAIN_TIMEOUT_S = envInt('DRAIN_TIMEOUT_S', 60);
const MAX_DEVIATION = Number(__ENV.MAX_DEVIATION || '0.25');
const RUN = __ENV.RUN_ID || 'run';
const SKEW = Number(__ENV.SUBMIT_SKEW || '0.7');
const EXPECTED = RATE * SUBMIT_S;

const submitted = new Counter('items_submitted');
const submitOk = new Rate('submit_ok');
const finished = new Gauge('items_finished');
const failed = new Gauge('items_failed');
const deviation = new Gauge('claim_max_deviation');
const minClaims = new Gauge('claims_min');
const maxClaims = new Gauge('claims_max');
const settled = new Counter('settle_done');

export const options = {
  scenarios: {
    submit: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: `${SUBMIT_S}s`,
      preAllocatedVUs: Math.max(10, Math.ceil(RATE / 2)),
      maxVUs: Math.max(50, RATE * 2),
      exec: 'submit',
    },
    settle: { executor: 'per-vu-iterations', vus: 1, iterations: 1, startTime: `${SUBMIT_S + 1}s`, maxDuration: `${DRAIN_TIMEOUT_S + 15}s`, exec: 'settle' },
  },
  thresholds: {
    submit_ok: ['rate==1'],
    items_submitted: [`count>=${EXPECTED}`],
    dropped_iterations: ['count==0'],
    items_finished: [`value>=${EXPECTED}`],
    items_failed: ['value==0'],
    claim_max_deviation: [`value<=${MAX_DEVIATION}`],
    settle_done: ['count==1'],
    'http_req_duration{scenario:submit}': ['p(95)<1000'],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

function call(addr, method, body) {
  return http.post(`http://${addr}/slotbroker.v1.QueueService/${method}`, JSON.stringify(body), {
    headers: { 'Content-Type': 'application/json' },
    timeout: '10s',
    tags: { method },
  });
}

export function submit() {
  const i = exec.scenario.iterationInTest;
  // Deterministic skew: iteration i goes to the first fylr when floor((i+1)·SKEW) steps up.
  const first = FYLRS.length === 1 || Math.floor((i + 1) * SKEW) > Math.floor(i * SKEW);
  const res = call(first ? FYLRS[0] : FYLRS[1 + (i % (FYLRS.length - 1))], 'Submit', {
    calls: [{ service: 'sleep', args: [JOB_S] }],
    idempotencyKey: `${RUN}-${i}`,
  });
  const ok = res.status === 200 && res.json('created') === true;
  submitOk.add(ok);
  if (ok) submitted.add(1);
  else console.error(`submit ${i}: ${res.status} ${res.body}`);
}

function stats() {
  return FYLRS.map((addr) => {
    const res = call(addr, 'Stats', {});
    if (res.status !== 200) throw new Error(`Stats on ${addr}: ${res.status} ${res.body}`);
    return res.json();
  });
}

export function settle() {
  const deadline = Date.now() + DRAIN_TIMEOUT_S * 1000;
  let all;
  let done = 0;
  let stable = 0;
  for (;;) {
    all = stats();
    const now = all.reduce((n, s) => n + Number(s.succeededTotal || 0) + Number(s.failedTotal || 0), 0);
    const held = all.reduce((n, s) => n + Number(s.execHeld || 0), 0);
    stable = now === done && held === 0 ? stable + 1 : 0;
    done = now;
    if ((done >= EXPECTED && stable >= 3) || Date.now() > deadline) break;
    sleep(0.5);
  }
  const claims = all.map((s) => Number(s.claimedTotal || 0));
  const mean = claims.reduce((a, b) => a + b, 0) / claims.length;
  const worst = mean > 0 ? Math.max(...claims.map((c) => Math.abs(c - mean) / mean)) : 1;
  finished.add(done);
  failed.add(all.reduce((n, s) => n + Number(s.failedTotal || 0), 0));
  deviation.add(worst);
  minClaims.add(Math.min(...claims));
  maxClaims.add(Math.max(...claims));
  settled.add(1);
  console.log(
    `claims per fylr: ${all.map((s) => `${s.fylrId}=${s.claimedTotal}`).join(' ')}; mean ${mean.toFixed(1)}, ` +
      `max deviation ${(worst * 100).toFixed(1)} %; finished ${done}/${EXPECTED}`,
  );
}
