// fairness-keys: several real fylr processes share one Postgres and two execservers (the
// runner starts them). Every item runs `sleep JOB_S`; SLOTS slots in all, so the slots are
// the bottleneck and the queue holds a backlog the whole run.
//
// setup()  submits two backlogs, interleaved one for one: NOISY items of key `noisy`
//          (weight 1) and HEAVY items of key `heavy` (weight HEAVY_WEIGHT). Each lasts
//          well past the run with keys on.
// quiet-N  QUIET scenarios of one VU, one tenant each (key `quiet-N`, weight 1), each
//          submitting one item, waiting for it to finish and submitting the next. The
//          submit → job start latency is read from the item's History (SUBMITTED → first
//          CALL_STARTED: the server's own times, so polling adds nothing to it) into
//          `quiet_start_ms`, tagged with the tenant. An item not finished within QUIET_TIMEOUT_S counts in
//          `quiet_timeouts` and adds the timeout as its latency (a lower bound).
// window   from WARMUP_S to WARMUP_S + WINDOW_S counts the items of each backlog claimed
//          in the window and compares `heavy`'s share of the two with its weight's:
//          HEAVY_WEIGHT / (HEAVY_WEIGHT + 1). Within a key items are claimed oldest first,
//          so "claimed so far" is the index of the first still queued item of the key's
//          backlog: a binary search with Get (≈ 11 calls per backlog). Every item runs
//          for JOB_S, so the share of claimed items is the share of slot time (within the
//          few items the fylrs hold ahead of their slots).
//
// KEYS=off (SLOTBROKER_LOAD_BREAK=nokeys) submits every item without a key or weight:
// today's FIFO within a priority. The quiet items then wait behind the whole backlog and
// the backlogs share the slots one for one; both thresholds must fail.
//
// The latency bound. Every other key with items waiting gets at most one turn before a
// quiet item's: W = HEAVY_WEIGHT + 1 + (QUIET − 1) items. At claim time that is at most W
// claims. Once claimed, its want waits on its connection for at most W wants of the other
// keys there, and each of that connection's grants waits for one of each of the other
// FYLRS − 1 connections (round-robin): at most W · FYLRS grants. Claims and grants both
// follow freed slots, SLOTS per JOB_S, and the first slot may be busy for a whole JOB_S:
//   worst case = JOB_S · (1 + W · (1 + FYLRS) / SLOTS)        (ci: 0.5 · (1 + 7·4/8) = 2.25 s)
// The threshold is twice that (4.5 s in ci): on a shared 2-core machine the slots free
// later than JOB_S says (process start, k6 and Postgres on the same cores) and the fylrs
// wake late. With FIFO a quiet item waits for the backlog ahead of it, (NOISY + HEAVY) ·
// JOB_S / SLOTS ≈ 87 s in ci, and runs into QUIET_TIMEOUT_S instead.
import { sleep } from 'k6';
import exec from 'k6/execution';
import http from 'k6/http';
import { Counter, Gauge, Trend } from 'k6/metrics';
import { envInt, envString } from './lib/broker.js';

const FYLRS = envString('FYLR_ADDRS').split(',');
const SLOTS = envInt('SLOTS', 8);
const JOB_S = Number(__ENV.JOB_S || '0.5');
const NOISY = envInt('NOISY', 800);
const HEAVY = envInt('HEAVY', 600);
const HEAVY_WEIGHT = envInt('HEAVY_WEIGHT', 3);
const QUIET = envInt('QUIET', 4);
const QUIET_TIMEOUT_S = envInt('QUIET_TIMEOUT_S', 15);
const DURATION_S = envInt('DURATION_S', 30);
const WARMUP_S = envInt('WARMUP_S', 5);
const WINDOW_S = envInt('WINDOW_S', 20);
const SHARE_TOLERANCE = Number(__ENV.SHARE_TOLERANCE || '0.05');
const MIN_WINDOW_ITEMS = envInt('MIN_WINDOW_ITEMS', 100);
const KEYS = (__ENV.KEYS || 'on') === 'on';
const RUN = __ENV.RUN_ID || 'run';

const OTHER_WEIGHT = HEAVY_WEIGHT + 1 + QUIET - 1;
const BOUND_MS = Math.ceil(2 * 1000 * JOB_S * (1 + (OTHER_WEIGHT * (1 + FYLRS.length)) / SLOTS));
const EXPECTED_SHARE = HEAVY_WEIGHT / (HEAVY_WEIGHT + 1);
const FINAL = ['ITEM_STATE_SUCCEEDED', 'ITEM_STATE_FAILED', 'ITEM_STATE_CANCELLED'];

const quietStart = new Trend('quiet_start_ms');
const quietItems = new Counter('quiet_items');
const quietTimeouts = new Counter('quiet_timeouts');
const quietFailed = new Counter('quiet_failed');
const bound = new Gauge('quiet_start_bound_ms');
const share = new Gauge('weighted_share');
const shareError = new Gauge('weighted_share_error');
const windowItems = new Gauge('window_items');
const submitErrors = new Counter('submit_errors');

// One scenario per quiet tenant: its env names the tenant, its tag marks its metrics.
const quietScenarios = {};
const perTenant = {};
for (let n = 1; n <= QUIET; n++) {
  const tenant = `quiet-${n}`;
  quietScenarios[tenant] = {
    executor: 'constant-vus',
    vus: 1,
    duration: `${DURATION_S}s`,
    gracefulStop: `${QUIET_TIMEOUT_S + 5}s`,
    exec: 'quiet',
    env: { TENANT: tenant },
    tags: { tenant },
  };
  perTenant[`quiet_start_ms{tenant:quiet-${n}}`] = [`p(99)<${BOUND_MS}`];
  perTenant[`quiet_items{tenant:quiet-${n}}`] = ['count>=5'];
}

export const options = {
  setupTimeout: '180s',
  scenarios: {
    ...quietScenarios,
    window: { executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration: `${DURATION_S + 30}s`, exec: 'window' },
  },
  thresholds: {
    quiet_start_ms: [`p(99)<${BOUND_MS}`],
    ...perTenant,
    quiet_timeouts: ['count==0'],
    quiet_failed: ['count==0'],
    weighted_share_error: [`value<=${SHARE_TOLERANCE}`],
    window_items: [`value>=${MIN_WINDOW_ITEMS}`],
    submit_errors: ['count==0'],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'p(99)', 'max', 'count'],
};

function post(addr, method, body) {
  return {
    method: 'POST',
    url: `http://${addr}/slotbroker.v1.QueueService/${method}`,
    body: JSON.stringify(body),
    params: { headers: { 'Content-Type': 'application/json' }, timeout: '10s', tags: { method } },
  };
}

// Status 0 is a transport error (e.g. a keep-alive connection the fylr closed just as k6
// reused it): tried once more. Every call here may be repeated — Get and History read, and
// a Submit carries its idempotency key.
function request(addr, method, body) {
  const r = post(addr, method, body);
  const res = http.post(r.url, r.body, r.params);
  if (res.status !== 0) return res;
  console.warn(`${method} on ${addr}: ${res.error} (${res.error_code}); once more`);
  return http.post(r.url, r.body, r.params);
}

function call(addr, method, body) {
  const res = request(addr, method, body);
  if (res.status !== 200) throw new Error(`${method} on ${addr}: ${res.status} ${res.error || res.body}`);
  return res.json();
}

function submitBody(key, weight, tag) {
  const body = { calls: [{ service: 'sleep', args: [String(JOB_S)] }], idempotencyKey: `${RUN}-${tag}` };
  if (KEYS) {
    body.fairnessKey = key;
    if (weight !== 1) body.fairnessWeight = weight;
  }
  return body;
}

export function setup() {
  const t0 = Date.now();
  // Interleaved one for one, so that FIFO would give each backlog half of the slots.
  const order = [];
  for (let i = 0; i < Math.max(NOISY, HEAVY); i++) {
    if (i < NOISY) order.push(['noisy', 1, i]);
    if (i < HEAVY) order.push(['heavy', HEAVY_WEIGHT, i]);
  }
  const ids = { noisy: [], heavy: [] };
  for (let at = 0; at < order.length; at += 20) {
    const chunk = order.slice(at, at + 20);
    const calls = chunk.map(([key, weight, i], j) => [FYLRS[(at + j) % FYLRS.length], 'Submit', submitBody(key, weight, `${key}-${i}`)]);
    http.batch(calls.map((c) => post(...c))).forEach((first, j) => {
      const res = first.status === 0 ? request(...calls[j]) : first;
      if (res.status !== 200) throw new Error(`backlog Submit: ${res.status} ${res.error || res.body}`);
      ids[chunk[j][0]].push(res.json('item.id'));
    });
  }
  bound.add(BOUND_MS);
  console.log(`backlogs submitted: ${NOISY} noisy, ${HEAVY} heavy (weight ${HEAVY_WEIGHT}), keys ${KEYS ? 'on' : 'off'}, in ${((Date.now() - t0) / 1000).toFixed(1)} s; quiet start bound ${BOUND_MS} ms`);
  return ids;
}

export function quiet() {
  const tenant = __ENV.TENANT;
  const n = exec.vu.iterationInScenario;
  const addr = FYLRS[(Number(tenant.slice('quiet-'.length)) + n) % FYLRS.length];
  const res = request(addr, 'Submit', submitBody(tenant, 1, `${tenant}-${n}`));
  if (res.status !== 200) {
    submitErrors.add(1);
    console.error(`${tenant} Submit: ${res.status} ${res.error || res.body}`);
    sleep(1);
    return;
  }
  const id = res.json('item.id');
  const deadline = Date.now() + QUIET_TIMEOUT_S * 1000;
  let state = res.json('item.state');
  while (!FINAL.includes(state) && Date.now() < deadline) {
    sleep(0.1);
    state = call(addr, 'Get', { id }).item.state;
  }
  if (!FINAL.includes(state)) {
    quietTimeouts.add(1);
    quietStart.add(QUIET_TIMEOUT_S * 1000);
    return;
  }
  if (state !== 'ITEM_STATE_SUCCEEDED') quietFailed.add(1);
  const events = call(addr, 'History', { id }).events || [];
  const submitted = events.find((e) => e.kind === 'ITEM_EVENT_KIND_SUBMITTED');
  const started = events.find((e) => e.kind === 'ITEM_EVENT_KIND_CALL_STARTED');
  if (!submitted || !started) {
    quietFailed.add(1);
    console.error(`${tenant} ${id}: no SUBMITTED or CALL_STARTED in its History: ${JSON.stringify(events)}`);
    return;
  }
  quietStart.add(Date.parse(started.at) - Date.parse(submitted.at));
  quietItems.add(1);
}

// How many of `ids` (one key's backlog, oldest first) are no longer queued.
function claimedSoFar(ids) {
  let lo = 0;
  let hi = ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (call(FYLRS[0], 'Get', { id: ids[mid] }).item.state === 'ITEM_STATE_QUEUED') hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

export function window(ids) {
  const t0 = Date.now();
  sleep(WARMUP_S);
  const before = { noisy: claimedSoFar(ids.noisy), heavy: claimedSoFar(ids.heavy) };
  sleep(Math.max(0, WARMUP_S + WINDOW_S - (Date.now() - t0) / 1000));
  const after = { noisy: claimedSoFar(ids.noisy), heavy: claimedSoFar(ids.heavy) };
  const heavy = after.heavy - before.heavy;
  const noisy = after.noisy - before.noisy;
  // A backlog that ran dry in the window no longer competes: the share means nothing then.
  const dry = after.noisy >= NOISY || after.heavy >= HEAVY;
  const observed = heavy + noisy > 0 ? heavy / (heavy + noisy) : 0;
  share.add(observed);
  shareError.add(dry ? 1 : Math.abs(observed - EXPECTED_SHARE));
  windowItems.add(heavy + noisy);
  console.log(
    `window ${WARMUP_S}–${WARMUP_S + WINDOW_S} s: heavy ${heavy} claimed (${before.heavy} → ${after.heavy} of ${HEAVY}), ` +
      `noisy ${noisy} (${before.noisy} → ${after.noisy} of ${NOISY}); heavy share ${observed.toFixed(3)}, ` +
      `expected ${EXPECTED_SHARE.toFixed(3)}${dry ? '; a backlog ran dry' : ''}`,
  );
}
